"""The gate's result types: the policy (margins, statistics settings), one verdict per
metric and the verdicts of one comparison. Data only, no statistics: every gate
(stored, re-measured, interleaved) fills them, the reports read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from perf.core.verdicts import TimedVerdict

#: A metric's status. Timed metrics end as one of the four verdicts of
#: :class:`perf.core.verdicts.Verdict` (``undecided`` carries its
#: :class:`~perf.core.verdicts.Reason`); counts and bytes as regression / improvement /
#: unchanged; any metric may be new, missing or refused.
Status = Literal["regression", "improvement", "unchanged", "undecided", "new", "missing", "refused"]

__all__ = ["GateResult", "MetricResult", "Policy", "Status"]


@dataclass(frozen=True)
class Policy:
    """Default margins per kind and the statistics settings of the gate."""

    #: 10%: a suspect must clear it in this run *and* in every fresh-process re-measurement
    #: (:mod:`perf.gate.remeasure`); see README, "Gating PRs", for what it achieves.
    time_tolerance: float = 0.10
    ratio_tolerance: float = 0.10
    bytes_tolerance: float = 0.02
    #: Compile time (kind ``compile``): one value per run, same cache state only; 50%.
    compile_tolerance: float = 0.5
    confidence: float = 0.95
    #: Quantile of the raw time samples used as each run's location (see module docstring).
    time_quantile: float = 0.25
    #: Reference brackets further than this from the baseline's (relative) mark the machine
    #: as busy and time verdicts as inconclusive. Measured on a quiet 2-core VM: the
    #: reference itself drifts by up to ~20% between brackets, so 25%.
    reference_band: float = 0.25
    #: Other processes (and other guests, via steal time) using more than this share of the
    #: machine's CPUs during a run mark its times as taken on a busy machine
    #: (:mod:`perf.core.contention`). Measured on the 2-core dev VM: ~1-3% when quiet, ~50% with
    #: one CPU-bound neighbour.
    busy_cpu_fraction: float = 0.10
    #: Ignore time differences below this many seconds per call (clock resolution).
    min_abs_effect_s: float = 0.0
    #: Fewer samples than this per side: the timing is compared by value only, never failed.
    min_samples: int = 5
    n_resamples: int = 2000
    seed: int = 0
    #: A timing slower than the stored baseline whose code measures as fast as the
    #: baseline's commit's in this environment (interleaved) while the recorded environment
    #: differs: ``"fail"`` it as a regression of the environment, or ``"warn"`` (undecided,
    #: reason ``ENVIRONMENT``, never failed). ini ``perf_environment_change``; docs/gating.md.
    #: ``warn`` by default: what is not in the code is not the pull request's regression.
    environment_change: str = "warn"
    #: What a timing still undecided after settling does to the exit status: ``"warn"``
    #: (exit 0, an UNDECIDED section, a ``::warning`` on GitHub Actions) or ``"fail"`` (exit 1).
    #: ini ``perf_undecided``.
    undecided: str = "warn"
    #: Seconds of interleaved re-measurement one gated session may spend settling doubtful
    #: and undecided stored timings (ini ``perf_settle_budget_s``). ~8 children on the dev VM.
    settle_budget_s: float = 60.0

    def __post_init__(self) -> None:
        for name in (
            "time_tolerance",
            "ratio_tolerance",
            "bytes_tolerance",
            "reference_band",
            "busy_cpu_fraction",
        ):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 10.0):
                raise ValueError(f"{name} must be a relative margin in [0, 10], got {v!r}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        for name in ("environment_change", "undecided"):
            if getattr(self, name) not in ("fail", "warn"):
                raise ValueError(f"{name} must be 'fail' or 'warn', got {getattr(self, name)!r}")
        if not self.settle_budget_s >= 0:
            raise ValueError(f"settle_budget_s must be >= 0, got {self.settle_budget_s}")
        if not 0.0 <= self.time_quantile <= 1.0:
            raise ValueError(f"time_quantile must be in [0, 1], got {self.time_quantile}")

    def margin(self, kind: str, own: float | None = None) -> float:
        """The relative margin of a metric of ``kind``: its own (``perf_tolerance``,
        ``tolerance=``) when it has one, 0 included, else this policy's default for the kind
        (counts: 0, exact). The one source of the per-kind defaults."""
        if own is not None:
            return float(own)
        defaults = {
            "time": self.time_tolerance,
            "ratio": self.ratio_tolerance,
            "bytes": self.bytes_tolerance,
            "compile": self.compile_tolerance,
        }
        return defaults.get(kind, 0.0)


@dataclass(frozen=True)
class MetricResult:
    """The verdict on one metric of one test."""

    nodeid: str
    name: str
    unit: str
    kind: str
    status: Status
    #: Values as stored: counts are exact ints, other kinds floats.
    old: float | int | None = None
    new: float | int | None = None
    #: new/old of the gate's statistic (after normalisation for times), None where undefined.
    ratio: float | None = None
    ci: tuple[float, float] | None = None
    margin: float | None = None
    higher_is_better: bool = False
    reason: str = ""
    #: Ratio of the re-measurement of a suspect (None: not re-measured).
    remeasured_ratio: float | None = None
    #: Counts and bytes: the sites (``sync_sites`` / ``sites`` extra) behind a change, for people.
    sites: str = ""
    #: Undecided only because of the machine *now* (busy, reference off): a fresh
    #: re-measurement may still settle it.
    recheck: bool = False
    #: Fresh-process re-measurements that confirmed this regression.
    confirmations: int = 0
    #: head/base ratio of each interleaved pair behind this verdict, in the order run
    #: (:mod:`perf.gate.against`); empty for a verdict on two stored runs.
    pairs: tuple[float, ...] = ()
    #: Interleaved pairs set aside because the machine's load changed between their children.
    skewed_pairs: int = 0
    #: Timed metrics: the typed verdict behind ``status`` (its reason code, interval, margin).
    timed: TimedVerdict | None = None
    #: The interleaved interval (head/base, lower-is-better) that settled or tried to settle
    #: this stored verdict; shown beside the stored one in the UNDECIDED section.
    interleaved_ci: tuple[float, float] | None = None
    #: Why the baseline's samples of this metric cannot anchor a verdict (``noisy`` flag).
    noisy: str = ""

    @property
    def explanation(self) -> str:
        """``reason`` with what the data fields add, for people (reports, terminal)."""
        if not self.confirmations:
            return self.reason
        n = self.confirmations
        tail = "confirmed by re-measurement" if n == 1 else f"confirmed by {n} re-measurements"
        return f"{self.reason}; {tail}" if self.reason else tail


@dataclass(frozen=True)
class GateResult:
    """All verdicts of one comparison; ``failed`` decides the exit status."""

    baseline: str
    current: str
    results: tuple[MetricResult, ...]
    timing_refused: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def by_status(self, status: Status) -> list[MetricResult]:
        return [r for r in self.results if r.status == status]

    @property
    def regressions(self) -> list[MetricResult]:
        return self.by_status("regression")

    @property
    def improvements(self) -> list[MetricResult]:
        return self.by_status("improvement")

    @property
    def unchanged(self) -> list[MetricResult]:
        return self.by_status("unchanged")

    @property
    def undecided(self) -> list[MetricResult]:
        return self.by_status("undecided")

    @property
    def failed(self) -> bool:
        return bool(self.regressions)

    def fails(self, policy: Policy) -> bool:
        """Whether this result fails the build under ``policy`` (``perf_undecided``)."""
        return self.failed or (policy.undecided == "fail" and bool(self.undecided))
