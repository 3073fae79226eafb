"""The gate fails on any increase of leaked bytes per step and names the allocating lines."""

from __future__ import annotations

import pytest

from perf.gate.kinds import sync_site_changes

TRAIN = """
import os
import torch
import perf

history = []

def test_train(perf_metrics):
    d = perf.simulated_device()
    x = torch.randn(16, device=d)
    leak = os.environ.get("LEAK") == "1"

    def step():
        loss = (x * 2).sum()
        if leak:
            history.append(loss)

    g = perf.memory_growth(step, d, steps=5)
    perf_metrics.record(
        "leak_bytes_per_step", g.growth_bytes_per_step, "bytes", tolerance=0.0,
        sites=g.sites_extra,
    )
"""

pytestmark = pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")


def test_bytes_sites_in_extra_are_compared():
    def metric(sites):
        return {
            "name": "leak_bytes_per_step",
            "value": 0,
            "unit": "bytes",
            "kind": "bytes",
            "extra": {
                "sites": {k: {"n": n, "function": "step", "code": "c"} for k, n in sites.items()}
            },
        }

    assert sync_site_changes(metric({}), metric({"t.py:3": 512}), key="sites") == (
        "t.py:3 in step `c` +512 (new)"
    )


def test_gate_fails_on_leaked_bytes_and_names_the_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # sim needs a CPU-only child
    pytester.makepyfile(test_train_leak=TRAIN)
    opts = ("-p", "no:cacheprovider", "-o", "perf_busy_cpu_fraction=1", "--perf-no-reference")
    pytester.runpytest_subprocess(*opts, "--benchmark-autosave").assert_outcomes(passed=1)
    monkeypatch.setenv("LEAK", "1")
    r = pytester.runpytest_subprocess(*opts, "--benchmark-compare")
    assert r.ret != 0
    r.stdout.fnmatch_lines(
        [
            "*leak_bytes_per_step*sites: test_train_leak.py:13 in step "
            "`loss = (x * 2).sum()` +2560 (new)*"
        ]
    )
