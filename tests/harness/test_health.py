"""perf.instruments.health's pure parts on CPU: the peak table, clock conversion, timer-error
arithmetic.
The measurements themselves run in tests/benchmarks/test_gpu_health.py on a GPU."""

from __future__ import annotations

import pytest

from perf.instruments import clock, health


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
    assert clock.clock_hz(10**7, t(10**7), 10**8, t(10**8)) == pytest.approx(hz, rel=1e-12)
    with pytest.raises(ValueError, match="different length"):
        clock.clock_hz(10, 1.0, 10, 2.0)
    with pytest.raises(ValueError, match="longer sleep took less time"):
        clock.clock_hz(10, 2.0, 20, 1.0)


def test_cycles_for_and_relative_errors() -> None:
    assert clock.cycles_for(100e-6, 1.5e9) == 150_000
    assert clock.cycles_for(1e-12, 1.5e9) == 1
    assert clock.relative_errors([1.0, 2.0], [1.01, 1.98]) == pytest.approx([0.01, -0.01])
    with pytest.raises(ValueError):
        clock.relative_errors([1.0], [1.0, 2.0])


def test_goal_is_judged_from_100_us_up() -> None:
    durations = [10e-6, 100e-6, 1e-3]
    assert clock.goal_met(durations, [0.10, 0.009, 0.001])  # 10 us is outside the goal
    assert not clock.goal_met(durations, [0.0, 0.011, 0.0])
    assert not clock.goal_met(durations, [0.0, 0.0, -0.02])
    with pytest.raises(ValueError, match="no duration"):
        clock.goal_met([10e-6], [0.0])


def test_overhead_and_scale_recover_a_planted_gap_and_clock_error() -> None:
    gap, scale = 1.2e-6, 0.003
    expected = list(clock.TIMER_DURATIONS_S)
    measured = [e * (1 + scale) + gap for e in expected]
    overhead, found = clock.overhead_and_scale(expected, measured)
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


class _FakeGpu:
    """A GPU whose SM clock steps at chosen calls: calibrate() reads the clock of the moment,
    time_cycles(c) runs a sleep at it (plus a fixed launch gap)."""

    def __init__(self, clocks_hz: list[float], gap_s: float = 1e-6) -> None:
        self.clocks = clocks_hz  # the clock during the i-th call (calibrate or sleep)
        self.i = 0
        self.gap = gap_s

    def _now(self) -> float:
        hz = self.clocks[min(self.i, len(self.clocks) - 1)]
        self.i += 1
        return hz

    def calibrate(self) -> float:
        return self._now()

    def time_cycles(self, cycles: int) -> float:
        return cycles / self._now() + self.gap


H100_HZ, STEP_HZ = 1.98e9, 15e6  # one DVFS step: 15 MHz, 0.76% at 1980 MHz


def test_one_dvfs_step_fails_a_single_calibration_but_not_the_bracket_rule() -> None:
    durations = list(clock.TIMER_DURATIONS_S)
    # the clock steps down once, right after the first calibration, and stays there
    clocks = [H100_HZ] + [H100_HZ - STEP_HZ] * 100
    # the old rule: one calibration, every sleep judged at it -> a 0.76% "scale error"
    gpu = _FakeGpu(clocks)
    hz0 = gpu.calibrate()
    cycles = [clock.cycles_for(s, hz0) for s in durations]
    measured = [gpu.time_cycles(c) for c in cycles]
    _, scale_old = clock.overhead_and_scale([c / hz0 for c in cycles], measured)
    assert abs(scale_old) > 0.005  # the flake the rule removes
    # the rule: a bracket per duration, judged at its mean clock, limit widened by drift / 2
    gpu = _FakeGpu(clocks)
    checks = clock.check_sleeps(durations, gpu.calibrate, gpu.time_cycles)
    acc = clock.timer_accuracy(checks, block_host_cost_s=1e-5)
    assert acc.clock_drifts[0] == pytest.approx(STEP_HZ / (H100_HZ - STEP_HZ / 2))
    assert all(d == 0.0 for d in acc.clock_drifts[1:]) and all(acc.clock_stable)
    assert abs(acc.scale_error) <= clock.allowed_error(0.005, acc.clock_drifts[-1])
    limits = zip(acc.errors, acc.allowed(0.01), durations, strict=True)
    long = [abs(e) <= lim for e, lim, d in limits if d >= 1e-3]
    assert all(long)
    assert acc.overhead_per_call_s == pytest.approx(1e-6, rel=0.05)


def test_a_step_inside_the_longest_bracket_is_within_half_its_drift() -> None:
    durations = [10e-6, 10e-3]
    # calibrate, sleep 10 us, calibrate, [step] sleep 10 ms at the lower clock, calibrate
    clocks = [H100_HZ, H100_HZ, H100_HZ, H100_HZ - STEP_HZ, H100_HZ - STEP_HZ]
    gpu = _FakeGpu(clocks)
    acc = clock.timer_accuracy(clock.check_sleeps(durations, gpu.calibrate, gpu.time_cycles), 0)
    assert acc.clock_drifts[-1] > 0.007 and acc.clock_stable[-1]
    assert abs(acc.scale_error) > 0.003  # the step shows up ...
    assert abs(acc.scale_error) <= clock.allowed_error(0.005, acc.clock_drifts[-1])  # ... allowed


def test_a_clock_that_keeps_moving_is_measured_again_then_reported_unstable() -> None:
    # two steps down at every call: each bracket drifts ~3%, more than MAX_CLOCK_DRIFT
    clocks = [H100_HZ - 2 * STEP_HZ * i for i in range(40)]
    gpu = _FakeGpu(clocks)
    checks = clock.check_sleeps([1e-3], gpu.calibrate, gpu.time_cycles, attempts=3)
    assert checks[0].attempts == 3 and not checks[0].stable
    # a clock that settles on the second try is kept from that try
    low = H100_HZ - 8 * STEP_HZ
    gpu = _FakeGpu([H100_HZ, H100_HZ - 4 * STEP_HZ, low, low, low])  # cal, sleep, cal, ...
    (c,) = clock.check_sleeps([1e-3], gpu.calibrate, gpu.time_cycles)
    assert c.attempts == 2 and c.stable and c.hz_before == c.hz_after == low


def test_allowed_error_widens_by_half_the_drift() -> None:
    assert clock.allowed_error(0.01, 0.0) == 0.01
    assert clock.allowed_error(0.01, 0.0076) == pytest.approx(0.0138)
    assert clock.goal_met([1e-3], [0.012], drifts=[0.0076])
    assert not clock.goal_met([1e-3], [0.012])


def test_matmul_fp32_precision_uses_the_current_api_and_restores() -> None:
    import torch

    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before, conv_before = matmul.fp32_precision, conv.fp32_precision
    with health.matmul_fp32_precision("tf32"):
        assert matmul.fp32_precision == "tf32"
        assert conv.fp32_precision == conv_before  # conv untouched unless asked
    assert matmul.fp32_precision == before
    with pytest.raises(RuntimeError, match="boom"), health.matmul_fp32_precision("ieee", conv=True):
        assert (matmul.fp32_precision, conv.fp32_precision) == ("ieee", "ieee")
        raise RuntimeError("boom")
    assert (matmul.fp32_precision, conv.fp32_precision) == (before, conv_before)
    with pytest.raises(ValueError, match="'tf32' or 'ieee'"), health.matmul_fp32_precision("x"):
        pass
