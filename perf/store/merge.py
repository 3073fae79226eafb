"""Shards of one run made one: the stored runs of N shards of a suite (a CI matrix, a GPU
pool, ``pytest-split``) become one run that gates, and is stored, like an unsharded one.

Why refuse rather than guess: a test in two shards (which value is the baseline?), shards of
different commits (the merged run would describe no commit) and shards whose timings are not
comparable (:data:`perf.core.devices.TIMING_KEYS`, the rule the gate applies to two runs) would
each give a baseline that silently gates against something else. A shard that failed, or that
never arrived (``expected``), leaves the merged run ``partial``: it never becomes the default
baseline, exactly like a partial unsharded run.

Works at the file boundary: runs in, one :class:`~perf.store.runs.Run` out, validated by
:func:`perf.store.schema.parse` like every stored run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perf.store.runs import Run, default_tag, load
from perf.store.schema import FORMAT, SCHEMA_VERSION, BaselineError, parse, read_bounded


class MergeError(ValueError):
    """The shards cannot be one run; the message names the shards and what differs."""


def is_shard_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder of stored runs (shards), not a folder of tests.

    A folder with ``.json`` files below it and no ``.py`` file: ``pytest --benchmark-compare
    tests/`` must keep being told that the option swallowed a test path.
    """
    p = Path(path)
    if not p.is_dir():
        return False
    has_json = False
    for f in p.rglob("*"):
        if f.suffix == ".py":
            return False
        has_json = has_json or (f.suffix == ".json" and f.is_file())
    return has_json


def shard_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The perf run files below ``folder`` (CI artifacts: any depth), sorted by path.

    pytest-benchmark's own files (a whole ``.benchmarks`` folder uploaded as an artifact) are
    skipped; any other JSON is refused by name, since a shard that cannot be read must not
    silently drop out of the merged run.
    """
    root = Path(folder)
    out = []
    for f in sorted(root.rglob("*.json")):
        if not f.is_file():
            continue
        try:
            data = json.loads(read_bounded(f))
        except (ValueError, UnicodeDecodeError):
            data = None  # parse() below names the problem
        if (
            isinstance(data, dict)
            and data.get("format") != FORMAT
            and "benchmarks" in data
            and "machine_info" in data
        ):
            continue  # pytest-benchmark's own run file
        out.append(f)
    if not out:
        raise MergeError(f"{root}: no perf run files (*.json) below this folder")
    return out


def load_shards(paths: Sequence[str | os.PathLike[str]]) -> list[Run]:
    """Load run files and folders of run files (each folder: :func:`shard_files`)."""
    files: list[Path] = []
    for p in paths:
        files += shard_files(p) if Path(p).is_dir() else [Path(p)]
    seen: set[Path] = set()
    for f in files:
        if f.resolve() in seen:
            raise MergeError(f"{f} is given twice (as a file and inside a folder, or twice)")
        seen.add(f.resolve())
    return [load(f) for f in files]


def merge_runs(runs: Sequence[Run], *, name: str | None = None, expected: int | None = None) -> Run:
    """One run from the shards ``runs`` of one commit; raises :class:`MergeError`.

    ``expected``: how many shards the suite was split into; fewer leaves the result partial.
    The merged run's reference samples and CPU share are the shards' pooled (CPU share: the
    busiest shard's, so a busy runner is never averaged away); its date is the latest shard's,
    so history orders it where its last shard finished.
    """
    from perf.core.devices import TIMING_KEYS, fingerprint_diff  # not on plugin load

    if not runs:
        raise MergeError("nothing to merge: give at least one stored run")
    if expected is not None and expected < len(runs):
        raise MergeError(f"{len(runs)} shards given, more than the {expected} expected")
    first = runs[0]
    _same(runs, "commit", lambda r: r.commit.get("id"), "runs of different commits")
    _same(runs, "machine", lambda r: r.machine, "runs of different machine folders")
    for r in runs[1:]:
        diff = fingerprint_diff(first.fingerprint, r.fingerprint, TIMING_KEYS)
        if diff:
            fields = "; ".join(f"{k}: {a!r} vs {b!r}" for k, (a, b) in diff.items())
            raise MergeError(
                f"incompatible machine fingerprints: {_name(first)} and {_name(r)} differ in "
                f"{fields}; their timings are not comparable, so they are not one run "
                "(merge the shards of each machine kind separately)"
            )
    tests: dict[str, dict[str, Any]] = {}
    owner: dict[str, Run] = {}
    for r in runs:
        for nodeid, entry in r.tests.items():
            if nodeid in tests:
                raise MergeError(
                    f"test {nodeid!r} is in two shards: {_name(owner[nodeid])} and {_name(r)}; "
                    "shards must split the suite (check the -k / --group selection)"
                )
            tests[nodeid] = entry
            owner[nodeid] = r
    partial = [f"shard {_name(r)}: {r.partial}" for r in runs if r.partial]
    if expected is not None and len(runs) < expected:
        partial.append(f"{expected - len(runs)} of {expected} shards missing")
    threads = {r.reference_threads for r in runs}
    pooled_ref: dict[str, list[float]] = {}
    if len(threads) == 1:  # references of different thread counts are never pooled
        for r in runs:
            for k, v in r.reference.items():
                pooled_ref.setdefault(k, []).extend(v)
    cpus = [r.cpu for r in runs]
    cpu = None
    if all(c is not None for c in cpus):
        cpu = max((c for c in cpus if c is not None), key=lambda c: c.get("others_fraction", 0))
    envs = [json.dumps(r.environment, sort_keys=True) for r in runs]
    merged = Run(
        path=None,
        number=None,
        name=name or default_tag(first.commit),
        machine=first.machine,
        date=max(r.date for r in runs),
        commit={**first.commit, "dirty": any(bool(r.commit.get("dirty")) for r in runs)}
        if first.commit.get("id")
        else dict(first.commit),
        fingerprint=dict(first.fingerprint),
        tests=dict(sorted(tests.items())),
        reference=pooled_ref,
        workers=max(r.workers for r in runs),
        cpu=cpu,
        partial="; ".join(partial) or None,
        reference_threads=threads.pop() if len(threads) == 1 and pooled_ref else None,
        environment=first.environment if len(set(envs)) == 1 else None,
        schema_version=SCHEMA_VERSION,
    )
    parse(json.dumps(merged.to_json(), allow_nan=False), "<merged run>")
    return merged


def load_merged(path: str | os.PathLike[str]) -> Run:
    """A run file, or a folder of shard runs merged into one (``--benchmark-compare=DIR``)."""
    p = Path(path)
    if not p.is_dir():
        return load(p)
    try:
        merged = merge_runs(load_shards([p]), name=p.name or "shards")
    except MergeError as e:
        raise BaselineError(p, f"cannot merge its shards: {e}") from None
    return dataclasses.replace(merged, path=p.absolute())


def write(run: Run, out: str | os.PathLike[str]) -> Path:
    """Write ``run`` to ``out``, atomically and never over an existing file (a stored run is
    written once): a temp file in the same folder, hard-linked to its name."""
    p = Path(out)
    if p.exists():
        raise MergeError(f"{p} exists; a stored run is never overwritten (choose another -o)")
    p.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(run.to_json(), indent=1, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(payload)
        try:
            os.link(tmp, p)  # refuses to replace a file written meanwhile
        except FileExistsError:
            raise MergeError(f"{p} exists; a stored run is never overwritten") from None
        except OSError:
            os.replace(tmp, p)  # filesystems without hard links
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return p


def _name(run: Run) -> str:
    return str(run.path) if run.path is not None else run.name


def _same(runs: Sequence[Run], what: str, key: Any, problem: str) -> None:
    values: dict[Any, list[str]] = {}
    for r in runs:
        values.setdefault(key(r), []).append(_name(r))
    if len(values) > 1:
        listed = "; ".join(f"{v!r}: {', '.join(names)}" for v, names in values.items())
        raise MergeError(f"{problem} ({what} {listed}); only shards of one run merge")
