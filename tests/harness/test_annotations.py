"""Feedback at the line: on GitHub Actions every regression with a site becomes an
``::error file=...,line=...::`` on that line, within GitHub's 10-per-step limit, worst first;
undecided timings become ``::warning`` lines. Pure parts tested on stored-run dicts, the whole
path with pytester and the real sync counter on ``sim``."""

from __future__ import annotations

import pytest
from _runs import metric, run, timed
from _sim import needs_sim

import perf.sim.device  # noqa: F401  (imported in the outer process: see test_sync_sites_gate)
from perf.gate.compare import compare_runs
from perf.gate.verdict import Policy
from perf.report.annotations import (
    PER_STEP,
    github_annotations,
    grown_sites,
    split_site,
    workspace_path,
)


def _syncs(sites: dict[str, int], code: str = "loss.item()") -> dict:
    return metric(
        "syncs",
        sum(sites.values()),
        "syncs",
        extra={
            "sync_sites": {k: {"n": n, "function": "f", "code": code} for k, n in sites.items()}
        },
    )


def test_sites_paths_and_growth():
    assert split_site("train.py:88") == ("train.py", 88)
    assert split_site("C:/x/train.py:7") == ("C:/x/train.py", 7)
    assert split_site("<unknown>") is None
    assert workspace_path("src/t.py", base="/ws", workspace="/ws") == "src/t.py"
    assert workspace_path("/ws/a/t.py", base="/elsewhere", workspace="/ws") == "a/t.py"
    assert workspace_path("/usr/lib/site.py", base="/ws", workspace="/ws") is None
    assert workspace_path("t.py", base="/ws/sub", workspace="/ws") == "sub/t.py"
    old, new = _syncs({"a.py:1": 2, "b.py:2": 1}), _syncs({"a.py:1": 3, "b.py:2": 1, "c.py:3": 5})
    assert [(s, d) for s, d, _ in grown_sites(old, new)] == [("c.py:3", 5), ("a.py:1", 1)]
    # no sites in the baseline: every site of the new run may be the cause
    assert [s for s, _, _ in grown_sites(metric("syncs", 0, "syncs"), new)] == [
        "c.py:3",
        "a.py:1",
        "b.py:2",
    ]


def _gate(old_tests: dict, new_tests: dict):
    base, cur = run(old_tests, name="base"), run(new_tests, name="head")
    return compare_runs(base, cur, Policy()), base, cur


GH = {"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": "/ws"}


def test_each_grown_site_is_an_error_on_its_line_worst_first():
    result, base, cur = _gate(
        {"t.py::a": [_syncs({"src/a.py:10": 1})], "t.py::b": [_syncs({"src/b.py:5": 4})]},
        {
            "t.py::a": [_syncs({"src/a.py:10": 1, "src/a.py:12": 9}, code="float(x)")],
            "t.py::b": [_syncs({"src/b.py:5": 5})],
        },
    )
    lines = github_annotations(result, base, cur, environ=GH, root="/ws", cwd="/ws")
    assert lines == [
        "::error file=src/a.py,line=12,title=perf syncs regression::t.py::a syncs: "
        "1 syncs -> 10 syncs, 10.000x; +9 syncs here `float(x)`",
        "::error file=src/b.py,line=5,title=perf syncs regression::t.py::b syncs: "
        "4 syncs -> 5 syncs, 1.250x; +1 syncs here `loss.item()`",
    ]
    assert github_annotations(result, base, cur, environ={}, root="/ws", cwd="/ws") == []


def test_regression_without_a_site_points_at_the_test_file_and_escapes_names():
    evil = "tests/t.py::x[\r\n::add-mask::y,%]"
    result, base, cur = _gate(
        {evil: [metric("peak", 1000, "bytes")]}, {evil: [metric("peak", 2000, "bytes")]}
    )
    (line,) = github_annotations(result, base, cur, environ=GH, root="/ws", cwd="/ws")
    assert line.startswith("::error file=tests/t.py,title=perf peak regression::tests/t.py")
    assert "\n" not in line and "\r" not in line and "%25" in line
    assert "x[\\x0d\\x0a::add-mask" in line  # no new line: '::add-mask' stays inside the message


def test_more_than_ten_keeps_the_worst_nine_and_a_summary():
    sites_old = {f"src/m.py:{i}": 1 for i in range(1, 16)}
    sites_new = {f"src/m.py:{i}": 1 + i for i in range(1, 16)}
    result, base, cur = _gate({"t.py::a": [_syncs(sites_old)]}, {"t.py::a": [_syncs(sites_new)]})
    lines = github_annotations(result, base, cur, environ=GH, root="/ws", cwd="/ws")
    assert len(lines) == PER_STEP
    assert [ln.split(",")[1] for ln in lines[:9]] == [f"line={i}" for i in range(15, 6, -1)]
    assert lines[-1] == (
        "::error title=perf gate::perf gate: 6 more regression line(s) not annotated (GitHub "
        "shows 10 per step): see the perf gate section of the job log or the Markdown report"
    )


def test_undecided_timings_are_warnings_on_their_test_files():
    old = {f"tests/t{i}.py::x": [timed("step_s", 1e-3, seed=i)] for i in range(12)}
    new = {f"tests/t{i}.py::x": [timed("step_s", 1.1e-3, seed=50 + i)] for i in range(12)}
    result, base, cur = _gate(old, new)
    und = result.undecided
    assert und, "the fixture must give undecided timings"
    lines = github_annotations(result, base, cur, environ=GH, root="/ws", cwd="/ws")
    warnings = [ln for ln in lines if ln.startswith("::warning")]
    assert len(warnings) <= PER_STEP
    assert warnings[-1].startswith("::warning title=perf gate::perf gate: ")
    assert all(w.startswith("::warning file=tests/t") for w in warnings[:-1])


TRAIN = """
import torch
import perf

def train(extra):
    x = torch.randn(4, device=perf.simulated_device())
    for i in range(10):
        loss = (x * i).sum()
        loss.item()
        if extra:
            float(loss)

def test_train(perf_metrics):
    import os
    with perf.count_syncs() as s:
        train(os.environ.get("EXTRA") == "1")
    perf_metrics.record("syncs", s.count, "syncs", sync_sites=s.sites)
"""

pytestmark = pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")


@needs_sim  # the inner run is in this process
def test_plugin_annotates_the_new_sync_on_github_actions(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("GITHUB_STEP_SUMMARY", "PYTEST_XDIST_WORKER", "GITHUB_ACTIONS"):
        monkeypatch.delenv(var, raising=False)
    pytester.mkpydir("pkg")
    pytester.path.joinpath("pkg", "test_train_sim.py").write_text(TRAIN)
    opts = ("-p", "no:cacheprovider", "-o", "perf_busy_cpu_fraction=1", "--perf-no-reference")
    pytester.runpytest(*opts, "--benchmark-autosave").assert_outcomes(passed=1)
    monkeypatch.setenv("EXTRA", "1")
    r = pytester.runpytest(*opts, "--benchmark-compare")
    assert r.ret != 0
    assert "::error" not in r.stdout.str()  # not on GitHub Actions: no workflow commands
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKSPACE", str(pytester.path))
    r = pytester.runpytest(*opts, "--benchmark-compare")
    assert r.ret != 0
    errors = [ln for ln in r.outlines if ln.startswith("::error")]
    assert errors == [
        "::error file=pkg/test_train_sim.py,line=11,title=perf syncs regression::"
        "pkg/test_train_sim.py::test_train syncs: 10 syncs -> 20 syncs, 2.000x; "
        "+10 syncs here `float(loss)`"
    ]
