"""Statistics as pure functions of raw samples (no torch, no pytest).

Intervals are distribution-free where possible: the interval of a median comes from binomial
order statistics, which needs no resampling and gives the same answer on every run for the same
samples, so a gate built on it is deterministic given its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np


def _scipy_stats() -> ModuleType:
    """``scipy.stats``, imported on first use: it takes about 1 s to import, and every
    process that only records samples (each child of an interleaved gate) never needs it."""
    from scipy import stats

    return stats


def median(xs: Sequence[float]) -> float:
    if len(xs) == 0:
        raise ValueError("median of no samples")
    return float(np.median(np.asarray(xs, dtype=float)))


def iqr(xs: Sequence[float]) -> float:
    a = np.asarray(xs, dtype=float)
    q75, q25 = np.percentile(a, [75, 25])
    return float(q75 - q25)


def median_ci(xs: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for the median: order statistics of Binomial(n, 1/2).

    Returns (-inf, inf) when there are too few samples for the asked confidence (n < 6 at
    95%), so a caller can never mistake "not enough data" for "significant".
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    a = np.sort(np.asarray(xs, dtype=float))
    n = len(a)
    if n == 0:
        raise ValueError("interval of no samples")
    alpha = 1.0 - confidence
    # Largest j with P(B < j) <= alpha/2, B ~ Bin(n, 1/2); interval is [a[j-1], a[n-j]] (1-based).
    j = int(_scipy_stats().binom.ppf(alpha / 2.0, n, 0.5))
    while j > 0 and _scipy_stats().binom.cdf(j - 1, n, 0.5) > alpha / 2.0:
        j -= 1
    if j < 1:
        return (-math.inf, math.inf)
    return (float(a[j - 1]), float(a[n - j]))


def ratio_of_medians_ci(
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Bootstrap (BCa, scipy) interval of median(a) / median(b) for *unpaired* samples.

    Used across runs, where samples cannot be paired. The seed is fixed so the same inputs give
    the same interval.
    """
    xa = np.asarray(a, dtype=float)
    xb = np.asarray(b, dtype=float)
    if len(xa) < 3 or len(xb) < 3:
        return (-math.inf, math.inf)

    def stat(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.median(x, axis=axis) / np.median(y, axis=axis)

    res = _scipy_stats().bootstrap(
        (xa, xb),
        stat,
        paired=False,
        vectorized=True,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


@dataclass(frozen=True)
class LinearFit:
    slope: float
    intercept: float
    r2: float
    n: int


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> LinearFit:
    """Least-squares line with R² (1.0 for a perfect fit, also when ys is constant and fit)."""
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    if len(x) != len(y) or len(x) < 2:
        raise ValueError("linear_fit needs two equally long sequences of at least 2 points")
    res = _scipy_stats().linregress(x, y)
    pred = res.slope * x + res.intercept
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 if ss_tot == 0.0 else 1.0 - ss_res / ss_tot
    return LinearFit(float(res.slope), float(res.intercept), r2, len(x))


def crossover(
    sizes: Sequence[float],
    wins: Sequence[bool],
) -> float | None:
    """Smallest size from which B wins at every larger size too (None if B never settles).

    ``wins[i]`` says whether B was faster *with confidence* at ``sizes[i]``. Requiring the win to
    persist keeps one lucky small size from being reported as the crossover.
    """
    if len(sizes) != len(wins):
        raise ValueError("sizes and wins must have the same length")
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    found: float | None = None
    for i in reversed(order):
        if wins[i]:
            found = sizes[i]
        else:
            break
    return found


# --- Paired ratios that may not be independent ---------------------------------------------
#
# A paired comparison's interval of the median (``median_ci``) assumes the pairs are
# independent. On a loaded 2-core runner they are not: a periodic neighbour can lock into the
# A-then-B rhythm (every A-first pair slow on one side), and a vCPU that flips between two
# speeds ~2x apart makes runs of neighbouring pairs alike. Then 25 pairs carry the information
# of a handful and the binomial interval is far too tight (observed: 0.497x [0.450, 0.563] for a
# ratio that is > 1). The functions below detect such dependence from the ratios alone and
# give an interval from batches of consecutive pairs, which stays honest under it.


def lag1_autocorrelation(xs: Sequence[float]) -> float:
    """Lag-1 autocorrelation of the *ranks* of ``xs`` (ranks: one wild pair cannot dominate)."""
    r = _scipy_stats().rankdata(np.asarray(xs, dtype=float))
    if len(r) < 3:
        return 0.0
    d = r - r.mean()
    den = float(np.sum(d * d))
    return 0.0 if den == 0.0 else float(np.sum(d[:-1] * d[1:]) / den)


def lag1_p(xs: Sequence[float]) -> float:
    """Two-sided p-value of "no lag-1 autocorrelation" (r1 ~ N(-1/n, (n-2)/n²) under iid)."""
    n = len(xs)
    if n < 6:
        return 1.0
    r1 = lag1_autocorrelation(xs)
    z = (r1 + 1.0 / n) / math.sqrt((n - 2) / n**2)
    return float(2.0 * _scipy_stats().norm.sf(abs(z)))


def runs_test_p(xs: Sequence[float]) -> float:
    """Wald-Wolfowitz runs test above/below the median: two-sided p-value of "iid order".

    Too few runs means slow drift or long runs of one machine state; too many means a
    periodic alternation (a neighbour locked to the pair rhythm).
    """
    a = np.asarray(xs, dtype=float)
    med = float(np.median(a))
    signs = [x > med for x in a if x != med]
    n1 = sum(signs)
    n2 = len(signs) - n1
    if n1 < 2 or n2 < 2:
        return 1.0
    runs = 1 + sum(1 for i in range(1, len(signs)) if signs[i] != signs[i - 1])
    n = n1 + n2
    mu = 2.0 * n1 * n2 / n + 1.0
    var = 2.0 * n1 * n2 * (2.0 * n1 * n2 - n) / (n * n * (n - 1))
    if var <= 0:
        return 1.0
    return float(2.0 * _scipy_stats().norm.sf(abs(runs - mu) / math.sqrt(var)))


def order_effect_p(xs: Sequence[float], a_first: Sequence[bool]) -> float:
    """p-value of "the ratio does not depend on which side ran first" (Mann-Whitney U)."""
    x = np.asarray(xs, dtype=float)
    f = np.asarray(a_first, dtype=bool)
    if len(f) != len(x):
        raise ValueError("a_first must have one entry per ratio")
    g1, g2 = x[f], x[~f]
    if len(g1) < 3 or len(g2) < 3 or np.ptp(x) == 0.0:
        return 1.0
    return float(_scipy_stats().mannwhitneyu(g1, g2, alternative="two-sided").pvalue)


@dataclass(frozen=True)
class Dependence:
    """Evidence that consecutive pairs are not independent (each p-value: small = dependent)."""

    n: int
    lag1_autocorr: float
    lag1_p: float
    runs_p: float
    #: None when the pair orders were not given
    order_p: float | None
    alpha: float

    @property
    def flagged(self) -> bool:
        ps = [self.lag1_p, self.runs_p] + ([self.order_p] if self.order_p is not None else [])
        return min(ps) < self.alpha

    def describe(self) -> str:
        """The tests that fired, with their figures ("" when none)."""
        out = []
        if self.lag1_p < self.alpha:
            out.append(f"lag-1 autocorrelation {self.lag1_autocorr:+.2f} (p={self.lag1_p:.2g})")
        if self.runs_p < self.alpha:
            out.append(f"runs test p={self.runs_p:.2g}")
        if self.order_p is not None and self.order_p < self.alpha:
            out.append(f"ratio depends on which side ran first (p={self.order_p:.2g})")
        return ", ".join(out)


def dependence(
    xs: Sequence[float], a_first: Sequence[bool] | None = None, alpha: float = 0.01
) -> Dependence:
    """Lag-1, runs and (given the orders) order-effect tests on a series of paired ratios.

    ``alpha`` is per test; with three tests an iid series is flagged about 3% of the time,
    which only widens its interval (costs power, never correctness).
    """
    return Dependence(
        n=len(xs),
        lag1_autocorr=lag1_autocorrelation(xs),
        lag1_p=lag1_p(xs),
        runs_p=runs_test_p(xs),
        order_p=None if a_first is None else order_effect_p(xs, a_first),
        alpha=alpha,
    )


def batch_ratio_ci(
    ratios: Sequence[float], batch: int, confidence: float = 0.95
) -> tuple[float, float] | None:
    """Batch-medians interval of a ratio: t interval over per-batch medians of log ratios.

    Consecutive pairs form batches of ``batch``; dependence shorter than a batch stays inside
    it, and with an even batch of alternating orders an order effect cancels. None when there
    are fewer than 4 batches (too few for an interval worth stating).
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    x = np.log(np.asarray(ratios, dtype=float))
    k = len(x) // batch
    if k < 4:
        return None
    meds = np.median(x[: k * batch].reshape(k, batch), axis=1)
    centre = float(meds.mean())
    half = float(
        _scipy_stats().t.ppf(0.5 + confidence / 2.0, k - 1) * meds.std(ddof=1) / math.sqrt(k)
    )
    return (math.exp(centre - half), math.exp(centre + half))


#: Verdicts of :func:`paired_ratio_verdict`.
VERDICT_OK = "ok"
VERDICT_WIDENED = "widened"
VERDICT_INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class PairedVerdict:
    """The interval of a paired ratio and whether the pairs allow one (see ``reason``)."""

    ratio: float
    ci: tuple[float, float]
    #: the binomial interval of the median, right only for independent pairs
    iid_ci: tuple[float, float]
    #: ``ok`` | ``widened`` (pairs dependent; interval from longer batches) | ``inconclusive``
    verdict: str
    reason: str
    dependence: Dependence


def paired_ratio_verdict(
    ratios: Sequence[float],
    confidence: float = 0.95,
    a_first: Sequence[bool] | None = None,
    alpha: float = 0.01,
) -> PairedVerdict:
    """Interval of a paired ratio that holds when pairs are independent *and* when they are not.

    Always the hull of the binomial median interval and a batch interval (batches of 2 pairs,
    one of each order); when :func:`dependence` flags the series, the batches grow to twice
    the autocorrelation time the lag-1 coefficient implies (at least 4 pairs), and with fewer
    than 5 such batches the verdict is inconclusive: an interval that only holds for
    independent pairs is never stated as if it held.
    """
    if any(not (r > 0.0 and math.isfinite(r)) for r in ratios):
        raise ValueError("paired ratios must be positive and finite")
    n = len(ratios)
    med = median(ratios)
    iid = median_ci(ratios, confidence)
    dep = dependence(ratios, a_first, alpha)
    if dep.flagged:
        # batches several autocorrelation times long (AR(1): tau = (1+r)/(1-r)) hold the
        # dependence inside them; at least 5 such batches or no interval at all
        r = min(max(dep.lag1_autocorr, 0.0), 0.95)
        tau = (1.0 + r) / (1.0 - r)
        batch = max(4, 2 * math.ceil(tau))
        min_batches = 5
        why = f"pairs are not independent: {dep.describe()}"
    else:
        batch, min_batches, why = 2, 4, ""
    bci = batch_ratio_ci(ratios, batch, confidence) if n // batch >= min_batches else None
    if bci is None or not math.isfinite(iid[0]):
        need = min_batches * batch if bci is None else 6
        return PairedVerdict(
            med,
            (-math.inf, math.inf),
            iid,
            VERDICT_INCONCLUSIVE,
            (why + "; " if why else "") + f"{n} pairs are too few for an interval (need {need})",
            dep,
        )
    ci = (min(iid[0], bci[0]), max(iid[1], bci[1]))
    if dep.flagged:
        return PairedVerdict(
            med, ci, iid, VERDICT_WIDENED, why + f"; interval from batches of {batch} pairs", dep
        )
    return PairedVerdict(med, ci, iid, VERDICT_OK, "", dep)
