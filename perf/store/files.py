"""The store on disk: one folder per machine, numbered run files, append-only atomic
writes under a file lock (see :mod:`perf.store` for the rules)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from perf.store.merge import is_shard_dir
from perf.store.runs import (
    BaselineNotFound,
    NotARun,
    Run,
    RunRef,
    load,
    name_problem,
    number_from_name,
    storage_root,
)
from perf.store.schema import BaselineError

_TMP_PREFIX, _TMP_SUFFIX = ".tmp-", ".part"


class Store:
    """The ``perf/`` folder of a pytest-benchmark storage; one sub-folder per machine."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @classmethod
    def from_storage(cls, storage: str | None = None) -> Store:
        return cls(storage_root(storage))

    def machines(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def runs(self, machine: str | None = None) -> list[RunRef]:
        """Stored runs, oldest first (by number), of one machine or of all machines."""
        names = [machine] if machine is not None else self.machines()
        out: list[RunRef] = []
        for mname in names:
            folder = self.root / mname
            if not folder.is_dir():
                continue
            for p in folder.iterdir():
                parsed = number_from_name(p)
                if parsed is not None and p.is_file():
                    out.append(RunRef(p, parsed[0], parsed[1], mname))
        out.sort(key=lambda r: (r.machine, r.number))
        return out

    def save(self, run: Run) -> Path:
        """Append ``run`` as ``<machine>/<NNNN>_<name>.json``; returns the new file's path.

        Never overwrites: the number is chosen under a lock and the final name is created with
        a hard link, which fails rather than replace an existing file.
        """
        from filelock import FileLock

        problem = name_problem(run.name)
        if problem:
            raise ValueError(problem)
        folder = self.root / run.machine
        folder.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(run.to_json(), indent=1, sort_keys=False, allow_nan=False)
        payload += "\n"
        with FileLock(str(folder / ".perf-store.lock"), timeout=120):
            existing = [r.number for r in self.runs(run.machine)]
            number = max(existing, default=0) + 1
            while True:
                final = folder / f"{number:04d}_{run.name}.json"
                if not final.exists():
                    break
                number += 1
            _remove_stale_temps(folder)
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=folder)
            try:
                os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; runs are shared data
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(payload)
                    fh.flush()
                    os.fsync(fh.fileno())
                try:
                    os.link(tmp, final)  # atomic and refuses to overwrite
                except OSError:
                    if final.exists():
                        raise
                    os.replace(tmp, final)  # filesystems without hard links
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        return final

    def latest_complete(
        self,
        machine: str,
        fingerprint: Mapping[str, Any] | None = None,
        timing_keys: Iterable[str] = (),
    ) -> RunRef:
        """The default compare target: the newest complete (not ``partial``) run of
        ``machine``, preferring one whose fingerprint matches on ``timing_keys``.

        A run stopped by ``-x`` or with failed tests never becomes the default baseline: tests
        it did not reach would otherwise be listed as "new" instead of gated. An unreadable
        newest candidate is returned so the caller reports it (it is never skipped silently).
        """
        refs = self.runs(machine)
        if not refs:
            raise BaselineNotFound(f"no stored perf run for machine {machine!r} in {self.root}")
        keys = tuple(timing_keys)
        complete: list[tuple[RunRef, Run]] = []
        for ref in reversed(refs):
            try:
                run = load(ref.path)
            except BaselineError:
                if not complete:
                    return ref
                continue
            if run.partial is None:
                complete.append((ref, run))
                if fingerprint is None or all(
                    run.fingerprint.get(k) == fingerprint.get(k) for k in keys
                ):
                    return ref
        if complete:
            return complete[0][0]
        raise BaselineNotFound(
            f"no complete stored perf run for machine {machine!r} in {self.root}: all "
            f"{len(refs)} are partial (stopped early or with failed tests); name one "
            "explicitly to compare with it (--benchmark-compare=NUM)"
        )

    def resolve(
        self,
        spec: str | bool | None,
        *,
        machine: str,
        fingerprint: Mapping[str, Any] | None = None,
        timing_keys: Iterable[str] = (),
    ) -> RunRef:
        """Pick a stored run the way ``--benchmark-compare[=NUM|ID]`` means it.

        ``True``/``None``: :meth:`latest_complete`. A folder of shard runs (no ``.py`` in it):
        that folder, read as one merged run by :func:`perf.store.merge.load_merged`.
        ``"3"``/``"0003"``: run number 3 of ``machine``. A path to a ``.json`` file: that
        file. ``"OTHER-MACHINE/3"``: run 3 of another machine. Any other text: the latest run
        of ``machine`` whose name contains it.
        Raises :class:`BaselineNotFound`, or :class:`NotARun` for a test file or folder
        (``pytest --benchmark-compare tests/``: the option took the path as its value).
        """
        if spec is None or spec is True or spec == "":
            return self.latest_complete(machine, fingerprint, timing_keys)
        text = str(spec)
        if is_shard_dir(text):  # shards of one run: read as one (perf.store.merge.load_merged)
            return RunRef(Path(text), 0, Path(text).name, machine)
        problem = test_path_problem(text, folders=False)
        if problem:
            raise NotARun(problem)
        cand = Path(text)
        if cand.suffix == ".json":
            if not cand.is_file():
                raise BaselineNotFound(f"baseline file {text} does not exist")
            parsed = number_from_name(cand)
            return RunRef(
                cand,
                parsed[0] if parsed else 0,
                parsed[1] if parsed else cand.stem,
                cand.parent.name,
            )
        mach, _, rest = text.rpartition("/")
        mach = mach or machine
        refs = self.runs(mach)
        if rest.isdigit():
            hits = [r for r in refs if r.number == int(rest)]
        else:
            hits = [r for r in refs if rest in r.name]
        if not hits:
            problem = test_path_problem(text)
            if problem:
                raise NotARun(problem)
            have = ", ".join(r.path.stem for r in refs[-5:]) or "none"
            raise BaselineNotFound(
                f"no stored perf run matches {text!r} for machine {mach!r} in {self.root} "
                f"(latest there: {have})"
            )
        return hits[-1]


def test_path_problem(spec: str, *, folders: bool = True) -> str | None:
    """Why ``spec`` (a ``--benchmark-compare`` value) is a test path, not a stored run.

    The option takes an optional value, so ``pytest --benchmark-compare tests/`` makes
    ``tests/`` the compare target and leaves pytest without a path. Test ids (``::``) and
    ``.py`` files are never runs (run names cannot hold ``:``); an existing folder counts
    when ``folders`` (the caller checks first that no run name matches it).
    """
    head = spec.split("::", 1)[0]
    cand = Path(head)
    is_test = "::" in spec or head.endswith(".py") or (folders and bool(head) and cand.is_dir())
    if not is_test:
        return None
    what = "folder" if cand.is_dir() else "file" if cand.exists() else "test id"
    return (
        f"--benchmark-compare got {spec!r}, a test {what}, as the stored run to compare with "
        f"(the option takes an optional value, so it swallowed the path). Write "
        f"--benchmark-compare=NUM (or =NAME) to pick a run, or put the path first: "
        f"pytest {spec} --benchmark-compare"
    )


def _umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux); elsewhere by
    setting and restoring it, which is not thread-safe but brief."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    current = os.umask(0o077)
    os.umask(current)
    return current


def _remove_stale_temps(folder: Path) -> None:
    """Delete temp files of killed saves. Called under the store lock: a temp file lives
    only while its writer holds that lock, so every one found now is orphaned."""
    for p in folder.glob(f"{_TMP_PREFIX}*{_TMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            p.unlink()
