"""Compile counts in the gate: a PR that adds a graph break fails, naming the line in the
terminal and in the Markdown report; one that removes a break passes as an improvement."""

from __future__ import annotations

import pytest

from perf.gate.compare import sync_site_changes

pytestmark = pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")

MODEL = """
import os
import torch
import perf

BREAKS = int(os.environ.get("BREAKS", "0"))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(8, 8)
        self.l2 = torch.nn.Linear(8, 2)

    def forward(self, x):
        y = self.l1(x)
        if BREAKS >= 1:
            print("y")
        if BREAKS >= 2:
            if y.sum() > 0:
                y = torch.relu(y)
        return self.l2(y)


def test_train(perf_metrics):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(4, 8)
    with perf.count_compiles() as c:
        for _ in range(2):
            compiled(x).sum().backward()
    c.record(perf_metrics)
"""

OPTS = ("-p", "no:cacheprovider", "-o", "perf_busy_cpu_fraction=1", "--perf-no-reference")


def _run(pytester: pytest.Pytester, breaks: int, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_model=MODEL)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BREAKS", str(breaks))
        return pytester.runpytest_subprocess(*OPTS, *args)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


def test_an_added_graph_break_fails_and_names_its_line(
    pytester: pytest.Pytester, clean_env: None
) -> None:
    _run(pytester, 1, "--benchmark-autosave").assert_outcomes(passed=1)
    report = pytester.path / "perf.md"
    r = _run(pytester, 2, "--benchmark-compare", f"--perf-report={report}")
    assert r.ret != 0
    site = "test_model.py:19 in forward `if y.sum() > 0:` graph break (Data-dependent branching)"
    r.stdout.fnmatch_lines(
        [
            "*REGRESSIONS*",
            "*test_train*graph_breaks*1 count*2 count*",
            f"*graph_breaks: counts are exact; sites: {site} +1 (new)*",
        ]
    )
    md = report.read_text()
    assert "### Regressions" in md
    # Markdown escapes the backticks and colons of the user's code line
    assert r"test\_model.py\:19 in forward \`if y.sum\(\) \> 0\:\` graph break" in md
    assert r"\(Data-dependent branching\) +1 \(new\)" in md


def test_a_removed_graph_break_passes_as_an_improvement(
    pytester: pytest.Pytester, clean_env: None
) -> None:
    _run(pytester, 2, "--benchmark-autosave").assert_outcomes(passed=1)
    report = pytester.path / "perf.md"
    r = _run(pytester, 1, "--benchmark-compare", f"--perf-report={report}")
    assert r.ret == 0, r.stdout.str()
    r.stdout.fnmatch_lines(
        [
            "*improvements*",
            "*graph_breaks: fewer sites: test_model.py:19 in forward `if y.sum() > 0:` "
            "graph break (Data-dependent branching) -1 (gone)*",
            "*perf gate passed*",
        ]
    )
    md = report.read_text()
    assert "### Improvements" in md and "-1 \\(gone\\)" in md


def _m(sites: dict[str, int] | None, key: str = "sites") -> dict:
    m: dict = {"name": "graph_breaks", "value": 0, "unit": "count", "kind": "count"}
    if sites is not None:
        m["extra"] = {
            key: {
                k: {"n": n, "function": "forward", "code": "x.item()", "what": "graph break (t)"}
                for k, n in sites.items()
            }
        }
    return m


def test_site_changes_name_what_happened_and_what_is_gone() -> None:
    old, new = _m({"m.py:5": 1}), _m({"m.py:5": 2, "m.py:9": 1})
    assert sync_site_changes(old, new, key="sites") == (
        "m.py:5 in forward `x.item()` graph break (t) +1; "
        "m.py:9 in forward `x.item()` graph break (t) +1 (new)"
    )
    assert sync_site_changes(new, old, key="sites", fewer=True) == (
        "m.py:5 in forward `x.item()` graph break (t) -1; "
        "m.py:9 in forward `x.item()` graph break (t) -1 (gone)"
    )
    assert sync_site_changes(old, old, key="sites") == ""
    assert sync_site_changes(old, old, key="sites", fewer=True) == ""
    assert sync_site_changes(_m(None), new, key="sites") == (
        "the baseline has no sites to compare with"
    )
    assert sync_site_changes(new, _m(None), key="sites", fewer=True) == ""
