"""The base commit's tree: a temporary ``git worktree`` of it, and which of the project's
packages are taken from it (see :mod:`perf.gate.against`, steps 1 and 2)."""

from __future__ import annotations

import contextlib
import importlib.machinery
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Never mapped to the base tree: the measuring instrument stays the current one.
INSTRUMENT = frozenset({"perf"})
#: Parts of the instrument's package that are code under test, not instrument: in perf's own
#: repository its reference workloads are taken from the base tree like any project package.
UNDER_TEST = frozenset({"perf.workloads"})


class Refused(Exception):
    """The base commit's code cannot be measured here; the message says why and what to do."""


# -- git ----------------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``git -C repo ARGS``; raises :class:`GitMissing` when no ``git`` is on ``PATH``."""
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        raise GitMissing(GIT_MISSING) from None


class GitMissing(Refused):
    """No ``git`` executable on ``PATH``."""


GIT_MISSING = "git is not installed or not on PATH (perf runs `git` to check out the base commit)"


def git_available() -> bool:
    return shutil.which("git") is not None


def repo_root(start: str | Path) -> Path | None:
    """The top of the git working tree containing ``start`` (None: not in one).

    Raises :class:`GitMissing` when there is no git to ask."""
    if not git_available():
        raise GitMissing(GIT_MISSING)
    try:
        p = _git(Path(start), "rev-parse", "--show-toplevel")
    except GitMissing:
        raise
    except OSError:
        return None
    return Path(p.stdout.strip()).resolve() if p.returncode == 0 and p.stdout.strip() else None


def resolve_commit(repo: Path, ref: str) -> str | None:
    """The full hash of ``ref`` if it names a commit present in ``repo`` (None otherwise).

    Any revision git accepts, ``:/message`` searches included (``REF^{commit}`` would be read
    as part of such a search, so the object is resolved first and peeled to a commit after).
    """
    if not ref or ref.startswith("-") or "\0" in ref:
        return None
    p = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", ref)
    sha = p.stdout.strip()
    if p.returncode != 0 or not sha:
        return None
    p = _git(repo, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}")
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None


_HEX = re.compile(r"^[0-9a-fA-F]{4,64}$")
#: A full commit hash (SHA-1 or SHA-256), as a stored run records it.
HEX_COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
_SUFFIX = re.compile(r"(?:[~^][0-9]*)+$")


#: Revision names a shell takes literally: shlex's safe characters plus ``~`` / ``^`` (not at
#: the start: ``~user`` expands) and the braces of ``@{upstream}``.
_SHELL_SAFE = re.compile(r"^[\w@%+=:,./-][\w@%+=:,./~^{}-]*$", re.ASCII)


def show_ref(ref: str) -> str:
    """``ref`` as an error message may echo it: as written when a shell takes it literally
    (``HEAD~1``, ``origin/main``), else shell-quoted when printable (paste-safe), else as a
    Python literal (no raw control bytes reach the terminal)."""
    brace_expansion = "{" in ref and ("," in ref or ".." in ref)
    if _SHELL_SAFE.match(ref) and not brace_expansion:
        return ref
    return shlex.quote(ref) if ref.isprintable() else repr(ref)


def missing_commit_problem(repo: Path, ref: str) -> str:
    """Why ``ref`` names no commit here, and what to do: "fetch it" only for a name that
    could be a commit elsewhere (a hash, or a valid ref name with ``~N`` / ``^N``)."""
    shown = show_ref(ref)
    if not ref.strip():
        return "the value is empty (an unset CI variable?); name a commit, e.g. origin/main"
    if ref.startswith("-"):
        return f"{shown} looks like an option, not a commit"
    p = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", ref)
    if p.returncode == 0 and p.stdout.strip():
        kind = _git(repo, "cat-file", "-t", p.stdout.strip()).stdout.strip() or "object"
        return f"{shown} names a {kind}, not a commit"
    base = _SUFFIX.sub("", ref)
    could_be = bool(_HEX.match(base)) or (
        bool(base) and _git(repo, "check-ref-format", "--allow-onelevel", base).returncode == 0
    )
    if not could_be:
        return f"{shown} is not a valid git revision name"
    return (
        f"no such commit in {repo}. In CI, fetch it first (actions/checkout with "
        f"fetch-depth: 0, or `git fetch origin {shlex.quote(base)}`)."
    )


#: Temporary folders of base worktrees start with this; the folder holds ``tree/`` (the
#: worktree) and :data:`OWNER_FILE` (the pid of the process that made it).
TREE_PREFIX = "perf-base-"
OWNER_FILE = "owner.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_worktrees(repo: Path) -> list[str]:
    """Remove the base worktrees (and their temporary folders) that a killed perf run left
    registered in ``repo``: those whose owner process is gone. Returns one line per tree."""
    p = _git(repo, "worktree", "list", "--porcelain")
    removed = []
    for line in p.stdout.splitlines() if p.returncode == 0 else []:
        if not line.startswith("worktree "):
            continue
        path = Path(line[len("worktree ") :])
        tmp = path.parent
        if path.name != "tree" or not tmp.name.startswith(TREE_PREFIX):
            continue
        try:
            pid = int((tmp / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            pid = None
        if pid is not None and _alive(pid):  # a live run (this one too) keeps its tree
            continue
        for sub in _submodule_trees(path):
            _git(sub[0], "worktree", "remove", "--force", str(sub[1]))
        _git(repo, "worktree", "remove", "--force", str(path))
        shutil.rmtree(tmp, ignore_errors=True)
        who = f"pid {pid}" if pid is not None else "an unknown process"
        removed.append(f"removed the base worktree {path} left by a killed run ({who})")
    _git(repo, "worktree", "prune")
    return removed


@contextlib.contextmanager
def worktree(repo: Path, commit: str) -> Iterator[Path]:
    """A detached, temporary ``git worktree`` of ``commit``, its submodules checked out at the
    commits ``commit`` records (:func:`checkout_submodules`); removed (and pruned) afterwards,
    also on KeyboardInterrupt. A run killed outright leaves it for the next run's
    :func:`remove_stale_worktrees`."""
    tmp = Path(tempfile.mkdtemp(prefix=TREE_PREFIX))
    (tmp / OWNER_FILE).write_text(f"{os.getpid()}\n")
    path = tmp / "tree"
    p = _git(repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
    if p.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise Refused(f"git worktree add of {commit[:12]} failed: {p.stderr.strip()}")
    try:
        checkout_submodules(repo, path, commit)
        yield path
    finally:
        for sub_repo, sub_tree in _submodule_trees(path):
            _git(sub_repo, "worktree", "remove", "--force", str(sub_tree))
            _git(sub_repo, "worktree", "prune")
        _git(repo, "worktree", "remove", "--force", str(path))
        _git(repo, "worktree", "prune")
        shutil.rmtree(tmp, ignore_errors=True)


# -- submodules ---------------------------------------------------------------------------------


def submodules(repo: Path, commit: str = "HEAD") -> dict[str, str]:
    """Submodule path (relative, POSIX) -> the commit ``commit`` records for it."""
    p = _git(repo, "ls-tree", "-r", "-z", "--full-tree", commit)
    out = {}
    for entry in p.stdout.split("\0") if p.returncode == 0 else []:
        meta, _, path = entry.partition("\t")
        parts = meta.split()
        if len(parts) == 3 and parts[0] == "160000" and parts[1] == "commit":
            out[path] = parts[2]
    return out


def _submodule_trees(tree: Path) -> list[tuple[Path, Path]]:
    """(the submodule's repository in the head tree, its worktree inside ``tree``) for each
    submodule :func:`checkout_submodules` checked out."""
    marker = tree.parent / "submodules.json"
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return []
    return [(Path(a), Path(b)) for a, b in data]


def checkout_submodules(repo: Path, tree: Path, commit: str) -> None:
    """Check out, inside the base ``tree``, every submodule at the commit ``commit`` records
    for it, from the submodule's local clone in ``repo`` (never from the network). A
    submodule whose recorded commit is not in that clone is refused, naming it: its packages
    would otherwise be the head's code on both sides, a silent false pass."""
    done: list[tuple[str, str]] = []
    marker = tree.parent / "submodules.json"
    try:
        for rel, sha in sorted(submodules(repo, commit).items()):
            here = repo / rel
            if not (here / ".git").exists():
                continue  # not checked out here: nothing the tests import comes from it
            have = _git(here, "cat-file", "-e", f"{sha}^{{commit}}")
            if have.returncode != 0:
                raise Refused(
                    f"submodule {rel!r}: the base commit records its commit {sha[:12]}, which "
                    f"is not in its local clone {here} (fetch it there: "
                    f"git -C {shlex.quote(str(here))} fetch origin {sha})"
                )
            dest = tree / rel
            with contextlib.suppress(OSError):
                dest.rmdir()  # git leaves an empty folder for an uninitialised submodule
            p = _git(here, "worktree", "add", "--detach", "--quiet", str(dest), sha)
            if p.returncode != 0:
                raise Refused(f"submodule {rel!r}: git worktree add failed: {p.stderr.strip()}")
            done.append((str(here), str(dest)))
    finally:
        marker.write_text(json.dumps(done))


# -- what to map --------------------------------------------------------------------------------


def _within(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def tracked_files(repo: Path) -> set[str]:
    """Paths (relative, POSIX) of the files git tracks in ``repo`` and in its checked-out
    submodules (a project package may live in one)."""
    p = _git(repo, "ls-files", "-z")
    files = set(p.stdout.split("\0")) - {""} if p.returncode == 0 else set()
    for rel in submodules(repo):
        if (repo / rel / ".git").exists():
            files |= {f"{rel}/{f}" for f in tracked_files(repo / rel)}
    return files


def project_roots(
    modules: Mapping[str, Any],
    repo: Path,
    test_files: Iterable[str | Path],
    tracked: set[str] | None = None,
) -> dict[str, Path]:
    """Top-level name -> the directory (relative to ``repo``) it is imported from, for every
    imported top-level module or package whose file git tracks in the repository (so not a
    virtual environment, build folder or generated file that happens to lie inside it).

    Left out: the test files and conftests themselves and any package holding them (they run
    from the current tree), and perf (:data:`INSTRUMENT`) except :data:`UNDER_TEST`.
    """
    repo = repo.resolve()
    tests = [Path(t).resolve() for t in test_files]
    if tracked is None:
        tracked = tracked_files(repo)
    out: dict[str, Path] = {}
    for name, mod in list(modules.items()):
        if name not in UNDER_TEST and ("." in name or name in INSTRUMENT or name == "__main__"):
            continue
        file = getattr(mod, "__file__", None)
        if not file:
            continue
        f = Path(file).resolve()
        if not _within(f, repo) or f.name == "conftest.py" or f.name.startswith("test_"):
            continue
        if f.relative_to(repo).as_posix() not in tracked:
            continue
        is_pkg = hasattr(mod, "__path__")
        top = f.parent if is_pkg else f  # the package directory, or the module file
        if any(_within(t, top) if is_pkg else t == f for t in tests):
            continue
        out[name] = top.parent.relative_to(repo)
    return out


@dataclass(frozen=True)
class ImportMap:
    """Module name (top-level, or a :data:`UNDER_TEST` subpackage) -> absolute directory in
    the base tree that holds it."""

    roots: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dict(sorted(self.roots.items())))

    @classmethod
    def from_json(cls, text: str) -> ImportMap:
        data = json.loads(text)
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise ValueError("an import map is a JSON object of name -> directory")
        return cls(data)


def _extension_files(top: Path) -> list[Path]:
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    if top.is_file():
        return []
    return sorted(p for p in top.rglob("*") if p.name.endswith(suffixes))


def map_to_base(project: Mapping[str, Path], repo: Path, base: Path) -> ImportMap:
    """Where each project package lives in the base tree; :class:`Refused` when one cannot be
    taken from there as it is (compiled extensions, or missing at that commit)."""
    roots: dict[str, str] = {}
    for name, rel in sorted(project.items()):
        here = repo / rel
        tail = name.rpartition(".")[2]
        top = here / tail if (here / tail).is_dir() else here / f"{tail}.py"
        ext = _extension_files(top)
        if ext:
            raise Refused(
                f"package {name!r} has compiled extension modules "
                f"({ext[0].relative_to(repo)}{' ...' if len(ext) > 1 else ''}): the base "
                "commit would need a build, which perf does not do; only pure-Python "
                "project code can be measured against another commit"
            )
        there = base / rel
        if not ((there / tail).is_dir() or (there / f"{tail}.py").is_file()):
            raise Refused(
                f"package {name!r} (imported from {rel.as_posix() or '.'}/ in this tree) does "
                "not exist at the same place in the base commit"
            )
        roots[name] = str(there)
    return ImportMap(roots)
