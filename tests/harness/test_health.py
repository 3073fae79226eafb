"""perf.instruments.health's pure parts on CPU: the peak table, clock conversion, timer-error
arithmetic.
The measurements themselves run in tests/benchmarks/test_gpu_health.py on a GPU."""

from __future__ import annotations

import pytest

from perf.instruments import health


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10", "A10"),
        ("Tesla T4", "T4"),
    ],
)
def test_nominal_peaks_by_torch_device_name(name: str, model: str) -> None:
    peaks = health.nominal_peaks(name)
    assert peaks is not None and peaks.model == model


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA GeForce RTX 4090", "AMD Instinct MI300X"])
def test_unknown_devices_have_no_peak_and_report_absolute_only(name: str) -> None:
    assert health.nominal_peaks(name) is None
    assert health.efficiency(100.0, None) is None


def test_peak_table_is_consistent() -> None:
    for _, p in health.NOMINAL_PEAKS:
        assert p.source and p.fp32_tflops > 0 and p.h2d_gbps > 0
        if p.tf32_tflops is not None and p.bf16_tflops is not None:
            # dense tensor-core figures: bf16 is twice tf32, and both far above CUDA-core fp32
            assert p.bf16_tflops == pytest.approx(2 * p.tf32_tflops, rel=0.01), p
            assert p.tf32_tflops > p.fp32_tflops, p
    assert health.nominal_peaks("NVIDIA H100 80GB HBM3").peak("bf16") == 989.4  # type: ignore[union-attr]
    assert health.nominal_peaks("Tesla T4").peak("bf16") is None  # type: ignore[union-attr]


def test_clock_from_two_sleeps_cancels_fixed_costs() -> None:
    hz, fixed = 1.755e9, 7e-6
    t = lambda c: c / hz + fixed  # noqa: E731
    assert health.clock_hz(10**7, t(10**7), 10**8, t(10**8)) == pytest.approx(hz, rel=1e-12)
    with pytest.raises(ValueError, match="different length"):
        health.clock_hz(10, 1.0, 10, 2.0)
    with pytest.raises(ValueError, match="longer sleep took less time"):
        health.clock_hz(10, 2.0, 20, 1.0)


def test_cycles_for_and_relative_errors() -> None:
    assert health.cycles_for(100e-6, 1.5e9) == 150_000
    assert health.cycles_for(1e-12, 1.5e9) == 1
    assert health.relative_errors([1.0, 2.0], [1.01, 1.98]) == pytest.approx([0.01, -0.01])
    with pytest.raises(ValueError):
        health.relative_errors([1.0], [1.0, 2.0])


def test_goal_is_judged_from_100_us_up() -> None:
    durations = [10e-6, 100e-6, 1e-3]
    assert health.goal_met(durations, [0.10, 0.009, 0.001])  # 10 us is outside the goal
    assert not health.goal_met(durations, [0.0, 0.011, 0.0])
    assert not health.goal_met(durations, [0.0, 0.0, -0.02])
    with pytest.raises(ValueError, match="no duration"):
        health.goal_met([10e-6], [0.0])


def test_overhead_and_scale_recover_a_planted_gap_and_clock_error() -> None:
    gap, scale = 1.2e-6, 0.003
    expected = list(health.TIMER_DURATIONS_S)
    measured = [e * (1 + scale) + gap for e in expected]
    overhead, found = health.overhead_and_scale(expected, measured)
    assert overhead == pytest.approx(gap + 10e-6 * scale)
    assert found == pytest.approx(scale, abs=1e-5)


def test_throughput_fraction_of_peak() -> None:
    th = health.Throughput("bf16_matmul", "TFLOP/s", (600.0, 620.0, 610.0), 989.4)
    assert th.value == 610.0
    assert th.fraction_of_peak == pytest.approx(610.0 / 989.4)
    assert th.fraction_samples[0] == pytest.approx(600.0 / 989.4)
    assert health.Throughput("x", "GB/s", (1.0,), None).fraction_of_peak is None


@pytest.mark.parametrize(
    "call",
    [
        lambda: health.measure_matmul("cpu", "fp32"),
        lambda: health.measure_h2d("cpu", pinned=True),
        lambda: health.measure_timer_accuracy("cpu"),
    ],
)
def test_measurements_refuse_a_non_cuda_device_clearly(call) -> None:
    with pytest.raises(ValueError, match="need a CUDA device, got cpu"):
        call()
