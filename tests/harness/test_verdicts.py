"""The four verdicts (issue 28) on recorded samples: every path of the stored gate, the typed
vocabulary shared with ``perf.compare``, the reports' UNDECIDED section and ordered intervals.
No clocks: every sample is written here."""

from __future__ import annotations

import math

import pytest
from _runs import metric, run, timed

from perf.core.verdicts import Reason, TimedVerdict, Verdict, classify, judge
from perf.gate import compare as g
from perf.gate.dispersion import dispersion, noisy_metrics
from perf.gate.verdict import GateResult, MetricResult
from perf.report.text import gate_markdown, gate_table, undecided_annotation

T = "t.py::test_step"
#: The issue's dispersed baseline: four samples at 2.1 ms, three at 11.6-14.0 ms (a loaded
#: 2-core box), and the step made 3x slower in code: seven samples at 6.1 ms.
DISPERSED = [2.1e-3] * 4 + [11.6e-3, 12.5e-3, 14.0e-3]
SLOWER = [6.1e-3, 6.1e-3, 6.12e-3, 6.1e-3, 6.15e-3, 6.1e-3, 6.11e-3]


def _one(old: dict, new: dict, **kw: object) -> MetricResult:
    (r,) = g.compare_runs(run({T: [old]}), run({T: [new]}, **kw)).results  # type: ignore[arg-type]
    return r


def test_classify_inside_beyond_straddling_and_below() -> None:
    assert classify(0.95, 1.05, 0.10) is Verdict.UNCHANGED  # inside both ways: equivalence
    assert classify(1.15, 1.30, 0.10) is Verdict.REGRESSION
    assert classify(0.70, 0.85, 0.10) is Verdict.IMPROVEMENT
    assert classify(1.05, 1.20, 0.10) is Verdict.UNDECIDED  # straddles the upper edge
    assert classify(0.50, 2.90, 0.10) is Verdict.UNDECIDED  # so wide it tells nothing
    assert classify(-math.inf, math.inf, 0.10) is Verdict.UNDECIDED
    # a speed-up (higher is better): a lower ratio is the regression
    assert classify(0.70, 0.85, 0.10, higher_is_better=True) is Verdict.REGRESSION
    assert classify(1.20, 1.05, 0.10) is Verdict.UNDECIDED  # ends given reversed: ordered


def test_timed_verdicts_are_ordered_and_say_why_as_data() -> None:
    v = judge(1.18, (1.47, 0.95), 0.10)  # handed over reversed
    assert v.ci == (0.95, 1.47) and v.verdict is Verdict.UNDECIDED
    assert v.reason is Reason.STRADDLES
    assert v.text().startswith("undecided (straddles the margin): 1.180x [0.950, 1.470]")
    assert judge(1.0, None, 0.1).reason is Reason.NO_INTERVAL
    with pytest.raises(ValueError, match="not ordered"):
        TimedVerdict(Verdict.UNCHANGED, Reason.INTERVAL, 1.0, 1.1, 0.9, 0.1)
    assert Verdict.UNDECIDED == "undecided"  # compares equal to the status strings


def test_interval_inside_the_margin_is_unchanged() -> None:
    r = _one(timed("step_s", 1e-3), timed("step_s", 1.01e-3, seed=1))
    assert r.status == "unchanged" and r.timed.verdict is Verdict.UNCHANGED
    lo, hi = r.ci
    assert 1 / 1.1 <= lo <= hi <= 1.1


def test_interval_beyond_the_margin_is_a_regression() -> None:
    r = _one(timed("step_s", 1e-3), timed("step_s", 1.3e-3, seed=1))
    assert r.status == "regression" and r.ci[0] > 1.1


def test_interval_straddling_the_margin_is_undecided_never_unchanged() -> None:
    """The issue's case: a 2.9x slower median against a dispersed baseline used to pass as
    "unchanged: 1 metrics"."""
    old = metric("step_s", 2.1e-3, "s", samples=DISPERSED)
    new = metric("step_s", 6.1e-3, "s", samples=SLOWER)
    r = _one(old, new, reference=None)
    assert r.status == "undecided", r.reason
    assert r.timed.reason is Reason.STRADDLES
    lo, hi = r.ci
    assert lo < 1.1 < hi  # the interval leaves the margin: never "unchanged"
    res = g.compare_runs(run({T: [old]}), run({T: [new]}, reference=None))
    assert not res.unchanged and res.undecided and not res.failed
    assert g.suspects(res) == {}  # not re-measured in this tree: settled against the commit


def test_dispersed_samples_are_flagged_with_the_rule() -> None:
    why = dispersion(DISPERSED, 0.10)
    assert why is not None and "bootstrap interval of its q25" in why
    assert "3 of 7 samples above x1.5" in why
    assert dispersion(SLOWER, 0.10) is None
    assert dispersion([1e-3] * 3, 0.10) is None  # too few to bootstrap: "no interval" later
    tests = {
        T: {"outcome": "passed", "metrics": [metric("step_s", 2.1e-3, "s", samples=DISPERSED)]}
    }
    assert list(noisy_metrics(tests, 0.10)) == [(T, "step_s")]


def test_a_noisy_baseline_is_said_in_every_comparison() -> None:
    old = {**metric("step_s", 1e-3, "s", samples=[1e-3] * 10), "noisy": "dispersed"}
    r = _one(old, timed("step_s", 1.0e-3, seed=1))
    assert r.noisy == "dispersed" and "baseline is flagged noisy (dispersed)" in r.reason


def test_compare_judges_with_the_same_vocabulary() -> None:
    from perf.instruments.timing import Comparison, Timing

    t = Timing((1e-3,) * 24, 1, "cpu")
    same = Comparison(t, t, tuple(1.0 + 0.001 * ((i % 3) - 1) for i in range(24)), 0.95)
    assert same.judge(0.10).verdict is Verdict.UNCHANGED
    slower = Comparison(t, t, tuple(1.5 + 0.001 * (i % 3) for i in range(24)), 0.95)
    assert slower.judge(0.10).verdict is Verdict.REGRESSION
    d = slower.decide_a_slower(2.0)
    assert d.holds is False and d.code is Reason.INTERVAL
    few = Comparison(t, t, (1.0, 1.1, 0.9), 0.95)
    assert few.judge().reason is Reason.NO_INTERVAL
    assert few.decide_a_slower().holds is None and few.decide_a_slower().code is Reason.NO_INTERVAL


def _undecided_result() -> GateResult:
    old = metric("step_s", 2.1e-3, "s", samples=DISPERSED)
    new = metric("step_s", 6.1e-3, "s", samples=SLOWER)
    res = g.compare_runs(run({T: [old]}), run({T: [new]}, reference=None))
    (r,) = res.results
    from dataclasses import replace

    return replace(res, results=(replace(r, interleaved_ci=(1.3, 2.4)),))


def test_reports_have_an_undecided_section_with_both_intervals() -> None:
    res = _undecided_result()
    lines = gate_table(res)
    text = "\n".join(lines)
    assert any(line.startswith("UNDECIDED (1):") for line in lines)
    assert "interleaved head/base" in text and "[1.300, 2.400]" in text
    assert not any(line.startswith("unchanged") for line in lines)
    assert lines[-1].endswith("0 unchanged, 1 undecided")
    md = gate_markdown(res)
    assert "### UNDECIDED" in md and "undecided" in md.splitlines()[2]
    assert "[1.300, 2.400]" in md.replace("\\", "")
    note = undecided_annotation(res)
    assert note.startswith("::warning title=perf gate::perf gate: 1 timing(s) UNDECIDED")


def test_every_printed_interval_is_ordered_and_belongs_to_its_ratio() -> None:
    """Issue 28 printed ``1.002x [1.014, 0.991]``: the table sorts, and a verdict's own
    interval is checked when it is built."""
    from dataclasses import replace

    (r,) = _undecided_result().results
    flipped = replace(r, ci=(r.ci[1], r.ci[0]))
    row = next(line for line in gate_table(GateResult("b", "c", (flipped,))) if "x [" in line)
    lo, hi = (float(x) for x in row.split("x [")[1].split("]")[0].split(", "))
    assert lo <= hi


def test_compile_time_is_its_own_kind_and_cold_is_not_compared_with_warm() -> None:
    """Issue 28: a 10x jump in compile_s (cold vs warm Inductor cache) was "unchanged"."""
    cold = metric("compile_s", 10.0, "compile_s", extra={"cache": "cold"})
    warm = metric("compile_s", 1.0, "compile_s", extra={"cache": "warm"})
    r = _one(cold, warm)
    assert r.kind == "compile" and r.status == "refused" and "cold" in r.reason
    slower = metric("compile_s", 10.0, "compile_s", extra={"cache": "warm"})
    assert _one(warm, slower).status == "regression"
    assert _one(warm, warm).status == "unchanged"
    res = g.compare_runs(run({T: [warm]}), run({T: [slower]}))
    assert g.suspects(res) == {}  # never a reason to re-run a test


def test_a_failed_childs_output_is_kept_in_a_folder_the_verdict_names(tmp_path) -> None:
    import subprocess

    from perf.gate.against import keep_output

    proc = subprocess.CompletedProcess(["x"], 1, stdout="E   boom\n", stderr="trace\n")
    kept: list = []
    path = keep_output(kept, "001_base.log", ["python", "-m", "pytest", "t.py"], proc)
    assert path.parent.name.startswith("perf-against-failed-") and path.exists()
    text = path.read_text()
    assert "$ python -m pytest t.py" in text and "E   boom" in text and "trace" in text
    assert keep_output(kept, "002_head.log", ["x"], proc).parent == path.parent
    import shutil

    shutil.rmtree(path.parent)


def test_measure_reports_samples_judged_preempted() -> None:
    from perf.instruments.timing import Timing, preempted_count

    assert preempted_count(tuple(DISPERSED)) == 3  # above 1.5x the 10th percentile
    assert preempted_count(tuple(SLOWER)) == 0
    t = Timing(tuple(DISPERSED), 1, "cpu", "step", preempted_count(tuple(DISPERSED)))
    assert "3 judged preempted" in str(t)
