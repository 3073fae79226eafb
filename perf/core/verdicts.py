"""The four verdicts of a timed comparison, one vocabulary for every gate.

A timing comparison ends as exactly one of:

- ``regression``: the whole interval of the ratio (lower-is-better terms) lies beyond
  ``1 + margin``;
- ``improvement``: the whole interval lies below ``1 / (1 + margin)``;
- ``unchanged``: the whole interval lies inside ``[1 / (1 + margin), 1 + margin]``. This is a
  claim of *equivalence* (two one-sided tests), so it needs evidence: a wide interval is not
  "unchanged";
- ``undecided``: anything else, with the reason as a :class:`Reason` code, never as text that
  a caller would have to parse.

The stored gate (:mod:`perf.gate.kinds`), the interleaved gate (:mod:`perf.gate.paired`),
``perf.compare`` (:class:`perf.instruments.timing.Comparison`) and the suite's ``decide_*``
helpers all build a :class:`TimedVerdict` with :func:`classify`. Pure: no I/O.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class Verdict(str, enum.Enum):
    """The outcome of a timed comparison. A ``str`` so it compares equal to its name."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    UNCHANGED = "unchanged"
    UNDECIDED = "undecided"

    def __str__(self) -> str:
        return self.value


class Reason(str, enum.Enum):
    """Why a verdict is what it is: data that gates and reports branch on."""

    #: the interval lies wholly beyond, below or inside the margin
    INTERVAL = "interval"
    #: the interval leaves the margin band on one side without clearing it
    STRADDLES = "straddles the margin"
    #: no interval could be formed (too few samples or pairs, dependent pairs)
    NO_INTERVAL = "no interval"
    #: other processes used the CPUs while one of the runs measured
    MACHINE_BUSY = "machine busy"
    #: the reference workload moved beyond its band: the machine is not in the same state
    REFERENCE_MOVED = "reference moved"
    #: the code is not slower (interleaved), the run is: the machine or environment changed
    ENVIRONMENT = "machine or environment"
    #: the interleaved re-measurement ran out of its time budget
    BUDGET_SPENT = "budget spent"
    #: the two runs cannot be compared (fingerprint, xdist)
    NOT_COMPARABLE = "not comparable"
    #: one side did not measure the metric (the test failed or did not record it)
    NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class TimedVerdict:
    """A timed comparison's verdict with its evidence.

    ``ratio`` and the interval are in the orientation printed beside them (new/old, or
    A/B for ``perf.compare``); ``higher_is_better`` says which way is worse. The interval is
    always ordered (``ci_low <= ci_high``), or absent (both None) when there is none.
    """

    verdict: Verdict
    reason: Reason
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    margin: float
    higher_is_better: bool = False
    #: what a person reads after the verdict (the numbers behind it)
    detail: str = ""

    def __post_init__(self) -> None:
        if (self.ci_low is None) != (self.ci_high is None):
            raise ValueError("an interval needs both ends")
        if self.ci_low is not None and self.ci_high is not None and self.ci_low > self.ci_high:
            raise ValueError(f"interval not ordered: [{self.ci_low}, {self.ci_high}]")

    @property
    def ci(self) -> tuple[float, float] | None:
        if self.ci_low is None or self.ci_high is None:
            return None
        return (self.ci_low, self.ci_high)

    @property
    def decided(self) -> bool:
        return self.verdict is not Verdict.UNDECIDED

    def text(self) -> str:
        """``"undecided (straddles the margin): 1.180x [0.950, 1.470] against a 10% margin"``."""
        head = str(self.verdict)
        if self.reason is not Reason.INTERVAL:
            head += f" ({self.reason.value})"
        nums = ""
        if self.ratio is not None:
            nums = f"{self.ratio:.3f}x"
            if self.ci is not None:
                nums += f" {interval_text(self.ci)}"
            nums += f" against a {self.margin:.0%} margin"
        tail = "; ".join(t for t in (nums, self.detail) if t)
        return f"{head}: {tail}" if tail else head


def ordered(lo: float, hi: float) -> tuple[float, float]:
    """``(min, max)``: an interval printed beside a ratio is always low first."""
    return (lo, hi) if lo <= hi else (hi, lo)


def interval_text(ci: tuple[float, float]) -> str:
    lo, hi = ordered(*ci)
    return f"[{lo:.3f}, {hi:.3f}]"


def classify(lo: float, hi: float, margin: float, *, higher_is_better: bool = False) -> Verdict:
    """The verdict of an interval ``[lo, hi]`` of a ratio new/old against ``margin``.

    Lower is worse when ``higher_is_better`` (a speed-up); the margin band is
    ``[1 / (1 + margin), 1 + margin]`` either way. An infinite or NaN end is undecided.
    """
    lo, hi = ordered(lo, hi)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0:
        return Verdict.UNDECIDED
    if higher_is_better:  # judge in lower-is-better terms: old/new
        lo, hi = 1.0 / hi, 1.0 / lo
    up, down = 1.0 + margin, 1.0 / (1.0 + margin)
    if lo > up:
        return Verdict.REGRESSION
    if hi < down:
        return Verdict.IMPROVEMENT
    if down <= lo and hi <= up:
        return Verdict.UNCHANGED
    return Verdict.UNDECIDED


def judge(
    ratio: float | None,
    ci: tuple[float, float] | None,
    margin: float,
    *,
    higher_is_better: bool = False,
    detail: str = "",
) -> TimedVerdict:
    """:func:`classify` as a :class:`TimedVerdict` (no interval: undecided, ``NO_INTERVAL``)."""
    if ci is None or ratio is None:
        return TimedVerdict(
            Verdict.UNDECIDED,
            Reason.NO_INTERVAL,
            ratio,
            None,
            None,
            margin,
            higher_is_better,
            detail,
        )
    lo, hi = ordered(*ci)
    v = classify(lo, hi, margin, higher_is_better=higher_is_better)
    reason = Reason.INTERVAL if v is not Verdict.UNDECIDED else Reason.STRADDLES
    if not (math.isfinite(lo) and math.isfinite(hi)):
        reason = Reason.NO_INTERVAL
        lo = hi = None  # type: ignore[assignment]
    return TimedVerdict(v, reason, ratio, lo, hi, margin, higher_is_better, detail)
