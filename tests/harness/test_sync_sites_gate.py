"""A failing sync count names the call sites that are new or more frequent than in the
baseline: what turns a red build into a one-line fix."""

from __future__ import annotations

import json

import pytest
from _sim import needs_sim

# Imported here, in the outer process: pytester's in-process runs drop modules they imported,
# and a second import of the simulated device would register its kernels with torch twice.
import perf.sim.device  # noqa: F401
from perf.gate.kinds import sync_site_changes

TRAIN = """
import os
import torch
import perf

def train(steps, every, extra):
    x = torch.randn(4, device=perf.simulated_device())
    for i in range(steps):
        loss = (x * i).sum()
        if i % every == 0:
            loss.item()
        if extra:
            float(loss)

def test_train(perf_metrics):
    every, extra = int(os.environ.get("EVERY", "10")), os.environ.get("EXTRA") == "1"
    with perf.count_syncs() as s:
        train(100, every, extra)
    perf_metrics.record("syncs", s.count, "syncs", sync_sites=s.sites)
"""


def _metric(sites: dict[str, int] | None, value: int = 0) -> dict:
    m: dict = {"name": "syncs", "value": value, "unit": "syncs", "kind": "count"}
    if sites is not None:
        m["extra"] = {
            "sync_sites": {
                k: {"n": n, "function": "step", "code": "loss.item()"} for k, n in sites.items()
            }
        }
    return m


def test_site_changes_list_new_and_grown_sites_most_first():
    old = _metric({"train.py:88": 5, "train.py:90": 3, "train.py:95": 2})
    new = _metric({"train.py:88": 25, "train.py:90": 3, "train.py:95": 1, "eval.py:7": 4})
    assert sync_site_changes(old, new) == (
        "train.py:88 in step `loss.item()` +20; eval.py:7 in step `loss.item()` +4 (new)"
    )
    assert sync_site_changes(old, old) == ""
    assert sync_site_changes(_metric(None), new) == "the baseline has no sync sites to compare with"
    assert sync_site_changes(old, _metric(None)) == ""
    many = _metric({f"t.py:{i}": 1 for i in range(12)})
    assert sync_site_changes(_metric({}), many, limit=3).endswith("; and 9 more")
    # The extra data survives JSON, as in a stored run.
    assert sync_site_changes(json.loads(json.dumps(old)), json.loads(json.dumps(new)))


pytestmark = pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")


@needs_sim  # the inner run is in this process
def test_gate_failure_names_the_new_sync_sites(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makepyfile(test_train_sim=TRAIN)
    opts = ("-p", "no:cacheprovider", "-o", "perf_busy_cpu_fraction=1", "--perf-no-reference")
    pytester.runpytest(*opts, "--benchmark-autosave").assert_outcomes(passed=1)
    monkeypatch.setenv("EVERY", "2")
    monkeypatch.setenv("EXTRA", "1")
    r = pytester.runpytest(*opts, "--benchmark-compare")
    assert r.ret != 0
    r.stdout.fnmatch_lines(
        [
            "*test_train*syncs*10*150*",
            "*sync sites: test_train_sim.py:12 in train `float(loss)` +100 (new); "
            "test_train_sim.py:10 in train `loss.item()` +40*",
        ]
    )
