"""One command for a GPU box: the CUDA half of perf, run and written down.

    python benchmarks/gpu_check.py                 # or: tox -e gpu
    python benchmarks/gpu_check.py --out-dir DIR -- -x -k amp   # extra pytest arguments

Runs ``pytest tests/benchmarks tests/harness --perf-devices cuda`` serially (the property
suite on every visible GPU, the GPU health checks of ``tests/benchmarks/test_gpu_health.py``,
the simulated-device parity test where it exists, and the harness tests that use the
``device`` fixture) with Chrome traces of failing timing tests, and writes
``benchmarks/results/gpu_<gpu-name>_<date>.json``: the machine fingerprint, every test's
outcome and metrics, the timer's accuracy, the matmul and host-to-device efficiencies against
the device's nominal peak, and flags (a goal missed, a GPU far below its previous check).
Exit status: pytest's (the JSON is written either way); 2 without CUDA, before anything runs.

This module is also the pytest plugin (``-p gpu_check``) that records each test report.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTCOMES_ENV = "PERF_GPU_CHECK_REPORTS"
SCHEMA = "perf-gpu-check/1"
#: A throughput this much below the previous check of the same GPU model is flagged.
MAX_DROP = 0.30
#: Below this fraction of the datasheet peak a figure is flagged even without history.
MIN_FRACTION_OF_PEAK = 0.30
NEEDS_CUDA = (
    "gpu_check needs CUDA: torch.cuda.is_available() is False here (torch {torch}, CUDA build "
    "{cuda}). Run it on a GPU box with a CUDA build of torch that its driver supports "
    "(nvidia-smi shows the driver); on a CPU box run `pytest` instead."
)


# -- the plugin side: one JSON line per test report -----------------------------------------


def pytest_runtest_logreport(report: Any) -> None:
    path = os.environ.get(OUTCOMES_ENV)
    if not path:
        return
    rec: dict[str, Any] = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "duration_s": float(getattr(report, "duration", 0.0)),
    }
    if report.skipped and isinstance(report.longrepr, tuple):
        rec["message"] = str(report.longrepr[2])
    elif report.failed:
        rec["message"] = str(getattr(report, "longreprtext", "") or report.longrepr)[-2000:]
    if report.when == "teardown":
        rec["metrics"] = list(getattr(report, "perf_metrics", None) or [])
    _append(path, rec)


def pytest_collectreport(report: Any) -> None:
    """A module that fails to import is an error of the check, not a silent absence."""
    path = os.environ.get(OUTCOMES_ENV)
    if not path or not report.failed:
        return
    text = str(getattr(report, "longreprtext", "") or report.longrepr)[-2000:]
    _append(path, {"nodeid": report.nodeid or ".", "when": "collect", "outcome": "failed",
                   "duration_s": 0.0, "message": text})  # fmt: skip


def _append(path: str, rec: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec, default=str) + "\n")


# -- pure parts -----------------------------------------------------------------------------


def tests_from_reports(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge the setup / call / teardown records into one entry per test, in run order.

    outcome: passed, failed, skipped, or error (setup or teardown failed, or the module
    could not be collected).
    """
    tests: dict[str, dict[str, Any]] = {}
    for r in lines:
        t = tests.setdefault(
            r["nodeid"],
            {"nodeid": r["nodeid"], "outcome": "passed", "duration_s": 0.0, "metrics": []},
        )
        t["duration_s"] += r.get("duration_s", 0.0)
        when, outcome = r["when"], r["outcome"]
        if when == "collect":
            t["outcome"], t["message"] = "error", r.get("message", "")
        elif when == "call" or (when == "setup" and outcome != "passed"):
            t["outcome"] = outcome if when == "call" or outcome == "skipped" else "error"
            if "message" in r:
                t["message"] = r["message"]
        elif when == "teardown":
            t["metrics"] = r.get("metrics", [])
            if outcome == "failed" and t["outcome"] in ("passed", "skipped"):
                t["outcome"], t["message"] = "error", r.get("message", "")
    return list(tests.values())


def summary(tests: list[dict[str, Any]]) -> dict[str, int]:
    out = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for t in tests:
        out[t["outcome"]] = out.get(t["outcome"], 0) + 1
    return out


def _metrics_of(tests: list[dict[str, Any]], test_name: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for t in tests:
        if f"::{test_name}[" in t["nodeid"] or t["nodeid"].endswith(f"::{test_name}"):
            dev = t["nodeid"].rsplit("[", 1)[-1].rstrip("]") if "[" in t["nodeid"] else ""
            for m in t["metrics"]:
                out[f"{dev}/{m['name']}" if dev else m["name"]] = m
    return out


_RATE = re.compile(r"^(?:(?P<dev>[^/]+)/)?(?P<name>.+)_(?P<unit>tflop_per_s|gb_per_s)$")


def efficiency_table(tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Throughputs recorded by the GPU health tests, with their fraction of nominal peak."""
    metrics = {
        **_metrics_of(tests, "test_gpu_matmul_throughput_against_peak"),
        **_metrics_of(tests, "test_gpu_h2d_throughput_against_peak"),
    }
    rows = []
    for key, m in metrics.items():
        hit = _RATE.match(key)
        if not hit:
            continue
        dev, name = hit.group("dev"), hit.group("name")
        frac_key = f"{dev}/{name}_fraction_of_peak" if dev else f"{name}_fraction_of_peak"
        frac = metrics.get(frac_key)
        rows.append(
            {
                "device": dev,
                "name": name,
                "value": m["value"],
                "unit": "TFLOP/s" if hit.group("unit") == "tflop_per_s" else "GB/s",
                "nominal_peak": (m.get("extra") or {}).get("nominal_peak"),
                "fraction_of_peak": frac["value"] if frac else None,
            }
        )
    return rows


def timer_section(tests: list[dict[str, Any]]) -> dict[str, Any] | None:
    metrics = _metrics_of(tests, "test_gpu_timer_accuracy_against_known_sleeps")
    if not metrics:
        return None
    out: dict[str, Any] = {}
    for key, m in metrics.items():
        dev, _, name = key.rpartition("/")
        entry = out.setdefault(dev or "cuda", {})
        entry[name.removeprefix("timer_")] = m["value"]
        if name == "timer_clock_hz":
            entry.update({k: v for k, v in (m.get("extra") or {}).items()})
        if name == "timer_goal_met":
            entry["goal"] = (m.get("extra") or {}).get("goal")
    return out


def flags(
    efficiency: list[dict[str, Any]],
    timer: dict[str, Any] | None,
    previous: dict[str, Any] | None,
) -> list[str]:
    """What a person should look at: far below the previous check of this GPU model, far
    below the datasheet, or the timer goal missed."""
    out: list[str] = []
    prev_rows = {(r["device"], r["name"]): r for r in (previous or {}).get("efficiency", [])}
    when = (previous or {}).get("created_utc", "?")
    for r in efficiency:
        label = f"{r['device']} {r['name']}".strip()
        p = prev_rows.get((r["device"], r["name"]))
        if p and p["value"] > 0 and r["value"] < (1 - MAX_DROP) * p["value"]:
            out.append(
                f"{label}: {r['value']:.4g} {r['unit']} is {1 - r['value'] / p['value']:.0%} "
                f"below the previous check of this GPU model ({p['value']:.4g} on {when}): "
                "a broken, throttled or shared runner?"
            )
        frac = r.get("fraction_of_peak")
        if frac is not None and frac < MIN_FRACTION_OF_PEAK:
            out.append(
                f"{label}: {frac:.0%} of the datasheet peak ({r['nominal_peak']} {r['unit']}), "
                f"below {MIN_FRACTION_OF_PEAK:.0%}"
            )
    for dev, t in (timer or {}).items():
        if t.get("goal_met") == 0:
            out.append(f"{dev}: timer goal missed ({t.get('goal')}); errors {t.get('errors')}")
    return out


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-") or "unknown"


def result_path(out_dir: Path, gpu_name: str, date: _dt.date) -> Path:
    return out_dir / f"gpu_{slug(gpu_name)}_{date.isoformat()}.json"


def previous_result(out_dir: Path, gpu_name: str, exclude: Path) -> dict[str, Any] | None:
    """The newest earlier check of the same GPU model in ``out_dir`` (None: first one)."""
    files = sorted(p for p in out_dir.glob(f"gpu_{slug(gpu_name)}_*.json") if p != exclude)
    for p in reversed(files):
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if data.get("schema") == SCHEMA:
            return data  # type: ignore[no-any-return]
    return None


#: The result file's fields and their JSON types (``validate`` checks a file against them).
FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema": str, "created_utc": str, "command": list, "pytest_exit_code": int,
    "rehearsal": int, "fingerprint": dict, "summary": dict, "failed": list,
    "timer_accuracy": (dict, type(None)), "efficiency": list, "flags": list,
    "traces_dir": str, "tests": list,
}  # fmt: skip
TEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "nodeid": str, "outcome": str, "duration_s": (int, float), "metrics": list,
}  # fmt: skip


def validate(data: Any) -> list[str]:
    """Problems of a result file against :data:`SCHEMA` (empty: valid)."""
    if not isinstance(data, dict):
        return ["not a JSON object"]
    out = [f"{k}: missing" for k in FIELDS if k not in data]
    out += [
        f"{k}: {type(data[k]).__name__}, expected {t}"
        for k, t in FIELDS.items()
        if k in data and not isinstance(data[k], t)
    ]
    if data.get("schema") != SCHEMA:
        out.append(f"schema: {data.get('schema')!r}, expected {SCHEMA!r}")
    tests = data.get("tests") if isinstance(data.get("tests"), list) else []
    for t in tests:
        bad = [k for k, typ in TEST_FIELDS.items() if not isinstance(t.get(k), typ)]
        if bad or t.get("outcome") not in ("passed", "failed", "skipped", "error"):
            out.append(f"test {t.get('nodeid')!r}: bad {bad or 'outcome'}")
    if (
        isinstance(data.get("summary"), dict)
        and tests
        and sum(data["summary"].values()) != len(tests)
    ):
        out.append("summary: counts do not add up to the tests")
    return out


def assemble(
    *,
    fingerprint: dict[str, Any],
    command: list[str],
    exit_code: int,
    tests: list[dict[str, Any]],
    previous: dict[str, Any] | None,
    traces_dir: str,
    now: _dt.datetime,
    rehearsal: int = 0,
) -> dict[str, Any]:
    eff = efficiency_table(tests)
    timer = timer_section(tests)
    return {
        "schema": SCHEMA,
        "created_utc": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "pytest_exit_code": exit_code,
        "rehearsal": rehearsal,
        "fingerprint": fingerprint,
        "summary": summary(tests),
        "failed": [t["nodeid"] for t in tests if t["outcome"] in ("failed", "error")],
        "timer_accuracy": timer,
        "efficiency": eff,
        "flags": flags(eff, timer, previous),
        "traces_dir": traces_dir,
        "tests": tests,
    }


# -- the command ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print(NEEDS_CUDA.format(torch=torch.__version__, cuda=torch.version.cuda), file=sys.stderr)
        return 2

    from perf.core.devices import fingerprint
    from perf.core.rehearse import active

    rehearsal = active()  # PERF_REHEARSE_CUDA: a CPU box standing in for a GPU one
    now = _dt.datetime.now(_dt.timezone.utc)
    gpu = torch.cuda.get_device_name(0)
    out = result_path(args.out_dir, gpu, now.date())
    if rehearsal:  # never mistaken for (or compared with) a real check of this GPU
        out = out.with_name(f"rehearsal_{out.name}")
    traces = args.out_dir / f"{out.stem}_traces"
    reports = args.out_dir / f".{out.stem}.reports.jsonl"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    reports.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "pytest", "tests/benchmarks", "tests/harness",
        "-p", "no:xdist", "-p", "gpu_check", "--perf-devices", "cuda",
        f"--perf-trace-dir={traces}", "-q", *args.pytest_args,
    ]  # fmt: skip
    env = dict(os.environ)
    env[OUTCOMES_ENV] = str(reports)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "benchmarks"), *filter(None, [env.get("PYTHONPATH")])]
    )
    rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    lines = []
    if reports.exists():
        lines = [json.loads(x) for x in reports.read_text(encoding="utf-8").splitlines() if x]
        reports.unlink()
    result = assemble(
        fingerprint=fingerprint(),
        command=cmd[1:],
        exit_code=rc,
        tests=tests_from_reports(lines),
        previous=previous_result(args.out_dir, gpu, out),
        traces_dir=str(traces.relative_to(ROOT) if traces.is_relative_to(ROOT) else traces),
        now=now,
        rehearsal=rehearsal,
    )
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"\ngpu_check: {result['summary']} -> {out}")
    for f in result["flags"]:
        print(f"FLAG: {f}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
