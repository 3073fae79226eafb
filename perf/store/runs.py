"""A stored run in memory (:class:`Run`), where it comes from (machine, commit, tag) and
:func:`load` / :func:`make_run`, the two ways to get one."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perf.store.schema import (
    BAD_NAME_CHARS,
    DEFAULT_STORAGE,
    FORMAT,
    RUN_FILE,
    SCHEMA_VERSION,
    SUBDIR,
    parse,
    read_bounded,
)


class BaselineNotFound(LookupError):
    """No stored run matches the request (e.g. the first run on a new CI runner)."""


class NotARun(BaselineNotFound):
    """The compare target is a test file or folder, not a stored run."""


@dataclass(frozen=True)
class RunRef:
    """A stored run as seen in a folder listing (not loaded)."""

    path: Path
    number: int
    name: str
    machine: str

    @property
    def label(self) -> str:
        return f"{self.machine}/{self.path.stem}"


@dataclass(frozen=True)
class Run:
    """A loaded, validated run. ``tests``: nodeid -> {"outcome", "metrics": [metric dicts]}."""

    path: Path | None
    number: int | None
    name: str
    machine: str
    date: str
    commit: dict[str, Any]
    fingerprint: dict[str, Any]
    tests: dict[str, dict[str, Any]]
    #: Reference-workload samples (seconds per call) taken at session start and end.
    reference: dict[str, list[float]] = field(default_factory=dict)
    #: xdist worker count of the run (0: serial). Parallel runs' timings are not gated.
    workers: int = 0
    #: Other processes' share of the CPUs during the run (:class:`perf.core.contention.CpuShare`
    #: as a dict); None where unknown (not Linux, or a schema_version 1 file).
    cpu: dict[str, float] | None = None
    #: Why this run is not a full, green run (stopped early, failed tests); None: complete.
    #: The default compare target skips partial runs.
    partial: str | None = None
    #: torch intra-op threads the reference workload ran with (None: unknown, schema <= 2).
    reference_threads: int | None = None
    #: Imported distributions' versions and perf-relevant environment variables
    #: (:mod:`perf.store.environment`); None: not recorded (older perf).
    environment: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def label(self) -> str:
        if self.path is None:
            return "current run"
        return f"{self.machine}/{self.path.stem}"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "run": {
                "name": self.name,
                "machine": self.machine,
                "date": self.date,
                "commit": self.commit,
                "fingerprint": self.fingerprint,
                "workers": self.workers,
                "reference": self.reference,
                "reference_threads": self.reference_threads,
                "environment": self.environment,
                "cpu": self.cpu,
                "partial": self.partial,
            },
            "tests": self.tests,
        }


# -- environment ---------------------------------------------------------------------------


def machine_name() -> str:
    """pytest-benchmark's machine id (``Linux-CPython-3.11-64bit``), computed the same way."""
    return "{}-{}-{}-{}".format(
        platform.system(),
        platform.python_implementation(),
        ".".join(platform.python_version_tuple()[:2]),
        platform.architecture()[0],
    )


def storage_root(storage: str | None = None) -> Path:
    """Our folder inside pytest-benchmark's ``--benchmark-storage`` (``file://`` or a path).

    Elasticsearch storage is pytest-benchmark's own; our JSON then goes to ``.benchmarks``.
    """
    s = storage or DEFAULT_STORAGE
    if s.startswith("file://"):
        s = s[len("file://") :]
    elif "://" in s:
        s = DEFAULT_STORAGE
    return Path(s) / SUBDIR


def commit_info(cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``git rev-parse`` of HEAD, branch and dirtiness; ``id: None`` where there is no git."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    if sha is None:
        return {"id": None, "branch": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "id": sha,
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(status) if status is not None else None,
    }


def default_tag(commit: Mapping[str, Any] | None = None) -> str:
    """pytest-benchmark's autosave name: ``<commit>_<utc date>[_uncommited-changes]``."""
    c = dict(commit or commit_info())
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d_%H%M%S")
    parts = [str(c.get("id") or "unversioned"), stamp]
    if c.get("dirty"):
        parts.append("uncommited-changes")  # sic: pytest-benchmark's spelling
    return "_".join(parts)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def number_from_name(path: Path) -> tuple[int, str] | None:
    m = RUN_FILE.match(path.name)
    return (int(m.group(1)), m.group(2)) if m else None


def load(path: str | os.PathLike[str]) -> Run:
    """Read and validate one run file. Read-only: the file is never modified."""
    p = Path(path).absolute()  # errors name the file unambiguously in CI logs
    raw = read_bounded(p)
    data = parse(raw, p)
    run = data["run"]
    parsed = number_from_name(p)
    return Run(
        path=p,
        number=parsed[0] if parsed else None,
        name=run["name"],
        machine=run["machine"],
        date=run["date"],
        commit=run["commit"],
        fingerprint=run["fingerprint"],
        tests=data["tests"],
        reference={k: [float(x) for x in v] for k, v in run["reference"].items()},
        workers=run["workers"],
        cpu=run.get("cpu"),
        partial=run.get("partial"),
        reference_threads=run.get("reference_threads"),
        environment=run.get("environment"),
        schema_version=data["schema_version"],
    )


def make_run(
    tests: Mapping[str, Mapping[str, Any]],
    *,
    name: str | None = None,
    machine: str | None = None,
    fingerprint: Mapping[str, Any] | None = None,
    commit: Mapping[str, Any] | None = None,
    reference: Mapping[str, Iterable[float]] | None = None,
    workers: int = 0,
    cpu: Mapping[str, float] | None = None,
    partial: str | None = None,
    reference_threads: int | None = None,
    environment: Mapping[str, Any] | None = None,
) -> Run:
    """Build an in-memory (unsaved) run from collected results; validates it."""
    if fingerprint is None:
        from perf.core.devices import fingerprint as _fp  # torch import, only when needed

        fingerprint = _fp()
    c = dict(commit) if commit is not None else commit_info()
    run = Run(
        path=None,
        number=None,
        name=name or default_tag(c),
        machine=machine or machine_name(),
        date=now_iso(),
        commit=c,
        fingerprint=json.loads(json.dumps(dict(fingerprint))),
        tests={
            k: {"outcome": v["outcome"], "metrics": [dict(m) for m in v["metrics"]]}
            for k, v in tests.items()
        },
        reference={k: [float(x) for x in v] for k, v in (reference or {}).items()},
        workers=int(workers),
        cpu={k: float(v) for k, v in cpu.items()} if cpu is not None else None,
        partial=partial,
        reference_threads=reference_threads,
        environment=json.loads(json.dumps(dict(environment))) if environment is not None else None,
    )
    parse(json.dumps(run.to_json(), allow_nan=False), "<current run>")  # what load() will see
    return run


def partial_reason(
    *, stopped: str | bool | None, selected: int, outcomes: list[str], collect_errors: int = 0
) -> str | None:
    """Why a run is not complete and green, for ``run.partial`` (None: it is).

    ``stopped``: pytest's shouldfail/shouldstop (``-x``, ``--maxfail``, ``--sw``);
    ``selected``: tests selected after ``-k``/``-m`` deselection; ``outcomes``: one per test
    that reported. A ``-k``/``-m`` subset is not partial: it is complete for what it
    selected.
    """
    why = []
    if stopped:
        why.append(f"stopped early ({stopped})")
    if selected > len(outcomes):
        why.append(f"{selected - len(outcomes)} of {selected} selected tests did not run")
    failed = sum(1 for o in outcomes if o in ("failed", "error"))
    if failed:
        why.append(f"{failed} tests failed")
    if collect_errors:
        why.append(f"{collect_errors} collection errors")
    return "; ".join(why) or None


# -- helpers shared with option validation --------------------------------------------------


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a stored run (it becomes part of a file name), or None."""
    if not name or name != name.strip():
        return f"run name {name!r} must be non-empty, without leading or trailing spaces"
    bad = sorted({c for c in name if c in BAD_NAME_CHARS or ord(c) < 32 or ord(c) == 127})
    if bad:
        return (
            f"run name {name!r} contains {''.join(bad)!r}; a run name becomes a file name and "
            f"must not contain any of {BAD_NAME_CHARS} or control characters"
        )
    if len(name.encode("utf-8")) > 200:
        return f"run name {name[:40]!r}... is longer than 200 bytes (it becomes a file name)"
    return None
