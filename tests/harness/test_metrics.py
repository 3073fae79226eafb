"""Metric validation: bad input raises a ValueError that says what is wrong."""

from __future__ import annotations

import math

import pytest

from perf.metrics import Metric, make_metric
from perf.timing import Comparison, Timing


@pytest.mark.parametrize(
    ("value", "unit", "match"),
    [
        (math.nan, "count", "finite"),
        (math.inf, "bytes", "finite"),
        (-1, "count", "negative"),
        (-5, "bytes", "negative"),
        (1.5, "count", "whole number"),
        (3, "parsecs", "unknown unit"),
        ("abc", "count", "must be a number"),
        (3, None, "unit= is required"),
    ],
)
def test_bad_values_raise(value, unit, match):
    with pytest.raises(ValueError, match=match):
        make_metric("m", value, unit=unit)


def test_bad_name_and_tolerance_raise():
    with pytest.raises(ValueError, match="name"):
        make_metric("has space", 1, unit="count")
    with pytest.raises(ValueError, match="tolerance"):
        make_metric("m", 1, unit="count", tolerance=-0.1)


def test_timing_and_comparison_keep_raw_samples():
    t = Timing((0.1, 0.2, 0.3), number=4, device="cpu")
    m = make_metric("step", t)
    assert (m.unit, m.kind, m.value, m.samples) == ("s", "time", 0.2, (0.1, 0.2, 0.3))
    c = Comparison(t, t, ratios=(1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0), confidence=0.95)
    m = make_metric("ab", c, higher_is_better=True)
    assert m.kind == "ratio" and m.ci == c.ci and m.higher_is_better


def test_round_trip_through_dict():
    m = make_metric("bytes", 1024, unit="bytes", tolerance=0.1, extra={"batch": 8})
    assert Metric.from_dict(m.to_dict()) == m
