"""Compile counts in the gate: a PR that adds a graph break fails, naming the line in the
terminal and in the Markdown report; one that removes a break passes as an improvement (one
project and three runs for both directions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from perf.gate.kinds import sync_site_changes

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


def _lines(out: str, patterns: list[str]) -> None:
    pytest.LineMatcher(out.splitlines()).fnmatch_lines(patterns)


def test_an_added_graph_break_fails_and_a_removed_one_passes_naming_its_line(
    tmp_path: Path,
) -> None:
    """One project, three runs (each a fresh pytest with torch.compile, ~5 s): one break
    saved; two breaks compared with it and saved (the added break fails); one break
    compared with that (the removed break passes as an improvement)."""
    (tmp_path / "test_model.py").write_text(MODEL.strip() + "\n")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GITHUB_STEP_SUMMARY", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")
    }

    def run(breaks: int, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", *OPTS, *args],
            cwd=tmp_path,
            env={**env, "BREAKS": str(breaks)},
            capture_output=True,
            text=True,
            timeout=300,
        )

    saved = run(1, "--benchmark-autosave")
    assert saved.returncode == 0, saved.stdout + saved.stderr

    # added: the regression names the new break's line, in the terminal and the report
    r = run(2, "--benchmark-compare", "--benchmark-autosave", "--perf-report=added.md")
    assert r.returncode == 1, r.stdout + r.stderr
    site = "test_model.py:19 in forward `if y.sum() > 0:` graph break (Data-dependent branching)"
    _lines(
        r.stdout,
        [
            "*REGRESSIONS*",
            "*test_train*graph_breaks*1 count*2 count*",
            f"*graph_breaks: counts are exact; sites: {site} +1 (new)*",
        ],
    )
    md = (tmp_path / "added.md").read_text()
    assert "### Regressions" in md
    # Markdown escapes the backticks and colons of the user's code line
    assert r"test\_model.py\:19 in forward \`if y.sum\(\) \> 0\:\` graph break" in md
    assert r"\(Data-dependent branching\) +1 \(new\)" in md

    # removed: compared with the latest run saved (the two-break one), an improvement
    r = run(1, "--benchmark-compare", "--perf-report=removed.md")
    assert r.returncode == 0, r.stdout + r.stderr
    _lines(
        r.stdout,
        [
            "*improvements*",
            "*graph_breaks: fewer sites: test_model.py:19 in forward `if y.sum() > 0:` "
            "graph break (Data-dependent branching) -1 (gone)*",
            "*perf gate passed*",
        ],
    )
    md = (tmp_path / "removed.md").read_text()
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
