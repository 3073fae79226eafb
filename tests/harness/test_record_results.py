"""Recording is one call: ``perf_metrics.record(name, result)`` takes each instrument's result
and stores its figure with its sites, so a regression names its line without the caller
passing ``sync_sites=`` (the old keyword forms keep working)."""

from __future__ import annotations

import pytest

from perf.instruments.compiles import CompileCount
from perf.instruments.leaks import LeakSite, MemoryGrowth
from perf.instruments.memory import PeakMemory
from perf.instruments.ops import OpCount
from perf.instruments.syncs import SyncCount
from perf.instruments.transfers import TransferCount
from perf.store.metrics import make_metric

SYNCS = SyncCount(
    3,
    {"aten::item": 3},
    by_site={"train.py:88": 3},
    site_function={"train.py:88": "train_step"},
    site_code={"train.py:88": "loss.item()"},
)
SITE = {"train.py:88": {"n": 3, "function": "train_step", "code": "loss.item()"}}


def test_a_sync_count_is_recorded_with_its_sites() -> None:
    m = make_metric("syncs", SYNCS)
    assert (m.value, m.unit, m.kind) == (3, "syncs", "count")
    assert m.extra == {"sync_sites": SITE}
    # the old keyword form stores the same metric
    assert make_metric("syncs", SYNCS.count, unit="syncs", extra={"sync_sites": SYNCS.sites}) == m


def test_each_instrument_result_is_one_figure() -> None:
    ops = make_metric("ops", OpCount(12, {"aten::mm": 12}))
    assert (ops.value, ops.unit) == (12, "ops")
    copies = make_metric("copies", TransferCount(2, 64, 1, 32, 0, 2, 0))
    assert (copies.value, copies.unit) == (3, "count")
    breaks = {"m.py:5": {"n": 1, "function": "f", "code": "if x.sum():", "what": "graph break"}}
    cc = CompileCount(2, 2, 1, {"branch": 1}, breaks, 0, {}, {})
    graph_breaks = make_metric("graph_breaks", cc)
    assert (graph_breaks.value, graph_breaks.extra) == (1, {"sites": breaks})
    peak = make_metric("peak", PeakMemory("sim", 4096, 1024, 1024, 8192))
    assert (peak.value, peak.unit, peak.kind) == (4096.0, "bytes", "bytes")
    site = LeakSite("loop.py:9", "step", "keep.append(x)", 2048, 2)
    growth = MemoryGrowth("sim", 2, 1, (1000, 2024, 3048), (site,))
    leak = make_metric("leak_bytes_per_step", growth, tolerance=0.0)
    assert (leak.value, leak.unit, leak.tolerance) == (1024.0, "bytes", 0.0)
    assert leak.extra == {"sites": growth.sites_extra}


def test_the_callers_own_unit_and_sites_win() -> None:
    m = make_metric("syncs", SYNCS, unit="count", extra={"sync_sites": {}})
    assert (m.unit, m.extra) == ("count", {"sync_sites": {}})


def test_a_peak_the_device_cannot_measure_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="metric 'peak': a PeakMemory of cpu has no peak"):
        make_metric("peak", PeakMemory("cpu", None, None, None, None))


def test_a_regression_recorded_as_a_result_names_its_line(pytester: pytest.Pytester) -> None:
    """End to end: the test records ``syncs`` (the result), never ``sync_sites=``; the gate's
    regression names the new line."""
    test = """
        from perf.instruments.syncs import SyncCount

        N = {n}

        def test_step(perf_metrics):
            sites = {{"train.py:88": N}} if N else {{}}
            perf_metrics.record("syncs", SyncCount(
                N, {{"aten::item": N}}, by_site=sites,
                site_function={{"train.py:88": "train_step"}},
                site_code={{"train.py:88": "loss.item()"}},
            ))
    """
    import textwrap

    args = ("-p", "no:cacheprovider", "--perf-no-reference")
    pytester.makepyfile(test_s=textwrap.dedent(test.format(n=0)))
    pytester.runpytest(*args, "--benchmark-autosave").assert_outcomes(passed=1)
    pytester.makepyfile(test_s=textwrap.dedent(test.format(n=2)))
    r = pytester.runpytest(*args, "--benchmark-compare")
    assert r.ret == pytest.ExitCode.TESTS_FAILED, r.stdout.str()
    r.stdout.fnmatch_lines(
        ["REGRESSIONS (1):*", "*train.py:88 in train_step `loss.item()` +2 (new)*"]
    )
