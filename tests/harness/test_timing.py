"""measure/compare on real clocks, asserting only relative or loose-scale facts."""

from __future__ import annotations

import time

import pytest

import perf


def _work(n: int) -> int:
    return sum(range(n))


@pytest.mark.perf_timing
def test_measure_of_a_2ms_sleep_reports_about_2ms():
    t = perf.measure(lambda: time.sleep(0.002), min_run_time_s=0.1)
    assert 0.0019 <= t.median_s <= 0.004, str(t)  # sleep never returns early; OS adds a little
    assert t.number >= 2 and len(t.samples_s) >= 7


@pytest.mark.perf_timing
def test_compare_finds_doubled_work_about_twice_as_slow():
    c = perf.compare(lambda: _work(40_000), lambda: _work(20_000), pairs=21)
    lo, _hi = c.ci
    assert lo > 1.0, str(c)  # interval excludes 1
    assert 1.6 < c.ratio < 2.5, str(c)
    assert c.a_slower()


@pytest.mark.perf_timing
def test_compare_a_a_interval_holds_one():
    c = perf.compare(lambda: _work(20_000), lambda: _work(20_000), pairs=21)
    lo, hi = c.ci
    assert lo <= 1.0 <= hi or abs(c.ratio - 1) < 0.03, str(c)
    assert not c.a_slower(1.1) and not c.b_slower(1.1)


def test_measure_respects_fixed_number_and_samples():
    calls = []
    t = perf.measure(lambda: calls.append(1), number=3, samples=5, warmup=2)
    assert len(t.samples_s) == 5 and t.number == 3
    assert len(calls) == 2 + 15


def test_compare_needs_enough_pairs():
    with pytest.raises(ValueError, match="at least 6 pairs"):
        perf.compare(lambda: None, lambda: None, pairs=3)


def test_compare_across_devices_labels_each_side():
    c = perf.compare(lambda: None, lambda: None, device_a="cpu", device_b="cpu", pairs=6,
                     labels=("x", "y"))
    assert (c.a.device, c.b.device, c.a.label, c.b.label) == ("cpu", "cpu", "x", "y")
    assert len(c.ratios) == 6


def test_measure_runs_longer_in_an_interleaved_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """perf's interleaved children set PERF_MEASURE_SCALE: more samples over a longer run."""
    from perf.instruments.timing import MEASURE_SCALE_ENV, measure, measure_scale

    calls = []
    monkeypatch.setenv(MEASURE_SCALE_ENV, "3")
    assert measure_scale() == 3.0
    t = measure(lambda: calls.append(1), number=1, samples=4, warmup=0)
    assert len(t.samples_s) == 12
    for bad in ("x", "0.5", ""):
        monkeypatch.setenv(MEASURE_SCALE_ENV, bad)
        assert measure_scale() == 1.0
    monkeypatch.delenv(MEASURE_SCALE_ENV)
    assert len(measure(lambda: None, number=1, samples=4, warmup=0).samples_s) == 4
