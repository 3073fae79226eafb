"""The GPU model's benchmarks on a CPU box: ``model_vs_gpu.py`` refuses cleanly without CUDA
(run exactly as docs/gpu-model.md shows it), maps GPU names to model targets, and the
committed overhead results hold what docs/measurements.md quotes."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "model_vs_gpu.py"
_spec = importlib.util.spec_from_file_location("model_vs_gpu", SCRIPT)
assert _spec is not None and _spec.loader is not None
model_vs_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model_vs_gpu)


DOC = (ROOT / "docs" / "gpu-model.md").read_text(encoding="utf-8")
#: the commands docs/gpu-model.md shows, run here exactly as written
MODEL_VS_GPU = "python benchmarks/model_vs_gpu.py --out model_vs_gpu.json"
SUITE_WITH_TARGET = (
    "pytest tests/benchmarks/test_p6_launch_overhead.py -k modelled --perf-gpu-target A100"
)
REPLAY_QUICK = (
    "python benchmarks/model_vs_gpu.py --replay "
    "benchmarks/results/model_vs_gpu_NVIDIA-H200_2026-11-27_run2.json "
    "--only p6_adam_step_fused,p4_copy_loop_pageable --out replay.json"
)
SUITE_WITH_HOST = (
    "pytest tests/benchmarks/test_p6_launch_overhead.py -k modelled --perf-gpu-host-op-us 12"
)


def _run(command: str, documented: bool = True, **extra: str) -> subprocess.CompletedProcess[str]:
    if documented:
        assert f"    {command}\n" in DOC, f"docs/gpu-model.md no longer shows `{command}`"
    argv = shlex.split(command)
    argv = [sys.executable, *argv[1:]] if argv[0] == "python" else [sys.executable, "-m", *argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CUDA_"))}
    env.update(extra)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="this process has CUDA: the refusal is checked where there is none",
)
def test_model_vs_gpu_refuses_without_cuda_and_writes_nothing() -> None:
    proc = _run(MODEL_VS_GPU)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "model_vs_gpu needs CUDA: torch.cuda.is_available() is False" in proc.stderr
    assert not (ROOT / "model_vs_gpu.json").exists()


def test_the_documented_replay_models_a_gpu_run_on_sim_and_refuses_other_files(
    tmp_path: Path,
) -> None:
    """docs/gpu-model.md's replay, as written: no GPU needed; the fused Adam step models
    2 launches x 34.5 us + its last kernel's 2 us, both rows launch what the H200 did (the
    results predate model 3's op counts: the launches are compared), and the JSON says which
    model and which GPU run it compared."""
    out = ROOT / "replay.json"
    try:
        proc = _run(REPLAY_QUICK, CUDA_VISIBLE_DEVICES="")  # as the script sets it itself
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        doc = json.loads(out.read_text(encoding="utf-8"))
    finally:
        out.unlink(missing_ok=True)
    assert "launches as on the GPU in 2 of 2 rows" in proc.stdout
    rows = {r["workload"]: r for r in doc["rows"]}
    assert rows["p6_adam_step_fused"]["modelled_s"] == pytest.approx(71e-6, abs=1e-12)
    assert rows["p6_adam_step_fused"]["measured_s"] == pytest.approx(72.9e-6, rel=1e-3)
    assert all(r["same_stream_as_gpu"] for r in rows.values())
    assert (doc["schema"], doc["model"], doc["replayed"], doc["compared"]) == (
        "perf-model-vs-gpu-replay/1",
        3,
        "NVIDIA H200",
        "launches",
    )
    bad = tmp_path / "bad.json"
    for text, says in (
        ("{", "cannot read"),
        ('{"schema": "perf-run/3"}', "is not results of benchmarks/model_vs_gpu.py"),
        ('{"schema": "perf-model-vs-gpu/1", "rows": [{"workload": "x"}]}', "measured_s above 0"),
    ):
        bad.write_text(text, encoding="utf-8")
        proc = _run(f"python benchmarks/model_vs_gpu.py --replay {bad}", False)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-2000:]
    proc = _run(REPLAY_QUICK.replace("p6_adam_step_fused", "p9_nothing"), False)
    assert proc.returncode == 2
    assert "no such workload in the results: p9_nothing" in proc.stderr


def test_the_committed_replays_hold_what_the_docs_quote() -> None:
    """The full replays (docs/measurements.md's table) were run with this model: the median
    errors and the host cost fitted on the first run quoted, and every row launching what the
    GPU run launched."""
    results = ROOT / "benchmarks" / "results"
    first, second = (
        json.loads(
            (results / f"model_vs_gpu_NVIDIA-H200_2026-11-27{run}_replay_sim.json").read_text()
        )
        for run in ("", "_run2")
    )
    from perf.instruments.gpu_targets import HOST_OP_S, MODEL_VERSION

    assert first["model"] == second["model"] == MODEL_VERSION
    assert (len(first["rows"]), len(second["rows"])) == (19, 19)
    assert round(first["median_relative_error"], 3) == 0.190
    assert round(second["median_relative_error"], 3) == 0.244
    assert second["same_stream_rows"] == 19 and first["same_stream_rows"] == 19
    assert first["compared"] == second["compared"] == "launches"
    assert first["host_fit"]["host_op_s"] == pytest.approx(HOST_OP_S) == 34.5e-6
    assert second["host_fit"]["host_op_s"] == pytest.approx(29.5e-6)


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="this process has CUDA: the suite's sim parametrization runs where there is none",
)
def test_the_documented_suite_command_models_on_the_chosen_target(tmp_path: Path) -> None:
    proc = _run(SUITE_WITH_TARGET, PERF_STORE=str(tmp_path / "store"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout and "(modelled)" in proc.stdout
    bad = _run(SUITE_WITH_TARGET.replace("A100", "B300"), False, PERF_STORE=str(tmp_path / "store"))
    assert bad.returncode != 0
    assert "--perf-gpu-target: unknown GPU target 'B300'; known targets: 'H100 SXM'" in (
        bad.stdout + bad.stderr
    )


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="this process has CUDA: the suite's sim parametrization runs where there is none",
)
def test_the_documented_host_cost_option_models_a_faster_host(tmp_path: Path) -> None:
    """docs/gpu-model.md's command: the fused Adam step (2 launches, both launch-bound) models
    2 x 12 us + its last kernel's 2 us with 12 us an op, 2 x 34.5 + 2 us with the default;
    a cost that is no positive number stops the run at start, naming the option."""

    def fused_us(proc: subprocess.CompletedProcess[str]) -> float:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        line = next(ln for ln in proc.stdout.splitlines() if "adam_fused_step_gpu_time" in ln)
        value, unit = line.split()[-3:-1]
        return float(value) * {"us": 1.0, "ms": 1e3}[unit]

    store = str(tmp_path / "store")
    default = fused_us(_run(SUITE_WITH_HOST.removesuffix(" --perf-gpu-host-op-us 12"),
                            False, PERF_STORE=store))  # fmt: skip
    fast = fused_us(_run(SUITE_WITH_HOST, PERF_STORE=store))
    assert (default, fast) == (71.0, 26.0)
    positive = "a host cost per op must be a positive number of microseconds"
    for bad, says in (("abc", "'abc' is not a number of microseconds"),
                      ("-3", f"{positive}, got -3.0")):  # fmt: skip
        proc = _run(SUITE_WITH_HOST.replace(" 12", f"={bad}"), False, PERF_STORE=store)
        assert proc.returncode == pytest.ExitCode.USAGE_ERROR
        assert f"--perf-gpu-host-op-us: {says}" in proc.stderr


def test_with_host_cost_names_the_figure_and_refuses_nonsense() -> None:
    from perf.instruments.gpu_targets import get_target, with_host_cost

    t = with_host_cost(get_target("H200"), "25")
    assert (t.name, t.host_op_s, t.host_dispatch_s) == ("H200, host 25 us/op", 25e-6, 25e-6)
    assert t.bf16_tflops == get_target("H200").bf16_tflops
    for bad in ("0", "inf", "nan", None):
        with pytest.raises(ValueError, match="microseconds"):
            with_host_cost(get_target("H200"), bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("gpu", "target"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10", "A10"),
        ("Tesla T4", "T4"),
        ("NVIDIA B200", None),
    ],
)
def test_a_gpu_name_maps_to_its_model_target(gpu: str, target: str | None) -> None:
    assert model_vs_gpu.target_for(gpu) == target


def test_the_committed_overhead_results_are_complete() -> None:
    doc = json.loads((ROOT / "benchmarks/results/model_overhead_2core.json").read_text())
    assert doc["benchmark"] == "model_overhead" and doc["limit"] == 1.2
    assert {r["workload"] for r in doc["rows"]} == {
        "iris 4-16-3, batch 120",
        "mlp 256-1024x2-10, batch 512",
    }
    for r in doc["rows"]:
        lo, hi = r["ci95"]
        assert lo <= r["ratio"] <= hi and r["pairs"] >= 8


def test_host_fit_recovers_the_host_cost_that_made_the_times() -> None:
    """``model_vs_gpu.py``'s host fit on times the model itself made with 20 us per
    dispatched op: it finds 20 us, with no error on the fitted and the held-out rows; a
    held-out row measured twice as long is an error of 0.5 (|modelled - measured| /
    measured)."""
    from dataclasses import replace

    from perf.instruments.gpu_targets import get_target
    from perf.instruments.gpu_timeline import OpEvent, simulate

    def op(kind: str) -> OpEvent:
        return OpEvent(kind, "x", "t.py:1", "float32", flops=1000, nbytes=4096)  # type: ignore[arg-type]

    tgt = get_target("H200")
    events = {
        "p1_iris_step_a": [op("kernel")] * 3 + [op("host")] * 2,
        "p6_adam_step_a": [op("kernel")] * 7,
        "held_out": [op("kernel"), op("host")],
    }
    truth = replace(tgt, host_op_s=20e-6, host_dispatch_s=20e-6)
    measured = {n: simulate(ev, truth).total_s for n, ev in events.items()}
    fit = model_vs_gpu.host_fit(events, measured, tgt)
    assert fit["host_op_s"] == pytest.approx(20e-6)
    assert fit["fit_rows"] == ["p1_iris_step_a", "p6_adam_step_a"]
    assert fit["held_out_rows"] == ["held_out"]
    assert fit["fit_median_relative_error"] < 1e-9
    assert fit["held_out_median_relative_error"] < 1e-9
    measured["held_out"] = 2 * measured["held_out"]
    fit = model_vs_gpu.host_fit(events, measured, tgt)
    assert fit["held_out_relative_errors"]["held_out"] == pytest.approx(0.5)
