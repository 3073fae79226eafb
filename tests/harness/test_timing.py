"""measure/compare on real clocks, asserting only relative or loose-scale facts."""

from __future__ import annotations

import dataclasses
import time

import pytest

import perf
from perf.core import stats
from perf.instruments.timing import Block, Comparison, Timing, _autorange, _calls_for


def _work(n: int) -> int:
    return sum(range(n))


@pytest.mark.perf_timing
def test_measure_of_a_2ms_sleep_reports_about_2ms():
    t = perf.measure(lambda: time.sleep(0.002), min_run_time_s=0.1)
    assert t.min_s >= 0.0019, str(t)  # per call, and sleep never returns early
    # per call, not per block of `number` calls (a loaded box stretches each sleep, so no
    # absolute upper bound: the block would be >= number x 2 ms)
    assert t.min_s < 0.0019 * t.number, str(t)
    assert t.number >= 2 and len(t.samples_s) >= 7


@pytest.mark.perf_timing
def test_compare_finds_doubled_work_about_twice_as_slow():
    c = perf.compare(lambda: _work(40_000), lambda: _work(20_000), pairs=21)
    if c.verdict == "inconclusive":  # a loaded runner can make the pairs dependent
        pytest.skip(f"this run cannot decide a timing claim: {c}")
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
    # never decided wrong: "A slower by 1.1x" is False or undecided, never True
    assert c.decide_a_slower(1.1).holds is not True


def test_measure_respects_fixed_number_and_samples():
    calls = []
    t = perf.measure(lambda: calls.append(1), number=3, samples=5, warmup=2)
    assert len(t.samples_s) == 5 and t.number == 3
    assert len(calls) == 2 + 15


def test_compare_needs_enough_pairs():
    with pytest.raises(ValueError, match="at least 8 pairs"):
        perf.compare(lambda: None, lambda: None, pairs=3)


def test_compare_across_devices_labels_each_side():
    c = perf.compare(
        lambda: None, lambda: None, device_a="cpu", device_b="cpu", pairs=8, labels=("x", "y")
    )
    assert (c.a.device, c.b.device, c.a.label, c.b.label) == ("cpu", "cpu", "x", "y")
    assert len(c.ratios) == 8


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


def _cmp(ratios: list[float], a_first: tuple[bool, ...] = ()) -> Comparison:
    t = Timing((1.0,), 1, "cpu", "x")
    return Comparison(t, t, ratios=tuple(ratios), confidence=0.95, a_first=a_first)


def test_comparison_verdict_and_reason_are_fields_of_a_frozen_result() -> None:
    c = _cmp([1.5, 1.6, 1.4, 1.55, 1.45, 1.5, 1.52, 1.48, 1.5, 1.51])
    names = {f.name for f in dataclasses.fields(c)}
    assert {"ratios", "a_first", "ci", "iid_ci", "verdict", "reason"} <= names
    assert c.verdict == stats.VERDICT_OK and c.reason == ""
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.verdict = "ok"  # type: ignore[misc]


def test_decisions_are_yes_no_or_undecided() -> None:
    c = _cmp([1.5, 1.6, 1.4, 1.55, 1.45, 1.5, 1.52, 1.48, 1.5, 1.51])
    assert c.decide_a_slower(1.0).holds is True and c.a_slower(1.0)
    assert c.decide_a_slower(2.0).holds is False and not c.a_slower(2.0)
    d = c.decide_a_slower(1.5)  # inside the interval: the run cannot tell
    assert d.holds is None and "contains 1.5" in d.reason and "1.5" in d.claim
    assert c.decide_b_slower(1.0).holds is False
    fast_b = _cmp([0.5, 0.52, 0.48, 0.5, 0.51, 0.49, 0.5, 0.5])
    assert fast_b.decide_b_slower(1.5).holds is True and fast_b.b_slower(1.5)


def test_dependent_pairs_make_every_claim_undecided() -> None:
    """The failure seen on a loaded runner, planted: the side that runs second is 2x slow
    (a neighbour locked to the pair rhythm). The binomial interval excluded 1; the verdict
    says the pairs are dependent and decides nothing."""
    orders = (True, False, False, True, True, False) * 2
    ratios = [0.5 if f else 2.0 for f in orders]
    ratios = [r * (1 + 0.01 * i) for i, r in enumerate(ratios)]
    c = _cmp(ratios, orders)
    assert c.verdict != stats.VERDICT_OK and "ran first" in c.reason
    for d in (c.decide_a_slower(1.0), c.decide_b_slower(1.0)):
        assert d.holds is None, d


def test_too_few_pairs_are_inconclusive_not_significant() -> None:
    c = _cmp([2.0, 2.1, 1.9, 2.0, 2.05, 1.95, 2.0])
    assert c.verdict == stats.VERDICT_INCONCLUSIVE and "too few" in c.reason
    assert c.decide_a_slower(1.0).holds is None


def test_compare_balances_the_order_in_every_two_pairs() -> None:
    c = perf.compare(lambda: None, lambda: None, pairs=20, order_seed=3)
    assert len(c.a_first) == 20
    assert all(c.a_first[i] != c.a_first[i + 1] for i in range(0, 20, 2))
    assert c.a_first != tuple(i % 2 == 0 for i in range(20))  # not a fixed rhythm


def test_block_size_is_not_fooled_by_a_preempted_probe() -> None:
    """A stall during the probe (a neighbour taking the CPU, planted as a 50 ms sleep in one
    call) made the old autorange pick a tiny block for one side only; the block size now
    comes from the fastest of several short probes."""
    calls = [0]

    def fn() -> None:
        calls[0] += 1
        if calls[0] == 3:
            time.sleep(0.05)

    block = Block(fn, "cpu")
    assert _autorange(block, 0.01) == 2  # fooled: 2 calls "lasted" 50 ms
    calls[0] = 0
    assert _calls_for(block, 0.01)[0] > 1000
