"""The JSON baseline store: one file per run, numbered per machine, never rewritten.

Layout (inside pytest-benchmark's storage folder, ``.benchmarks`` by default)::

    .benchmarks/
      Linux-CPython-3.11-64bit/0001_<tag>.json      <- pytest-benchmark's own runs
      perf/Linux-CPython-3.11-64bit/0001_<tag>.json <- ours (this module)

pytest-benchmark globs ``<storage>/<machine>/*.json`` and ``<storage>/*.json`` only, so our
files, one level deeper under ``perf/``, never reach its loader (and its files never reach
ours). The machine folder uses pytest-benchmark's machine id so users find runs where they
expect them; the full fingerprint inside each file decides whether timings are comparable.

Why these rules:

- *JSON only, validated strictly*: a baseline comes from CI caches and artifacts; nothing in
  it is executed or unpickled, and a damaged file stops the gate with the file name and the
  problem instead of silently gating against nothing.
- *Atomic, append-only writes*: a run is written to a temp file in the same folder and then
  hard-linked (or, where links are unsupported, renamed) to its final name under a file lock,
  so a crash leaves no half file, two writers never get the same number, and an existing run
  is never overwritten. Temp files exist only while their writer holds the lock, so any
  found by the next writer under the lock were left by a killed save and are removed.
- *Bounded input*: duplicate keys (a crafted file could hide a regression behind a second
  value), nesting deeper than :data:`MAX_DEPTH` and number literals longer than
  :data:`MAX_NUMBER_CHARS` are refused before any of it is used.
- *Partial runs are marked*: a run stopped early or with failed tests is stored with
  ``run.partial`` saying why, and the default compare target skips it.

The format history is in ``docs/baseline-format.md``; bump :data:`SCHEMA_VERSION` there too.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perf.store.metrics import UNITS

#: Version of the file format this perf writes and reads (see docs/baseline-format.md).
SCHEMA_VERSION = 3
#: Versions this perf reads (v1: no ``run.cpu``; v1/v2: no ``run.partial`` /
#: ``run.reference_threads``; read as unknown).
READABLE_VERSIONS = (1, 2, 3)
#: Marker that tells our files from any other JSON (pytest-benchmark's included).
FORMAT = "perf-baseline"
#: Sub-folder of the pytest-benchmark storage that holds our runs.
SUBDIR = "perf"
DEFAULT_STORAGE = ".benchmarks"

_RUN_FILE = re.compile(r"^(\d{4,})_(.+)\.json$")
#: Deepest nesting of objects/arrays a baseline may have (ours reach 6).
MAX_DEPTH = 32
#: Longest number literal accepted: 30 digits hold any count a test can make (2**64 has 20)
#: and keep every number convertible to a float.
MAX_NUMBER_CHARS = 32
#: Characters a run name cannot contain: path separators and what Windows forbids.
BAD_NAME_CHARS = '\\/:*?<>|"'
_TMP_PREFIX, _TMP_SUFFIX = ".tmp-", ".part"
_OUTCOMES = {"passed", "failed", "skipped", "error", "xfailed", "xpassed"}


class BaselineError(Exception):
    """A stored run cannot be used: names the file and what is wrong with it."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"baseline {self.path}: {problem}")


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


# -- validation ----------------------------------------------------------------------------


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _opt_type(x: Any, typ: type | tuple[type, ...]) -> bool:
    """None, or an instance of ``typ`` (bools are not ints here)."""
    if x is None:
        return True
    if isinstance(x, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        return False
    return isinstance(x, typ)


#: Types of the fields the gate and ``perf show`` read (None is always allowed).
_COMMIT_TYPES: dict[str, type | tuple[type, ...]] = {"id": str, "branch": str, "dirty": bool}
_FINGERPRINT_TYPES: dict[str, type | tuple[type, ...]] = {
    "cpu_model": str,
    "cpu_count": int,
    "machine": str,
    "system": str,
    "python": str,
    "torch": str,
    "torch_threads": int,
    "cuda": str,
    "cudnn": (int, str),
    "gpus": list,
    "driver": str,
}
_GPU_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "capability": str,
    "total_memory": int,
    "sm_count": int,
}


def _check_metric(path: Path, where: str, m: Any) -> None:
    def bad(problem: str) -> BaselineError:
        return BaselineError(path, f"{where}: {problem}")

    if not isinstance(m, dict):
        raise bad(f"a metric must be an object, got {type(m).__name__}")
    for key in ("name", "value", "unit", "kind"):
        if key not in m:
            raise bad(f"metric is missing field {key!r}")
    if not isinstance(m["name"], str) or not m["name"]:
        raise bad("metric name must be a non-empty string")
    if not _is_num(m["value"]):
        raise bad(f"metric {m['name']!r}: value must be a finite number, got {m['value']!r}")
    if not isinstance(m["unit"], str) or m["unit"] not in UNITS:
        raise bad(f"metric {m['name']!r}: unknown unit {m['unit']!r}")
    if m["kind"] != UNITS[m["unit"]]:
        raise bad(
            f"metric {m['name']!r}: kind {m['kind']!r} does not match unit {m['unit']!r} "
            f"(expected {UNITS[m['unit']]!r})"
        )
    samples = m.get("samples", [])
    if not isinstance(samples, list) or not all(_is_num(s) for s in samples):
        raise bad(f"metric {m['name']!r}: samples must be a list of finite numbers")
    tol = m.get("tolerance")
    if tol is not None and (not _is_num(tol) or tol < 0):
        raise bad(f"metric {m['name']!r}: tolerance must be a non-negative number")
    ci = m.get("ci")
    if ci is not None and (not isinstance(ci, list) or len(ci) != 2 or not all(map(_is_num, ci))):
        raise bad(f"metric {m['name']!r}: ci must be a list [low, high]")
    conf = m.get("confidence")
    if conf is not None and not _is_num(conf):
        raise bad(f"metric {m['name']!r}: confidence must be a number or null")
    if not isinstance(m.get("higher_is_better", False), bool):
        raise bad(f"metric {m['name']!r}: higher_is_better must be true or false")
    if not isinstance(m.get("extra", {}), dict):
        raise bad(f"metric {m['name']!r}: extra must be an object")


def _check_count(path: Path, where: str, m: dict[str, Any], ver: int) -> None:
    """Counts are integers from schema 3 on (floats lost exactness above 2**53)."""
    v = m["value"]
    ok = _is_int(v) if ver >= 3 else (_is_int(v) or float(v).is_integer())
    if m["kind"] == "count" and not ok:
        raise BaselineError(
            path, f"{where}: metric {m['name']!r}: a count must be an integer, got {v!r}"
        )


def _check_types(
    p: Path, where: str, obj: dict[str, Any], types: Mapping[str, type | tuple[type, ...]]
) -> None:
    for key, typ in types.items():
        if key in obj and not _opt_type(obj[key], typ):
            names = "/".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
            raise BaselineError(
                p, f"{where}.{key} must be {names} or null, got {type(obj[key]).__name__}"
            )


def validate(data: Any, path: str | os.PathLike[str] = "<memory>") -> dict[str, Any]:
    """Check a decoded run strictly; returns it unchanged or raises :class:`BaselineError`."""
    p = Path(path)
    if not isinstance(data, dict):
        raise BaselineError(p, f"top level must be a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        if "benchmarks" in data and "machine_info" in data:
            raise BaselineError(p, "this is a pytest-benchmark file, not a perf baseline")
        raise BaselineError(
            p,
            f"not a perf baseline (field 'format' is {data.get('format')!r}, expected {FORMAT!r})",
        )
    ver = data.get("schema_version")
    if not isinstance(ver, int) or isinstance(ver, bool):
        raise BaselineError(p, f"missing or non-integer 'schema_version' ({ver!r})")
    if ver not in READABLE_VERSIONS:
        newer = " (written by a newer perf; upgrade perf)" if ver > SCHEMA_VERSION else ""
        raise BaselineError(
            p,
            f"unknown schema_version {ver}{newer}; this perf reads schema_version "
            f"{', '.join(map(str, READABLE_VERSIONS))} (see docs/baseline-format.md)",
        )
    run = data.get("run")
    if not isinstance(run, dict):
        raise BaselineError(p, "missing object field 'run'")
    for key, typ in (
        ("name", str),
        ("machine", str),
        ("date", str),
        ("commit", dict),
        ("fingerprint", dict),
        ("workers", int),
        ("reference", dict),
    ):
        if key not in run:
            raise BaselineError(p, f"run is missing field {key!r}")
        if not isinstance(run[key], typ):
            raise BaselineError(
                p, f"run.{key} must be {typ.__name__}, got {type(run[key]).__name__}"
            )
    _check_types(p, "run.commit", run["commit"], _COMMIT_TYPES)
    _check_types(p, "run.fingerprint", run["fingerprint"], _FINGERPRINT_TYPES)
    for i, gpu in enumerate(run["fingerprint"].get("gpus") or []):
        if not isinstance(gpu, dict):
            raise BaselineError(p, f"run.fingerprint.gpus[{i}] must be an object")
        _check_types(p, f"run.fingerprint.gpus[{i}]", gpu, _GPU_TYPES)
    if isinstance(run["workers"], bool) or run["workers"] < 0:
        raise BaselineError(p, f"run.workers must be a non-negative int, got {run['workers']!r}")
    if ver >= 3:
        for key in ("partial", "reference_threads"):
            if key not in run:
                raise BaselineError(p, f"run is missing field {key!r} (null when unknown)")
    if not _opt_type(run.get("partial"), str):
        raise BaselineError(p, "run.partial must be null or a string (why the run is partial)")
    rt = run.get("reference_threads")
    if rt is not None and (not _is_int(rt) or rt < 1):
        raise BaselineError(p, f"run.reference_threads must be null or an int >= 1, got {rt!r}")
    for rk, rv in run["reference"].items():
        if not isinstance(rv, list) or not all(_is_num(s) for s in rv):
            raise BaselineError(p, f"run.reference.{rk} must be a list of finite numbers")
    cpu = run.get("cpu")
    if ver >= 2 and "cpu" not in run:
        raise BaselineError(p, "run is missing field 'cpu' (null when unknown)")
    if cpu is not None and (
        not isinstance(cpu, dict)
        or not all(_is_num(cpu.get(k)) for k in ("wall_s", "others_fraction", "steal_fraction"))
    ):
        raise BaselineError(
            p,
            "run.cpu must be null or an object with numbers wall_s, others_fraction, "
            "steal_fraction",
        )
    tests = data.get("tests")
    if not isinstance(tests, dict):
        raise BaselineError(p, "missing object field 'tests'")
    for nodeid, entry in tests.items():
        if not isinstance(entry, dict):
            raise BaselineError(p, f"tests[{nodeid!r}] must be an object")
        if entry.get("outcome") not in _OUTCOMES:
            raise BaselineError(
                p,
                f"tests[{nodeid!r}].outcome must be one of "
                f"{sorted(_OUTCOMES)}, got {entry.get('outcome')!r}",
            )
        metrics = entry.get("metrics")
        if not isinstance(metrics, list):
            raise BaselineError(p, f"tests[{nodeid!r}] is missing list field 'metrics'")
        seen: set[str] = set()
        for i, m in enumerate(metrics):
            _check_metric(p, f"tests[{nodeid!r}].metrics[{i}]", m)
            _check_count(p, f"tests[{nodeid!r}].metrics[{i}]", m, ver)
            if m["name"] in seen:
                raise BaselineError(p, f"tests[{nodeid!r}]: metric {m['name']!r} appears twice")
            seen.add(m["name"])
    return data


def parse(text: str | bytes, path: str | os.PathLike[str] = "<memory>") -> dict[str, Any]:
    """Decode and validate; truncated or non-JSON input raises :class:`BaselineError`."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BaselineError(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise BaselineError(path, "file is empty")
    depth = _max_depth(text)
    if depth > MAX_DEPTH:
        raise BaselineError(path, f"JSON nested {depth} levels deep (at most {MAX_DEPTH})")
    try:
        data = json.loads(
            text,
            parse_constant=_reject_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
            object_pairs_hook=_no_duplicates,
        )
    except _Refused as e:
        raise BaselineError(path, str(e)) from None
    except json.JSONDecodeError as e:
        body = text.rstrip()
        truncated = body.startswith(("{", "[")) and (
            e.pos >= len(body) - 1
            or e.msg.startswith("Unterminated")
            or not body.endswith(("}", "]"))
        )
        what = "truncated JSON (the file ends mid-document)" if truncated else "not valid JSON"
        raise BaselineError(path, f"{what}: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:
        raise BaselineError(path, f"not valid JSON: {e}") from None
    return validate(data, path)


class _Refused(ValueError):
    """Valid JSON that a baseline must not contain."""


def _reject_constant(name: str) -> Any:
    raise _Refused(f"{name} is not allowed in a baseline (numbers must be finite)")


def _parse_int(literal: str) -> int:
    if len(literal) > MAX_NUMBER_CHARS:
        raise _Refused(
            f"integer with {len(literal)} characters (at most {MAX_NUMBER_CHARS}): "
            f"{literal[:12]}..."
        )
    return int(literal)


def _parse_float(literal: str) -> float:
    v = float(literal)
    if len(literal) > MAX_NUMBER_CHARS or not math.isfinite(v):
        raise _Refused(f"number {literal[:40]!r} is too long or not finite")
    return v


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Refused(
                f"duplicate key {k[:80]!r} in one object (a second value could hide the first)"
            )
        out[k] = v
    return out


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def _max_depth(text: str) -> int:
    """Deepest object/array nesting, counted outside strings (linear; before json.loads,
    whose recursion would otherwise end in RecursionError)."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub('""', text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _number_from_name(path: Path) -> tuple[int, str] | None:
    m = _RUN_FILE.match(path.name)
    return (int(m.group(1)), m.group(2)) if m else None


def load(path: str | os.PathLike[str]) -> Run:
    """Read and validate one run file. Read-only: the file is never modified."""
    p = Path(path).absolute()  # errors name the file unambiguously in CI logs
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise BaselineError(p, "file does not exist") from None
    except OSError as e:
        raise BaselineError(p, f"cannot read: {e.strerror or e}") from None
    data = parse(raw, p)
    run = data["run"]
    parsed = _number_from_name(p)
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
    )
    parse(json.dumps(run.to_json(), allow_nan=False), "<current run>")  # what load() will see
    return run


# -- the store -----------------------------------------------------------------------------


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
                parsed = _number_from_name(p)
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

        ``True``/``None``: :meth:`latest_complete`. ``"3"``/``"0003"``: run number 3 of
        ``machine``. A path to a ``.json`` file: that file. ``"OTHER-MACHINE/3"``: run 3 of
        another machine. Any other text: the latest run of ``machine`` whose name contains it.
        Raises :class:`BaselineNotFound`, or :class:`NotARun` for a test file or folder
        (``pytest --benchmark-compare tests/``: the option took the path as its value).
        """
        if spec is None or spec is True or spec == "":
            return self.latest_complete(machine, fingerprint, timing_keys)
        text = str(spec)
        problem = test_path_problem(text, folders=False)
        if problem:
            raise NotARun(problem)
        cand = Path(text)
        if cand.suffix == ".json":
            if not cand.is_file():
                raise BaselineNotFound(f"baseline file {text} does not exist")
            parsed = _number_from_name(cand)
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
