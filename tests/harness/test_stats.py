"""Statistics are pure functions: fixed inputs, known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perf.core import stats


def test_median_ci_is_order_statistics():
    xs = list(range(1, 21))  # n=20: 95% interval of the median is [x(6), x(15)]
    assert stats.median_ci(xs, 0.95) == (6.0, 15.0)
    assert stats.median(xs) == 10.5


def test_median_ci_too_few_samples_is_unbounded():
    assert stats.median_ci([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) == (-math.inf, math.inf)


def test_median_ci_rejects_bad_confidence():
    with pytest.raises(ValueError, match="confidence"):
        stats.median_ci([1.0] * 10, 1.5)


def test_linear_fit_exact_line():
    fit = stats.linear_fit([1, 2, 3, 4, 5], [3, 5, 7, 9, 11])
    assert fit.slope == pytest.approx(2.0)
    assert fit.intercept == pytest.approx(1.0)
    assert fit.r2 == pytest.approx(1.0)


def test_linear_fit_noise_lowers_r2():
    fit = stats.linear_fit([1, 2, 3, 4, 5], [1, 5, 2, 6, 3])
    assert fit.r2 < 0.5


def test_crossover_requires_a_persistent_win():
    sizes = [64, 128, 256, 512, 1024]
    assert stats.crossover(sizes, [False, True, False, True, True]) == 512
    assert stats.crossover(sizes, [False] * 5) is None
    assert stats.crossover(sizes, [True] * 5) == 64


def test_ratio_of_medians_ci_is_deterministic_and_covers_truth():
    a = [2.0 + 0.01 * (i % 7) for i in range(30)]
    b = [1.0 + 0.005 * (i % 5) for i in range(30)]
    ci1 = stats.ratio_of_medians_ci(a, b)
    assert ci1 == stats.ratio_of_medians_ci(a, b)
    assert ci1[0] <= stats.median(a) / stats.median(b) <= ci1[1]


# --- dependence of paired ratios (deterministic synthetic series) ---------------------------


def _ar1(n: int, phi: float, seed: int, sd: float = 0.2) -> list[float]:
    """exp of an AR(1) series: ratios whose neighbours are alike when phi > 0; median 1."""
    rng = np.random.default_rng(seed)
    e = rng.normal(0.0, sd, n)
    x = np.zeros(n)
    for i in range(n):
        x[i] = (phi * x[i - 1] if i else 0.0) + e[i]
    return [float(v) for v in np.exp(x)]


def _alternating_orders(n: int) -> list[bool]:
    return [i % 2 == 0 for i in range(n)]


def test_iid_series_are_not_flagged() -> None:
    flagged = [
        stats.dependence(_ar1(25, 0.0, s), _alternating_orders(25)).flagged for s in range(200)
    ]
    # three tests at alpha 0.01 each: about 3% of iid series flagged, never most
    assert sum(flagged) <= 10, sum(flagged)
    assert not stats.dependence(_ar1(41, 0.0, 1)).flagged


def test_autocorrelated_series_are_flagged() -> None:
    d = stats.dependence(_ar1(41, 0.9, 3))
    assert d.flagged and d.lag1_autocorr > 0.5, d
    assert "lag-1 autocorrelation" in d.describe()
    flagged = [stats.dependence(_ar1(41, 0.9, s)).flagged for s in range(100)]
    assert sum(flagged) >= 90, sum(flagged)


def test_a_level_shift_fails_the_runs_test() -> None:
    """A neighbour that starts halfway: the first half's ratios all below, the rest above."""
    rng = np.random.default_rng(0)
    xs = list(np.exp(rng.normal(0, 0.02, 30)) * np.r_[np.full(15, 0.8), np.full(15, 1.25)])
    assert stats.runs_test_p(xs) < 1e-4
    assert stats.dependence(xs).flagged


def test_a_neighbour_locked_to_the_pair_order_is_flagged() -> None:
    """The side that runs second is slow (ratio 0.5 or 2 by order): the order test fires."""
    orders = [bool(v) for v in np.random.default_rng(7).integers(0, 2, 24)]
    noise = np.exp(np.random.default_rng(8).normal(0, 0.05, 24))
    xs = [float((0.5 if f else 2.0) * z) for f, z in zip(orders, noise, strict=True)]
    d = stats.dependence(xs, orders)
    assert d.order_p is not None and d.order_p < 1e-3 and d.flagged, d
    assert "ran first" in d.describe()


def test_order_effect_needs_one_order_per_ratio() -> None:
    with pytest.raises(ValueError, match="one entry per ratio"):
        stats.order_effect_p([1.0, 2.0, 3.0], [True])


def test_paired_verdict_of_iid_ratios_is_ok_and_holds_the_binomial_interval() -> None:
    v = stats.paired_ratio_verdict(_ar1(25, 0.0, 2), 0.95, _alternating_orders(25))
    assert v.verdict == stats.VERDICT_OK and v.reason == ""
    assert v.ci[0] <= v.iid_ci[0] and v.ci[1] >= v.iid_ci[1]


def test_paired_verdict_keeps_its_rate_on_autocorrelated_ratios() -> None:
    """The point of it: on strongly dependent pairs (AR(1), phi 0.8) the binomial interval of
    the median holds the true ratio 1.0 in only ~60% of runs; the verdict's interval holds it
    or says "inconclusive" in >= 90%."""
    held = iid_held = 0
    for s in range(200):
        v = stats.paired_ratio_verdict(_ar1(25, 0.8, s), 0.95, _alternating_orders(25))
        iid_held += v.iid_ci[0] <= 1.0 <= v.iid_ci[1]
        held += v.verdict == stats.VERDICT_INCONCLUSIVE or v.ci[0] <= 1.0 <= v.ci[1]
    assert iid_held < 140, iid_held
    assert held >= 180, held


def test_dependent_long_series_are_widened_not_given_up() -> None:
    v = stats.paired_ratio_verdict(_ar1(200, 0.8, 0), 0.95, _alternating_orders(200))
    assert v.verdict == stats.VERDICT_WIDENED and "not independent" in v.reason
    assert v.ci[0] < v.iid_ci[0] and v.ci[1] > v.iid_ci[1]


def test_dependent_short_series_are_inconclusive() -> None:
    v = stats.paired_ratio_verdict(_ar1(25, 0.9, 3), 0.95)
    assert v.verdict == stats.VERDICT_INCONCLUSIVE, v
    assert v.ci == (-math.inf, math.inf) and "too few" in v.reason


def test_paired_verdict_needs_enough_pairs_and_positive_ratios() -> None:
    assert stats.paired_ratio_verdict([1.0] * 7).verdict == stats.VERDICT_INCONCLUSIVE
    with pytest.raises(ValueError, match="positive and finite"):
        stats.paired_ratio_verdict([1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])


def test_batch_ratio_ci_needs_four_batches() -> None:
    assert stats.batch_ratio_ci([1.0] * 7, 2) is None
    lo, hi = stats.batch_ratio_ci([1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.0], 2)
    assert lo < 1.0 < hi
