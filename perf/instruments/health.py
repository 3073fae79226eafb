"""GPU health: is this runner's timer right, and does it reach the speed its GPU should?

Two checks a GPU runner needs before its timings mean anything:

- **Timer accuracy.** ``torch.cuda._sleep(cycles)`` spins a kernel for a known number of GPU
  clock cycles. The clock rate is calibrated from two long sleeps timed with CUDA events (the
  difference cancels fixed costs) before and after each duration; :func:`perf.measure` times
  sleeps of 10 us - 10 ms and each median per-call time is compared with ``cycles / clock``
  under the rule of :mod:`perf.instruments.clock`, which tolerates a DVFS clock step. The
  shortest sleep's excess is the per-call overhead the timer sees (launch gaps).
- **Efficiency against the device's peak.** Achieved matmul TFLOP/s (fp32, tf32, bf16) and
  host-to-device GB/s (pinned, pageable), each also as a fraction of the device's nominal
  peak from :data:`NOMINAL_PEAKS` (unknown devices: absolute figures only). TF32 is switched
  with the current API, ``torch.backends.cuda.matmul.fp32_precision`` (``"tf32"`` /
  ``"ieee"``; :func:`matmul_fp32_precision`), never the deprecated ``allow_tf32``, and the
  previous setting is restored.

Pure helpers (peak lookup, clock conversion, error and goal arithmetic) need no GPU and are
unit-tested on CPU; the ``measure_*`` functions need CUDA.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from perf.instruments.clock import (  # re-exported: the timer check's arithmetic lives there
    TIMER_DURATIONS_S,
    TimerAccuracy,
    check_sleeps,
    clock_hz,
    timer_accuracy,
)
from perf.instruments.timing import DeviceLike, Timing, as_device

__all__ = [
    "NOMINAL_PEAKS",
    "DevicePeaks",
    "Throughput",
    "calibrate_clock",
    "efficiency",
    "matmul_fp32_precision",
    "measure_h2d",
    "measure_matmul",
    "measure_timer_accuracy",
    "nominal_peaks",
]

# --------------------------------------------------------------------------------------------
# nominal peaks


@dataclass(frozen=True)
class DevicePeaks:
    """Dense (no structured sparsity) peak throughputs of one GPU model, from its datasheet."""

    model: str
    fp32_tflops: float  # CUDA-core FP32
    tf32_tflops: float | None  # tensor-core TF32, dense
    bf16_tflops: float | None  # tensor-core BF16, dense
    #: Host link, one direction, theoretical: PCIe Gen3/4/5 x16 = 15.75 / 31.5 / 63.0 GB/s
    #: (datasheets quote both directions together: 32 / 64 / 128 GB/s).
    h2d_gbps: float
    source: str = ""

    def peak(self, kind: str) -> float | None:
        return {
            "fp32": self.fp32_tflops,
            "tf32": self.tf32_tflops,
            "bf16": self.bf16_tflops,
            "h2d": self.h2d_gbps,
        }.get(kind)


_GEN3, _GEN4, _GEN5 = 15.75, 31.5, 63.0

#: (pattern on torch.cuda.get_device_name(), peaks); the first match wins, so more specific
#: names come first. TFLOP/s values are NVIDIA's datasheet figures; where a datasheet only
#: gives "with sparsity" figures for tensor cores, the dense figure is half of it.
NOMINAL_PEAKS: tuple[tuple[str, DevicePeaks], ...] = (
    # H100 datasheet (nvidia.com/en-us/data-center/h100): PCIe 51 / 378 / 756; NVL 60 / 417.5 /
    # 835 (sparse figures halved); SXM5 67 / 494.7 / 989.4. All PCIe Gen5 hosts.
    (r"H100.*PCIe", DevicePeaks("H100 PCIe", 51.0, 378.0, 756.0, _GEN5, "NVIDIA H100 datasheet")),
    (r"H100.*NVL", DevicePeaks("H100 NVL", 60.0, 417.5, 835.0, _GEN5, "NVIDIA H100 datasheet")),
    (r"H100", DevicePeaks("H100 SXM", 67.0, 494.7, 989.4, _GEN5, "NVIDIA H100 datasheet")),
    # GH200 datasheet: H100/H200-class GPU (67 / 494.7 / 989.4) on NVLink-C2C, 900 GB/s both
    # directions together, so the host link is 450 GB/s each way, not PCIe.
    (r"GH200", DevicePeaks("GH200", 67.0, 494.7, 989.4, 450.0, "NVIDIA GH200 datasheet")),
    # H200 datasheet (nvidia.com/en-us/data-center/h200): SXM 67 / 989 / 1979 with sparsity;
    # NVL 60 / 835 / 1671 with sparsity.
    (r"H200.*NVL", DevicePeaks("H200 NVL", 60.0, 417.5, 835.5, _GEN5, "NVIDIA H200 datasheet")),
    (r"H200", DevicePeaks("H200 SXM", 67.0, 494.5, 989.5, _GEN5, "NVIDIA H200 datasheet")),
    # A100 datasheet (nvidia.com/en-us/data-center/a100): 19.5 / 156 / 312, SXM4 and PCIe alike.
    (r"A100", DevicePeaks("A100", 19.5, 156.0, 312.0, _GEN4, "NVIDIA A100 datasheet")),
    # L40S datasheet: 91.6 / 366 / 733 with sparsity.
    (r"L40S", DevicePeaks("L40S", 91.6, 183.0, 366.5, _GEN4, "NVIDIA L40S datasheet")),
    # L4 datasheet: 30.3 / 120 / 242 with sparsity.
    (r"\bL4\b", DevicePeaks("L4", 30.3, 60.0, 121.0, _GEN4, "NVIDIA L4 datasheet")),
    # A10 datasheet: 31.2 / 62.5 / 125 (dense).
    (r"\bA10\b", DevicePeaks("A10", 31.2, 62.5, 125.0, _GEN4, "NVIDIA A10 datasheet")),
    # T4 datasheet: 8.1 FP32; no TF32 or BF16 tensor cores (Turing).
    (r"\bT4\b", DevicePeaks("T4", 8.1, None, None, _GEN3, "NVIDIA T4 datasheet")),
)


def nominal_peaks(device_name: str) -> DevicePeaks | None:
    """The datasheet peaks for a ``torch.cuda.get_device_name()``; None when unknown."""
    for pattern, peaks in NOMINAL_PEAKS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peaks
    return None


def efficiency(achieved: float, peak: float | None) -> float | None:
    """achieved / peak, or None where the peak is unknown."""
    if peak is None or peak <= 0:
        return None
    return achieved / peak


@dataclass(frozen=True)
class Throughput:
    """An achieved rate, with its samples, and where known the fraction of nominal peak."""

    name: str
    unit: str
    samples: tuple[float, ...]
    peak: float | None
    extra: dict[str, float] = field(default_factory=dict)
    #: The raw timing behind the rate (recorded as a time metric, so the gate tracks it).
    timing: Timing | None = None

    @property
    def value(self) -> float:
        from perf.core.stats import median

        return median(self.samples)

    @property
    def fraction_of_peak(self) -> float | None:
        return efficiency(self.value, self.peak)

    @property
    def fraction_samples(self) -> tuple[float, ...]:
        return tuple(s / self.peak for s in self.samples) if self.peak else ()


# --------------------------------------------------------------------------------------------
# measurements (CUDA)


def _require_cuda(device: DeviceLike) -> torch.device:
    d = as_device(device)
    if d.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(
            f"GPU health checks need a CUDA device, got {d} "
            f"(torch.cuda.is_available() is {torch.cuda.is_available()})"
        )
    return d


def _event_time(fn: object, device: torch.device) -> float:
    """Seconds of one call of ``fn`` between two CUDA events on ``device``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        start.record()
        fn()  # type: ignore[operator]
        end.record()
        end.synchronize()
    return start.elapsed_time(end) / 1e3


def calibrate_clock(device: DeviceLike, short_cycles: int = 10_000_000, repeats: int = 5) -> float:
    """GPU clock (Hz) seen by ``torch.cuda._sleep``, from sleeps of N and 10 N cycles."""
    from perf.core.stats import median

    d = _require_cuda(device)
    long_cycles = 10 * short_cycles
    with torch.cuda.device(d):
        torch.cuda._sleep(short_cycles)  # warm: module load, clocks up
        ta = median(
            [_event_time(lambda: torch.cuda._sleep(short_cycles), d) for _ in range(repeats)]
        )
        tb = median(
            [_event_time(lambda: torch.cuda._sleep(long_cycles), d) for _ in range(repeats)]
        )
    return clock_hz(short_cycles, ta, long_cycles, tb)


def measure_timer_accuracy(
    device: DeviceLike, durations_s: Sequence[float] = TIMER_DURATIONS_S
) -> TimerAccuracy:
    """Time known sleeps with :func:`perf.measure`, each between two clock calibrations, and
    compare (the rule: :mod:`perf.instruments.clock`)."""
    import time

    from perf.core.stats import median
    from perf.instruments.timing import Block, measure

    d = _require_cuda(device)

    def time_cycles(cycles: int) -> float:
        return measure(lambda: torch.cuda._sleep(cycles), device=d).median_s

    with torch.cuda.device(d):
        checks = check_sleeps(durations_s, lambda: calibrate_clock(d, repeats=3), time_cycles)
        block = Block(lambda: None, d)
        costs = []
        for _ in range(21):
            t0 = time.perf_counter()
            block(1)
            costs.append(time.perf_counter() - t0)
    return timer_accuracy(checks, median(costs))


@contextlib.contextmanager
def matmul_fp32_precision(precision: str, *, conv: bool = False) -> Iterator[None]:
    """Inside the block, fp32 matmuls (and with ``conv=True`` cuDNN convolutions) run at
    ``precision``: ``"tf32"`` (tensor cores) or ``"ieee"`` (full fp32). The previous settings
    (``"none"`` included: inherit the generic flag) come back afterwards, also on error.

    The current API (torch >= 2.9, ``torch/backends/__init__.py`` and
    ``torch/backends/cuda/__init__.py``: ``fp32_precision`` per backend and op); the
    deprecated ``allow_tf32`` flags are touched only on a torch without it.
    """
    if precision not in ("tf32", "ieee"):
        raise ValueError(f"precision must be 'tf32' or 'ieee', got {precision!r}")
    matmul = torch.backends.cuda.matmul
    # cuDNN's conv precision only when asked (and where this torch has it)
    cudnn_conv: Any = getattr(torch.backends.cudnn, "conv", None) if conv else None
    if not hasattr(matmul, "fp32_precision"):  # torch < 2.9: only the legacy flag exists
        prev_flag = matmul.allow_tf32
        matmul.allow_tf32 = precision == "tf32"
        try:
            yield
        finally:
            matmul.allow_tf32 = prev_flag
        return
    prev = matmul.fp32_precision
    prev_conv = cudnn_conv.fp32_precision if cudnn_conv is not None else None
    matmul.fp32_precision = precision
    try:
        if cudnn_conv is not None:
            cudnn_conv.fp32_precision = precision
        yield
    finally:
        matmul.fp32_precision = prev
        if cudnn_conv is not None:
            cudnn_conv.fp32_precision = prev_conv


MATMUL_KINDS = {
    "fp32": (torch.float32, False),
    "tf32": (torch.float32, True),
    "bf16": (torch.bfloat16, False),
}


def measure_matmul(device: DeviceLike, kind: str, n: int = 8192) -> Throughput:
    """Achieved TFLOP/s of an n x n x n matmul (2 n^3 FLOPs) of ``kind`` fp32 / tf32 / bf16."""
    from perf.instruments.timing import measure

    d = _require_cuda(device)
    dtype, tf32 = MATMUL_KINDS[kind]
    with matmul_fp32_precision("tf32" if tf32 else "ieee"):
        a = torch.randn(n, n, device=d, dtype=dtype)
        b = torch.randn(n, n, device=d, dtype=dtype)
        t = measure(lambda: a @ b, device=d, min_samples=9)
    flops = 2.0 * n**3
    peaks = nominal_peaks(torch.cuda.get_device_name(d))
    return Throughput(
        f"{kind}_matmul",
        "TFLOP/s",
        tuple(flops / s / 1e12 for s in t.samples_s),
        peaks.peak(kind) if peaks else None,
        {"n": float(n)},
        t,
    )


def measure_h2d(device: DeviceLike, pinned: bool, nbytes: int = 256 * 2**20) -> Throughput:
    """Achieved host-to-device GB/s copying ``nbytes`` from pinned or pageable memory."""
    from perf.instruments.timing import measure

    d = _require_cuda(device)
    src = torch.empty(nbytes, dtype=torch.uint8)
    if pinned:
        src = src.pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=d)
    t = measure(lambda: dst.copy_(src, non_blocking=pinned), device=d, min_samples=9)
    peaks = nominal_peaks(torch.cuda.get_device_name(d))
    return Throughput(
        f"{'pinned' if pinned else 'pageable'}_h2d",
        "GB/s",
        tuple(nbytes / s / 1e9 for s in t.samples_s),
        peaks.h2d_gbps if peaks else None,
        {"bytes": float(nbytes)},
        t,
    )
