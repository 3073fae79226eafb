"""benchmarks/gpu_check.py on a CPU box: it refuses to run without CUDA (run exactly as the
README writes it), its pytest plugin records real reports, and the result assembly (outcomes,
timer, efficiency table, flags, file name, history) is checked on deterministic inputs."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from perf.store.metrics import make_metric

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
assert _spec is not None and _spec.loader is not None
gc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gc)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a box without CUDA")
def test_fails_fast_without_cuda_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--out-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "gpu_check needs CUDA: torch.cuda.is_available() is False" in proc.stderr
    assert not out.exists()


def test_plugin_records_every_outcome_and_the_metrics(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reports = tmp_path / "r.jsonl"
    monkeypatch.setenv(gc.OUTCOMES_ENV, str(reports))
    monkeypatch.setenv("PYTHONPATH", str(SCRIPT.parent))
    pytester.makepyfile(
        test_m="""
        import pytest

        @pytest.fixture
        def broken():
            raise RuntimeError("setup broke")

        def test_ok(perf_metrics):
            perf_metrics.record("n_ops", 3, "ops")

        def test_bad():
            assert 1 == 2

        @pytest.mark.skip(reason="needs CUDA")
        def test_skip():
            pass

        def test_err(broken):
            pass
        """
    )
    pytester.runpytest_subprocess("-p", "gpu_check", "-p", "no:xdist", "--perf-devices", "cpu")
    lines = [json.loads(x) for x in reports.read_text().splitlines()]
    tests = {t["nodeid"]: t for t in gc.tests_from_reports(lines)}
    assert {k: v["outcome"] for k, v in tests.items()} == {
        "test_m.py::test_ok": "passed",
        "test_m.py::test_bad": "failed",
        "test_m.py::test_skip": "skipped",
        "test_m.py::test_err": "error",
    }
    assert tests["test_m.py::test_ok"]["metrics"][0]["name"] == "n_ops"
    assert "assert 1 == 2" in tests["test_m.py::test_bad"]["message"]
    assert "needs CUDA" in tests["test_m.py::test_skip"]["message"]
    assert "setup broke" in tests["test_m.py::test_err"]["message"]
    assert gc.summary(list(tests.values())) == {"passed": 1, "failed": 1, "skipped": 1, "error": 1}


def _m(name: str, value: float, unit: str = "1", **extra) -> dict:
    return make_metric(name, value, unit=unit, extra=extra).to_dict()


def _health_tests(bf16: float, frac: float | None, goal_met: int = 1) -> list[dict]:
    node = "tests/benchmarks/test_gpu_health.py::"
    mm = [_m("bf16_matmul_tflop_per_s", bf16, nominal_peak=989.4 if frac else None)]
    if frac is not None:
        mm.append(_m("bf16_matmul_fraction_of_peak", frac))
    return [
        {"nodeid": f"{node}test_gpu_matmul_throughput_against_peak[cuda:0]",
         "outcome": "passed", "duration_s": 1.0, "metrics": mm},
        {"nodeid": f"{node}test_gpu_h2d_throughput_against_peak[cuda:0]", "outcome": "failed",
         "duration_s": 1.0, "metrics": [_m("pinned_h2d_gb_per_s", 50.0, nominal_peak=63.0),
                                        _m("pinned_h2d_fraction_of_peak", 50.0 / 63.0)]},
        {"nodeid": f"{node}test_gpu_timer_accuracy_against_known_sleeps[cuda:0]",
         "outcome": "passed", "duration_s": 1.0,
         "metrics": [_m("timer_clock_hz", 1.98e9, errors=[0.1, 0.012, 0.001]),
                     _m("timer_goal_met", goal_met, goal="|error| <= 1% from 100 us up")]},
    ]  # fmt: skip


def test_assemble_collects_efficiency_timer_failures_and_flags() -> None:
    now = dt.datetime(2026, 11, 22, 7, 0, tzinfo=dt.timezone.utc)
    previous = {"created_utc": "2026-11-01T00:00:00Z", "efficiency": [
        {"device": "cuda:0", "name": "bf16_matmul", "value": 700.0}]}  # fmt: skip
    res = gc.assemble(
        fingerprint={"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]},
        command=["-m", "pytest"],
        exit_code=1,
        tests=_health_tests(bf16=300.0, frac=300.0 / 989.4, goal_met=0),
        previous=previous,
        traces_dir="benchmarks/results/x_traces",
        now=now,
    )
    assert res["schema"] == gc.SCHEMA and res["created_utc"] == "2026-11-22T07:00:00Z"
    assert res["summary"] == {"passed": 2, "failed": 1, "skipped": 0, "error": 0}
    assert res["failed"] == [
        "tests/benchmarks/test_gpu_health.py::test_gpu_h2d_throughput_against_peak[cuda:0]"
    ]
    rows = {r["name"]: r for r in res["efficiency"]}
    assert rows["bf16_matmul"] == {
        "device": "cuda:0", "name": "bf16_matmul", "value": 300.0, "unit": "TFLOP/s",
        "nominal_peak": 989.4, "fraction_of_peak": pytest.approx(300.0 / 989.4),
    }  # fmt: skip
    assert rows["pinned_h2d"]["unit"] == "GB/s"
    assert res["timer_accuracy"]["cuda:0"]["goal_met"] == 0
    text = "\n".join(res["flags"])
    assert "cuda:0 bf16_matmul: 300 TFLOP/s is 57% below the previous check" in text
    assert "30% of the datasheet peak" not in text  # 30.3% is not below 30%
    assert "timer goal missed" in text
    json.dumps(res)  # the file is plain JSON


def test_flags_quiet_for_a_healthy_gpu_and_absolute_only_for_unknown_ones() -> None:
    healthy = gc.efficiency_table(_health_tests(bf16=690.0, frac=690.0 / 989.4))
    prev = {"efficiency": [{"device": "cuda:0", "name": "bf16_matmul", "value": 700.0}]}
    assert gc.flags(healthy, {"cuda:0": {"goal_met": 1}}, prev) == []
    unknown = gc.efficiency_table(_health_tests(bf16=100.0, frac=None))
    row = next(r for r in unknown if r["name"] == "bf16_matmul")
    assert row["nominal_peak"] is None and row["fraction_of_peak"] is None
    low = gc.efficiency_table(_health_tests(bf16=200.0, frac=200.0 / 989.4))
    assert any("20% of the datasheet peak" in f for f in gc.flags(low, None, None))


def test_result_path_and_previous_result(tmp_path: Path) -> None:
    p = gc.result_path(tmp_path, "NVIDIA H100 80GB HBM3", dt.date(2026, 11, 22))
    assert p.name == "gpu_NVIDIA-H100-80GB-HBM3_2026-11-22.json"
    older = tmp_path / "gpu_NVIDIA-H100-80GB-HBM3_2026-11-01.json"
    older.write_text(json.dumps({"schema": gc.SCHEMA, "efficiency": []}))
    (tmp_path / "gpu_NVIDIA-H100-80GB-HBM3_2026-11-02.json").write_text("not json")
    (tmp_path / "gpu_NVIDIA-L4_2026-11-03.json").write_text(json.dumps({"schema": gc.SCHEMA}))
    assert gc.previous_result(tmp_path, "NVIDIA H100 80GB HBM3", p) == {
        "schema": gc.SCHEMA, "efficiency": []}  # fmt: skip
    assert gc.previous_result(tmp_path, "NVIDIA A100-SXM4-80GB", p) is None
