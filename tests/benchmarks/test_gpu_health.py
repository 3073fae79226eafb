"""GPU runner health: the timer against known GPU sleeps, and matmul / host-to-device
throughput against the device's nominal peak (perf.instruments.health).

Recorded as metrics, so the gate tracks them run to run on the same runner: each raw timing
is a time metric with a 25% margin, so a runner whose bf16 matmul falls to half its usual
speed fails the gate as a broken runner. Absolute efficiencies are hardware facts, recorded,
not asserted; the assertions are properties that hold on any healthy GPU. CUDA only; none of
this has run on a GPU yet.
"""

from __future__ import annotations

import pytest
import torch

from perf.instruments import clock, health

pytestmark = [pytest.mark.perf_cuda, pytest.mark.perf_timing]

#: A runner this much slower than its own baseline is broken, not noisy.
BROKEN_RUNNER_TOLERANCE = 0.25


def test_gpu_timer_accuracy_against_known_sleeps(device: torch.device, perf_metrics) -> None:
    """perf.measure of torch.cuda._sleep(cycles) vs cycles / calibrated clock, 10 us - 10 ms.

    Each duration is bracketed by two clock calibrations and judged at their mean clock, with
    the limit widened by half the bracket's drift (perf.instruments.clock: one DVFS step,
    ~0.75% on an H100, is tolerated; a clock still moving after three tries is not judged).
    Asserted: within 1% (+ drift / 2) from 1 ms up, and a clock-scale error within 0.5%
    (+ drift / 2 of the longest sleep): a timer that misreads events or divides by the wrong
    call count is off by far more. The design goal, 1% from 100 us up, is recorded
    (``timer_goal_met``), not asserted: back-to-back kernels leave launch gaps of about a
    microsecond, i.e. ~1% of a 100 us call, so there the verdict belongs to the hardware.
    """
    acc = health.measure_timer_accuracy(device)
    perf_metrics.record(
        "timer_clock_hz",
        acc.clock_hz,
        "1",
        expected_s=list(acc.expected_s),
        measured_s=list(acc.measured_s),
        errors=list(acc.errors),
        clock_drifts=list(acc.clock_drifts),
    )
    for e, err in zip(acc.expected_s, acc.errors, strict=True):
        perf_metrics.record(f"timer_error_{round(e * 1e6)}us", err, "1")
    perf_metrics.record("timer_overhead_per_call_s", acc.overhead_per_call_s, "1")
    perf_metrics.record("timer_scale_error", acc.scale_error, "1")
    perf_metrics.record("timer_block_host_cost_s", acc.block_host_cost_s, "1")
    perf_metrics.record("timer_max_clock_drift", max(acc.clock_drifts), "1")
    perf_metrics.record("timer_goal_met", int(acc.goal_met), "1", goal=acc.goal)
    judged = [
        (e, abs(r), lim)
        for e, r, lim, ok in zip(
            acc.expected_s, acc.errors, acc.allowed(0.01), acc.clock_stable, strict=True
        )
        if e >= 1e-3 and ok
    ]
    if len(judged) < sum(e >= 1e-3 for e in acc.expected_s) or not acc.clock_stable[-1]:
        pytest.skip(
            f"the GPU clock kept moving (calibration drifts {acc.clock_drifts}, more than two "
            "DVFS steps after 3 tries): lock it (nvidia-smi -lgc) to judge the timer"
        )
    assert all(err <= lim for _, err, lim in judged), acc
    assert abs(acc.scale_error) <= clock.allowed_error(0.005, acc.clock_drifts[-1]), acc


def _record_throughput(perf_metrics, th: health.Throughput) -> None:
    unit = th.unit.replace("/", "_per_").replace("GB", "gb").replace("TFLOP", "tflop")
    perf_metrics.record(f"{th.name}_{unit}", th.value, "1", nominal_peak=th.peak, **th.extra)
    if th.fraction_of_peak is not None:
        perf_metrics.record(f"{th.name}_fraction_of_peak", th.fraction_of_peak, "1")
    assert th.timing is not None
    perf_metrics.record(f"{th.name}_time_s", th.timing, tolerance=BROKEN_RUNNER_TOLERANCE)


def test_gpu_matmul_throughput_against_peak(device: torch.device, perf_metrics) -> None:
    """8192^3 matmuls, fp32 / tf32 / bf16 where the GPU has them. Asserted: no figure above
    the datasheet peak (that would mean a wrong timer or a wrong table) and, on tensor-core
    GPUs (capability >= 8.0), bf16 at least twice fp32 (datasheets: 4x on L4 to 15x on H100)."""
    cap = torch.cuda.get_device_capability(device)
    kinds = ["fp32"] + (["tf32", "bf16"] if cap >= (8, 0) else [])
    got = {}
    for kind in kinds:
        th = health.measure_matmul(device, kind)
        _record_throughput(perf_metrics, th)
        got[kind] = th
        if th.fraction_of_peak is not None:
            assert th.fraction_of_peak <= 1.0, (kind, th.value, th.peak)
    if "bf16" in got:
        assert got["bf16"].value >= 2 * got["fp32"].value, {k: v.value for k, v in got.items()}


def test_gpu_h2d_throughput_against_peak(device: torch.device, perf_metrics) -> None:
    """256 MiB host-to-device copies from pinned and pageable memory. Asserted: neither above
    the link's theoretical rate (a wrong timer or table otherwise)."""
    for pinned in (True, False):
        th = health.measure_h2d(device, pinned)
        _record_throughput(perf_metrics, th)
        if th.fraction_of_peak is not None:
            assert th.fraction_of_peak <= 1.0, (th.name, th.value, th.peak)
