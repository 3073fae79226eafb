"""A modelled GPU time gates like a count: deterministic, compared by value with a small
stated tolerance, and a regression names the line whose modelled time grew and its bound."""

from __future__ import annotations

import json

import pytest
from _sim import needs_sim

# Imported here, in the outer process: pytester's in-process runs drop modules they imported,
# and a second import of the simulated device would register its kernels with torch twice.
import perf.instruments.gpu_model  # imports torch.utils.flop_counter too
import perf.sim.device  # noqa: F401
from perf.gate.compare import compare_runs
from perf.gate.modelled import MODELLED_TOLERANCE, compare_modelled, model_site_changes
from perf.instruments.gpu_targets import get_target
from perf.report.text import format_value
from perf.store.metrics import kind_of, make_metric


def _m(value: float, sites: dict[str, tuple[float, str, str]], target: str = "H100 SXM") -> dict:
    extra = {
        "target": target,
        "model_sites": {
            k: {"modelled_s": s, "bound": b, "op": op, "launches": 1, "function": "f", "code": ""}
            for k, (s, b, op) in sites.items()
        },
    }
    return make_metric("gpu_time", value, unit="modelled_s", extra=extra).to_dict()


def test_modelled_seconds_are_their_own_deterministic_kind() -> None:
    assert kind_of("modelled_s") == "modelled"
    assert MODELLED_TOLERANCE == 0.01
    assert format_value(0.0019, "modelled_s") == "1.900 ms (modelled)"
    with pytest.raises(ValueError, match="cannot be negative"):
        make_metric("gpu_time", -1.0, unit="modelled_s")


def test_a_regression_names_the_site_its_op_change_and_bound() -> None:
    other_site = {"model.py:50": (9e-4, "compute", "mm bf16")}
    old = _m(0.001, {"model.py:41": (0.0001, "launch", "mm bf16"), **other_site})
    new = _m(0.0029, {"model.py:41": (0.002, "compute", "mm fp32"), **other_site})
    r = compare_modelled("t::x", json.loads(json.dumps(old)), json.loads(json.dumps(new)))
    assert r.status == "regression" and r.kind == "modelled" and r.margin == MODELLED_TOLERANCE
    assert r.sites == "model.py:41 mm bf16 → fp32: compute-bound (before: launch-bound), +1.9 ms"
    assert "model.py:50" not in r.reason
    back = compare_modelled("t::x", new, old)
    assert back.status == "improvement"
    assert back.sites == "model.py:41 mm fp32 → bf16: launch-bound (before: compute-bound), -1.9 ms"
    # within the margin: unchanged; another target: refused, never compared
    assert compare_modelled("t::x", old, _m(0.001005, {})).status == "unchanged"
    other = compare_modelled("t::x", old, _m(0.001, {}, target="A100"))
    assert other.status == "refused" and "A100" in other.reason
    # a new site
    grown = _m(
        0.0012, {"model.py:41": (1e-4, "launch", "mm bf16"), "loop.py:3": (2e-4, "sync", "item")}
    )
    assert model_site_changes(old, grown).startswith("loop.py:3 item: sync-bound, +0.2 ms (new)")


def test_two_versions_of_the_model_are_never_compared() -> None:
    # a baseline stored before the model carried a version is version 1; its host figures
    # were five times cheaper, so comparing it would call every launch-bound test faster
    from perf.instruments.gpu_targets import MODEL_VERSION
    from perf.instruments.gpu_timeline import OpEvent, simulate

    extra = simulate([OpEvent("kernel", "mm")], get_target("H100 SXM")).metric_extra
    assert extra["model"] == MODEL_VERSION == 3
    now = _m(0.001, {})
    now["extra"]["model"] = MODEL_VERSION
    v1 = _m(0.0002, {})  # stored without a version
    r = compare_modelled("t::x", v1, now)
    assert r.status == "refused"
    assert r.reason == (
        "modelled by version 1 of perf's GPU model in the baseline, by version 3 now (its "
        "figures changed: docs/gpu-model.md): not comparable; record the baseline again"
    )
    same = json.loads(json.dumps(now))
    assert compare_modelled("t::x", same, now).status == "unchanged"


def test_compare_runs_gates_modelled_times_across_machines() -> None:
    from perf.store.runs import Run

    def run(value: float, cpu: str) -> Run:
        tests = {"t::x": {"outcome": "passed", "metrics": [_m(value, {})]}}
        return Run(None, None, "r", cpu, "2026-01-01", {}, {"cpu_model": cpu}, tests)

    res = compare_runs(run(0.001, "cpu A"), run(0.002, "cpu B")).results
    assert [(r.kind, r.status) for r in res] == [("modelled", "regression")]


TRAIN = """
import os
import torch
import perf

def step(x, w):
    return x @ w

def test_model(perf_metrics):
    dtype = getattr(torch, os.environ.get("DTYPE", "bfloat16"))
    d = perf.simulated_device()
    x = torch.ones(1024, 1024, device=d, dtype=dtype)
    with perf.model_gpu_time(d) as t:
        for _ in range(4):
            step(x, x)
    perf_metrics.record("gpu_time", t.total_s, "modelled_s", **t.metric_extra)
"""

pytestmark = pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")


@needs_sim  # the inner run is in this process
def test_changing_a_matmul_to_fp32_fails_the_gate_naming_the_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makepyfile(test_model_sim=TRAIN)
    opts = ("-p", "no:cacheprovider", "-o", "perf_busy_cpu_fraction=1", "--perf-no-reference")
    pytester.runpytest(*opts, "--benchmark-autosave").assert_outcomes(passed=1)
    same = pytester.runpytest(*opts, "--benchmark-compare")
    assert same.ret == 0, same.stdout.str()[-3000:]
    monkeypatch.setenv("DTYPE", "float32")
    r = pytester.runpytest(*opts, "--benchmark-compare")
    assert r.ret != 0
    # per matmul: bf16 2 x 1024^3 / (989.4 TF x 0.75) = 2.9 us < the host's 34.5 us (launch-
    # bound); fp32 / (67 TF x 0.75) = 42.7 us (compute-bound): 4 x (42.7 - 34.5) = +32.9 us
    r.stdout.fnmatch_lines(
        [
            "*test_model*gpu_time*(modelled)*",
            "*test_model_sim.py:6 mm bf16 → fp32: compute-bound (before: launch-bound), +32.9 us*",
        ]
    )
