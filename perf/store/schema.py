"""The stored run's format: constants, strict validation and the bounded JSON reader.

Nothing read here is executed or unpickled; every limit (:data:`MAX_DEPTH`,
:data:`MAX_NUMBER_CHARS`, duplicate keys) is checked before any value is used.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perf.store.metrics import UNITS

#: Version of the file format this perf writes and reads (see docs/baseline-format.md).
SCHEMA_VERSION = 4
#: Versions this perf reads (v1: no ``run.cpu``; v1/v2: no ``run.partial`` /
#: ``run.reference_threads``; read as unknown).
READABLE_VERSIONS = (1, 2, 3, 4)
#: Marker that tells our files from any other JSON (pytest-benchmark's included).
FORMAT = "perf-baseline"
#: Sub-folder of the pytest-benchmark storage that holds our runs.
SUBDIR = "perf"
DEFAULT_STORAGE = ".benchmarks"

RUN_FILE = re.compile(r"^(\d{4,})_(.+)\.json$")
#: Deepest nesting of objects/arrays a baseline may have (ours reach 6).
MAX_DEPTH = 32
#: Longest number literal accepted: 30 digits hold any count a test can make (2**64 has 20)
#: and keep every number convertible to a float.
MAX_NUMBER_CHARS = 32
#: Largest run file read (bytes). Reading costs a small multiple of the file's size in memory
#: and linear time; a real run holds far less (1000 tests x 2 metrics x 500 samples ~ 25 MB).
MAX_FILE_BYTES = 64 * 2**20
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
    noisy = m.get("noisy")
    if noisy is not None and (not isinstance(noisy, str) or m["kind"] != "time"):
        raise bad(f"metric {m['name']!r}: noisy must be a string on a time metric, or absent")


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
    env = run.get("environment")
    if env is not None and (
        not isinstance(env, dict)
        or not all(
            isinstance(env.get(k, {}), dict)
            and all(isinstance(a, str) and isinstance(b, str) for a, b in env.get(k, {}).items())
            for k in ("packages", "env")
        )
    ):
        raise BaselineError(
            p, "run.environment must be null or an object with string maps packages and env"
        )
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
    if len(text) > MAX_FILE_BYTES:
        raise BaselineError(path, _too_big(len(text)))
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


#: A JSON string (possessive: no backtracking state per character) or a bracket.
_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+"|[\[\]{}]')


def _max_depth(text: str) -> int:
    """Deepest object/array nesting, counted outside strings, before json.loads (whose
    recursion would otherwise end in RecursionError). Linear time, constant extra memory:
    the old ``re.sub`` over strings kept ~125 bytes of backtracking state per character."""
    depth = deepest = 0
    for m in _TOKEN.finditer(text):
        c = text[m.start()]
        if c == '"':
            continue
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _too_big(size: int) -> str:
    return (
        f"{size} bytes, more than a run file may have ({MAX_FILE_BYTES} bytes, "
        "perf.store.schema.MAX_FILE_BYTES): not read (a damaged or planted file?)"
    )


def read_bounded(path: Path) -> bytes:
    """The file's bytes, refusing (before reading) one larger than :data:`MAX_FILE_BYTES`."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise BaselineError(path, _too_big(size))
            raw = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise BaselineError(path, "file does not exist") from None
    except IsADirectoryError:
        raise BaselineError(path, "is a directory, not a run file") from None
    except PermissionError as e:
        raise BaselineError(
            path, f"cannot read: {e.strerror or e} (check its permissions)"
        ) from None
    except OSError as e:
        raise BaselineError(path, f"cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:  # grew while being read
        raise BaselineError(path, _too_big(len(raw)))
    return raw
