"""The base commit's tree: a temporary ``git worktree`` of it, and which of the project's
packages are taken from it (see :mod:`perf.gate.against`, steps 1 and 2)."""

from __future__ import annotations

import contextlib
import importlib.machinery
import json
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
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
    )


def repo_root(start: str | Path) -> Path | None:
    """The top of the git working tree containing ``start`` (None: not in one, or no git)."""
    try:
        p = _git(Path(start), "rev-parse", "--show-toplevel")
    except OSError:
        return None
    return Path(p.stdout.strip()).resolve() if p.returncode == 0 and p.stdout.strip() else None


def resolve_commit(repo: Path, ref: str) -> str | None:
    """The full hash of ``ref`` if it names a commit present in ``repo`` (None otherwise)."""
    if not ref or ref.startswith("-"):
        return None
    p = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None


@contextlib.contextmanager
def worktree(repo: Path, commit: str) -> Iterator[Path]:
    """A detached, temporary ``git worktree`` of ``commit``; removed (and pruned) afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="perf-base-"))
    path = tmp / "tree"
    p = _git(repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
    if p.returncode != 0:
        tmp.rmdir()
        raise Refused(f"git worktree add of {commit[:12]} failed: {p.stderr.strip()}")
    try:
        yield path
    finally:
        _git(repo, "worktree", "remove", "--force", str(path))
        _git(repo, "worktree", "prune")
        with contextlib.suppress(OSError):
            tmp.rmdir()


# -- what to map --------------------------------------------------------------------------------


def _within(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def tracked_files(repo: Path) -> set[str]:
    """Paths (relative, POSIX) of the files git tracks in ``repo``."""
    p = _git(repo, "ls-files", "-z")
    return set(p.stdout.split("\0")) - {""} if p.returncode == 0 else set()


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
