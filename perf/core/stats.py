"""Statistics as pure functions of raw samples (no torch, no pytest).

Intervals are distribution-free where possible: the interval of a median comes from binomial
order statistics, which needs no resampling and gives the same answer on every run for the same
samples, so a gate built on it is deterministic given its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _sps


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
    j = int(_sps.binom.ppf(alpha / 2.0, n, 0.5))
    while j > 0 and _sps.binom.cdf(j - 1, n, 0.5) > alpha / 2.0:
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

    res = _sps.bootstrap(
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
    res = _sps.linregress(x, y)
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
