"""Device-correct timing: warm-up, autorange, raw samples, and paired A/B comparison.

On CUDA, kernels run asynchronously: reading a host clock after launching them measures the
launch, not the work. A sample here is a block of ``number`` calls between two CUDA events (or,
on the CPU, two ``perf_counter`` reads), with the device drained before the block starts and
after it ends — never a synchronisation per call, which would time the sync instead of a tiny
kernel.

It is one piece (over 400 lines) because the paired comparison's honesty depends on how blocks
are sized and ordered (equal-duration blocks, balanced random order, re-sizing from the fastest
call seen): the timer, the block sizing and :class:`Comparison`'s verdict are read together.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from perf.core import contention, stats
from perf.core.verdicts import Reason, TimedVerdict, judge
from perf.instruments import trace

if TYPE_CHECKING:
    import torch

# "torch.device" as a forward reference: torch is imported lazily (see _is_cpu)
DeviceLike = Union[str, "torch.device", None]


def _is_cpu(device: DeviceLike) -> bool:
    """The host, named without torch: timing a Python function never needs torch imported
    (each child process of an interleaved gate that times one is ~1 s faster to start)."""
    return device is None or (isinstance(device, str) and device == "cpu")


def as_device(device: DeviceLike) -> torch.device:
    import torch

    return torch.device("cpu") if device is None else torch.device(device)


def synchronize(device: DeviceLike) -> None:
    """Wait for all queued work on ``device`` (a no-op on the CPU)."""
    if _is_cpu(device):
        return
    import torch

    d = as_device(device)
    if d.type == "cuda":
        torch.cuda.synchronize(d)
    elif d.type == "mps":
        torch.mps.synchronize()
    elif d.type == "xpu":
        torch.xpu.synchronize(d)


@dataclass(frozen=True)
class Timing:
    """Raw timing samples of one function. Each sample is seconds *per call*."""

    samples_s: tuple[float, ...]
    number: int
    device: str
    label: str = ""
    #: Samples judged preempted: slower than :data:`PREEMPTED_FACTOR` x the run's 10th
    #: percentile (a time slice lost to another process adds, never removes, time).
    preempted: int = 0
    #: Other processes' share of the machine's CPUs while measuring (None: unknown, not
    #: Linux), from :mod:`perf.core.contention`.
    others_cpu_fraction: float | None = None

    @property
    def median_s(self) -> float:
        return stats.median(self.samples_s)

    @property
    def mean_s(self) -> float:
        return sum(self.samples_s) / len(self.samples_s)

    @property
    def iqr_s(self) -> float:
        return stats.iqr(self.samples_s)

    @property
    def min_s(self) -> float:
        return min(self.samples_s)

    def ci(self, confidence: float = 0.95) -> tuple[float, float]:
        """Distribution-free interval of the median per-call time."""
        return stats.median_ci(self.samples_s, confidence)

    def __str__(self) -> str:
        text = (
            f"{self.label or 'fn'} on {self.device}: median {_fmt_s(self.median_s)} "
            f"(IQR {_fmt_s(self.iqr_s)}, {len(self.samples_s)} samples x {self.number} calls"
        )
        if self.preempted:
            text += f", {self.preempted} judged preempted"
        return text + ")"


#: A sample slower than this factor of its run's 10th percentile is counted as preempted.
PREEMPTED_FACTOR = 1.5


def preempted_count(samples: tuple[float, ...]) -> int:
    """How many samples look preempted (:data:`PREEMPTED_FACTOR` x the 10th percentile)."""
    if len(samples) < 3:
        return 0
    xs = sorted(samples)
    low = xs[int(0.1 * (len(xs) - 1))]
    return sum(x > PREEMPTED_FACTOR * low for x in xs)


@dataclass(frozen=True)
class Decision:
    """Whether a claim about a comparison holds: True, False, or None when the run cannot say."""

    holds: bool | None
    claim: str
    reason: str
    #: Why, as data: ``INTERVAL`` (decided), ``STRADDLES`` (the interval contains the
    #: threshold) or ``NO_INTERVAL`` (an inconclusive comparison). Never parse ``reason``.
    code: Reason = Reason.INTERVAL

    @property
    def decided(self) -> bool:
        return self.holds is not None


@dataclass(frozen=True)
class Comparison:
    """A and B timed interleaved in one process; ``ratio`` is time_a / time_b.

    ``ratios`` holds one ratio per interleaved pair, so slow drift of the machine (a neighbour
    starting a job, thermal throttling) hits A and B alike and cancels in each ratio. The pairs
    need not be independent on a loaded runner, so ``ci``, ``verdict`` and ``reason`` come from
    :func:`perf.core.stats.paired_ratio_verdict`: ``ok``, ``widened`` (dependent pairs, batch
    interval) or ``inconclusive`` (``ci`` is then (-inf, inf) and every claim is undecided).
    """

    a: Timing
    b: Timing
    ratios: tuple[float, ...]
    confidence: float
    #: per pair, True when A ran first (empty when unknown)
    a_first: tuple[bool, ...] = ()
    #: share of the machine's CPU that other processes used during the run (None: unknown)
    others_cpu_fraction: float | None = None
    ci: tuple[float, float] = field(init=False)
    #: the binomial interval of the median, right only for independent pairs
    iid_ci: tuple[float, float] = field(init=False)
    verdict: str = field(init=False)
    reason: str = field(init=False)
    dependence: stats.Dependence | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        orders = self.a_first if len(self.a_first) == len(self.ratios) else None
        try:
            v = stats.paired_ratio_verdict(self.ratios, self.confidence, orders)
        except ValueError as e:
            inf = (-math.inf, math.inf)
            for k, val in (
                ("ci", inf),
                ("iid_ci", inf),
                ("verdict", stats.VERDICT_INCONCLUSIVE),
                ("reason", str(e)),
                ("dependence", None),
            ):
                object.__setattr__(self, k, val)
            return
        reason = v.reason
        if reason and self.others_cpu_fraction is not None:
            reason += f"; other processes used {self.others_cpu_fraction:.0%} of the CPUs"
        object.__setattr__(self, "ci", v.ci)
        object.__setattr__(self, "iid_ci", v.iid_ci)
        object.__setattr__(self, "verdict", v.verdict)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "dependence", v.dependence)

    @property
    def ratio(self) -> float:
        return stats.median(self.ratios)

    @property
    def conclusive(self) -> bool:
        return self.verdict != stats.VERDICT_INCONCLUSIVE

    @property
    def speedup(self) -> float:
        """How many times faster B is than A (``1 / ratio``)."""
        return 1.0 / self.ratio

    def a_slower(self, by: float = 1.0) -> bool:
        """True when A is slower than B by more than ``by``x with confidence."""
        return self.decide_a_slower(by).holds is True

    def b_slower(self, by: float = 1.0) -> bool:
        """True when B is slower than A by more than ``by``x with confidence."""
        return self.decide_b_slower(by).holds is True

    def decide_a_slower(self, by: float = 1.0) -> Decision:
        """ "A is slower than B by more than ``by``x": True / False with confidence, else None.

        None (undecided) when the verdict is inconclusive or the interval contains ``by``: a
        test should then skip with ``reason``, not fail, because the run cannot tell.
        """
        return self._decide(
            by, f"{self.a.label or 'A'} slower than {self.b.label or 'B'} by more than {by:g}x"
        )

    def decide_b_slower(self, by: float = 1.0) -> Decision:
        """ "B slower than A by more than ``by``x" (ratio < ``1/by``), as ``decide_a_slower``."""
        d = self._decide(1.0 / by, "")
        holds = None if d.holds is None else not d.holds
        claim = f"{self.b.label or 'B'} slower than {self.a.label or 'A'} by more than {by:g}x"
        if holds is None:
            return Decision(None, claim, d.reason, d.code)
        return Decision(holds, claim, f"{'' if holds else 'not: '}{self}")

    def _decide(self, by: float, claim: str) -> Decision:
        if by <= 0:
            raise ValueError(f"by must be > 0, got {by}")
        lo, hi = self.ci
        if not self.conclusive:
            return Decision(
                None, claim, f"inconclusive: {self.reason}; measured {self}", Reason.NO_INTERVAL
            )
        if lo > by:
            return Decision(True, claim, str(self))
        if hi <= by:
            return Decision(False, claim, f"not: {self}")
        return Decision(
            None,
            claim,
            f"the {self.confidence:.0%} interval contains {by:g}: {self}",
            Reason.STRADDLES,
        )

    def judge(self, margin: float = 0.10, *, higher_is_better: bool = False) -> TimedVerdict:
        """The four verdicts (:mod:`perf.core.verdicts`) on A/B against ``margin``:
        ``regression`` (A slower beyond the margin, or slower in speed-up terms when
        ``higher_is_better``), ``improvement``, ``unchanged`` (the interval inside the margin
        both ways) or ``undecided`` (the interval straddles it, or there is none)."""
        if not self.conclusive:  # no interval: undecided, NO_INTERVAL
            return judge(
                self.ratio, None, margin, higher_is_better=higher_is_better, detail=self.reason
            )
        return judge(
            self.ratio, self.ci, margin, higher_is_better=higher_is_better, detail=str(self)
        )

    def __str__(self) -> str:
        lo, hi = self.ci
        text = (
            f"{self.a.label or 'A'} / {self.b.label or 'B'} = {self.ratio:.3f}x "
            f"[{lo:.3f}, {hi:.3f}] at {self.confidence:.0%} ({len(self.ratios)} pairs)"
        )
        if self.verdict != stats.VERDICT_OK:
            text += f", {self.verdict}: {self.reason}"
        return text


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.2f} us"


class Block:
    """Times ``number`` calls of ``fn`` on one device, correctly for that device."""

    def __init__(self, fn: Callable[[], Any], device: DeviceLike) -> None:
        self.fn = fn
        self.device: str | torch.device = "cpu" if _is_cpu(device) else as_device(device)
        self.cuda = not isinstance(self.device, str) and self.device.type == "cuda"
        if self.cuda:
            import torch

            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def __call__(self, number: int) -> float:
        """Seconds for the whole block of ``number`` calls."""
        fn = self.fn
        if self.cuda:
            import torch

            with torch.cuda.device(self.device):
                torch.cuda.synchronize()
                self._start.record()
                for _ in range(number):
                    fn()
                self._end.record()
                self._end.synchronize()
                return self._start.elapsed_time(self._end) / 1e3
        synchronize(self.device)
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        synchronize(self.device)
        return time.perf_counter() - t0


def _autorange(block: Block, min_sample_time_s: float, max_number: int = 1_000_000) -> int:
    """Smallest number of calls in 1, 2, 5, 10, 20, 50, ... whose block lasts min_sample_time_s."""
    number = 1
    while True:
        for mult in (1, 2, 5):
            n = number * mult
            if block(n) >= min_sample_time_s or n >= max_number:
                return n
        number *= 10


def _calls_for(
    block: Block, target_s: float, trials: int = 7, max_number: int = 1_000_000
) -> tuple[int, float]:
    """Calls per block so that one block lasts about ``target_s`` on an *unloaded* CPU, and
    the fastest per-call time seen.

    :func:`_autorange` stops at the first block that lasts long enough, and on a loaded box
    a block that was preempted lasts long enough with far fewer calls: measured on a 2-core
    VM at load ~7, the same function got 5 calls per block as A and 200 as B. The short block
    is rarely preempted and the long one often, so an A/A ratio came out 0.07x-0.5x with a
    tight interval. Here the per-call time is the fastest of a few short blocks, so both sides
    of a comparison get blocks of the same duration and the same chance of being preempted.
    """
    n = _autorange(block, target_s / 10.0, max_number)
    if n == 1:
        t1 = block(1)
        if t1 >= target_s:
            return 1, t1  # one call already fills a block
    # short probes (a tenth of a block) are rarely preempted; the fastest is the CPU's speed
    per_call = min(block(n) / n for _ in range(trials))
    return _number(target_s, per_call, max_number), per_call


def _number(target_s: float, per_call_s: float, max_number: int = 1_000_000) -> int:
    if per_call_s <= 0.0:
        return max_number
    return int(min(max(1, round(target_s / per_call_s)), max_number))


def _warmup(block: Block, warmup: int, warmup_time_s: float) -> None:
    t_end = time.perf_counter() + warmup_time_s
    for _ in range(max(1, warmup)):
        block(1)
    while time.perf_counter() < t_end:
        block(1)


#: Environment variable perf sets in the children of an interleaved verdict
#: (:mod:`perf.gate.against`): :func:`measure` then runs that many times longer (and takes that many
#: times more samples), so a child's low quantile sees the machine at its fastest state even
#: when the machine's speed flips every second (measured on the dev VM).
MEASURE_SCALE_ENV = "PERF_MEASURE_SCALE"


def measure_scale() -> float:
    """:data:`MEASURE_SCALE_ENV` as a factor >= 1 (1 when unset or not a number)."""
    import os

    try:
        return max(1.0, float(os.environ.get(MEASURE_SCALE_ENV, "1")))
    except ValueError:
        return 1.0


def measure(
    fn: Callable[[], Any],
    *,
    device: DeviceLike = None,
    warmup: int = 2,
    warmup_time_s: float = 0.0,
    number: int | None = None,
    min_sample_time_s: float = 0.01,
    samples: int | None = None,
    min_samples: int = 7,
    max_samples: int = 200,
    min_run_time_s: float = 0.2,
    label: str = "",
) -> Timing:
    """Time ``fn()`` on ``device`` and return every sample (seconds per call).

    Warm-up first (at least ``warmup`` calls and ``warmup_time_s``), then autorange: each sample
    is a block of ``number`` calls lasting at least ``min_sample_time_s``. Samples are taken
    until both ``min_samples`` and ``min_run_time_s`` are reached (or exactly ``samples``).
    In a child of an interleaved verdict the run time and sample counts are scaled by
    :func:`measure_scale` (both sides alike).
    """
    scale = measure_scale()
    if scale > 1.0:
        min_run_time_s *= scale
        max_samples = math.ceil(max_samples * scale)
        if samples is not None:
            samples = math.ceil(samples * scale)
    block = Block(fn, device)
    trace.remember([trace.MeasuredCall(label or "measured", fn, str(block.device))])
    _warmup(block, warmup, warmup_time_s)
    snap0 = contention.snapshot()
    if number is None:
        number = _autorange(block, min_sample_time_s)
    if number < 1:
        raise ValueError(f"number must be >= 1, got {number}")
    out: list[float] = []
    t_end = time.perf_counter() + min_run_time_s
    while True:
        out.append(block(number) / number)
        if samples is not None:
            if len(out) >= samples:
                break
        elif (len(out) >= min_samples and time.perf_counter() >= t_end) or len(out) >= max_samples:
            break
    snap1 = contention.snapshot()
    others = None if snap0 is None or snap1 is None else contention.share(snap0, snap1)
    samples_t = tuple(out)
    return Timing(
        samples_t,
        number,
        str(block.device),
        label,
        preempted_count(samples_t),
        None if others is None else others.others_fraction,
    )


def compare(
    fn_a: Callable[[], Any],
    fn_b: Callable[[], Any],
    *,
    device: DeviceLike = None,
    device_a: DeviceLike = None,
    device_b: DeviceLike = None,
    pairs: int = 21,
    confidence: float = 0.95,
    warmup: int = 2,
    min_sample_time_s: float = 0.01,
    min_run_time_s: float = 0.0,
    max_pairs: int = 400,
    labels: tuple[str, str] = ("A", "B"),
    order_seed: int = 0,
) -> Comparison:
    """Time A and B interleaved (A B, B A, ...) and return the paired ratio time_a/time_b.

    A and B may run on different devices (``device_a="cpu", device_b="cuda"``); each block is
    timed correctly for its own device. Each side gets its own autoranged ``number`` so a fast
    and a slow function are both timed well above clock resolution. Every two pairs hold one
    A-first and one B-first pair, in a random order (seeded by ``order_seed``), so neither side
    always runs second (warm caches, turbo states) and no neighbour's rhythm locks onto ours.
    The result's ``verdict`` says whether the pairs allowed a trustworthy interval.
    """
    if pairs < 8:
        raise ValueError(
            f"compare needs at least 8 pairs (4 batches of one A-first and one B-first pair) "
            f"for an interval; got pairs={pairs}"
        )
    da = device_a if device_a is not None else device
    db = device_b if device_b is not None else device
    block_a, block_b = Block(fn_a, da), Block(fn_b, db)
    trace.remember(
        [
            trace.MeasuredCall(labels[0], fn_a, str(block_a.device)),
            trace.MeasuredCall(labels[1], fn_b, str(block_b.device)),
        ]
    )
    _warmup(block_a, warmup, 0.0)
    _warmup(block_b, warmup, 0.0)
    na, best_a = _calls_for(block_a, min_sample_time_s)
    nb, best_b = _calls_for(block_b, min_sample_time_s)
    sa: list[float] = []
    sb: list[float] = []
    a_first: list[bool] = []
    # Each two consecutive pairs run once A-first and once B-first, in a seeded random order:
    # a strict A B, B A rhythm can lock onto a periodic neighbour's; a random one cannot.
    rng = random.Random(order_seed)
    snap0 = contention.snapshot()
    t_end = time.perf_counter() + min_run_time_s
    i = 0
    first = True
    while (i < pairs or time.perf_counter() < t_end) and i < max_pairs:
        first = rng.random() < 0.5 if i % 2 == 0 else not first
        if first:
            ta = block_a(na) / na
            tb = block_b(nb) / nb
        else:
            tb = block_b(nb) / nb
            ta = block_a(na) / na
        sa.append(ta)
        sb.append(tb)
        a_first.append(first)
        i += 1
        # re-size the blocks from the fastest per-call time seen so far: a side whose probes
        # were all slowed gets longer blocks once it runs fast, so both keep equal durations
        if ta < best_a:
            best_a, na = ta, _number(min_sample_time_s, ta)
        if tb < best_b:
            best_b, nb = tb, _number(min_sample_time_s, tb)
    snap1 = contention.snapshot()
    others = None if snap0 is None or snap1 is None else contention.share(snap0, snap1)
    ratios = tuple(x / y for x, y in zip(sa, sb, strict=True))
    return Comparison(
        a=Timing(tuple(sa), na, str(block_a.device), labels[0]),
        b=Timing(tuple(sb), nb, str(block_b.device), labels[1]),
        ratios=ratios,
        confidence=confidence,
        a_first=tuple(a_first),
        others_cpu_fraction=None if others is None else others.others_fraction,
    )
