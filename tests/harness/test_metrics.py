"""Metric validation: bad input raises a ValueError that says what is wrong."""

from __future__ import annotations

import math

import pytest

from perf.instruments.timing import Comparison, Timing
from perf.store.metrics import Metric, make_metric


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
    c = Comparison(t, t, ratios=(1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.02), confidence=0.95)
    m = make_metric("ab", c, higher_is_better=True)
    assert m.kind == "ratio" and m.ci == c.ci and m.higher_is_better
    # an inconclusive comparison keeps its samples but states no interval
    few = Comparison(t, t, ratios=(1.0, 1.1, 0.9), confidence=0.95)
    m = make_metric("few", few)
    assert few.verdict == "inconclusive" and m.ci is None and m.samples == few.ratios


def test_round_trip_through_dict():
    m = make_metric("bytes", 1024, unit="bytes", tolerance=0.1, extra={"batch": 8})
    assert Metric.from_dict(m.to_dict()) == m


# -- only what survives JSON and xdist (issue 8, item 5) -------------------------------------


class _Thing:
    pass


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"ratio": math.nan}, r"extra 'ratio': nan is not valid JSON"),
        ({"ratio": math.inf}, r"extra 'ratio': inf is not valid JSON"),
        ({"dtype": __import__("torch").float16}, r"extra 'dtype': a torch.dtype"),
        ({"obj": _Thing()}, r"extra 'obj': a .*_Thing does not survive"),
        ({"shape": (2, 3)}, r"extra 'shape': a builtins.tuple .*use a list"),
        ({"cfg": {1: "a"}}, r"extra 'cfg': key 1 is a int"),
        ({"cfg": {"lr": [1.0, math.nan]}}, r"extra 'cfg'\['lr'\]\[1\]: nan"),
        ({"n": __import__("numpy").float64(1.5)}, r"extra 'n': a numpy.float64"),
        ({"big": 10**40}, r"extra 'big': integer with more than 30 digits"),
        ({"deep": [[[[[[[[[[1]]]]]]]]]]}, r"nested deeper than 8"),
    ],
)
def test_extras_that_do_not_round_trip_are_refused_naming_the_key(extra, match):
    with pytest.raises(ValueError, match=match):
        make_metric("m", 1, unit="count", extra=extra)


def test_json_extras_round_trip_exactly():
    import json

    extra = {"a": None, "b": True, "c": "x", "d": 2**60, "e": 1.5, "f": [1, {"g": "h"}]}
    m = make_metric("m", 1, unit="count", extra=extra)
    assert json.loads(json.dumps(m.to_dict()))["extra"] == extra


def test_counts_are_exact_ints_end_to_end():
    import numpy as np
    import torch

    big = 2**53 + 1
    for v in (big, np.int64(big), torch.tensor(big), float(2**40)):
        m = make_metric("flops", v, unit="flops")
        assert type(m.value) is int
    assert make_metric("flops", big, unit="flops").value == big
    assert Metric.from_dict(make_metric("flops", big, unit="flops").to_dict()).value == big
    with pytest.raises(ValueError, match="whole number"):
        make_metric("ops", True, unit="ops")
