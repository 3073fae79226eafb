"""Statistics are pure functions: fixed inputs, known answers."""

from __future__ import annotations

import math

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
