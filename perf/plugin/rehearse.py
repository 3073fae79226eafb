"""pytest glue of the CUDA rehearsal (:mod:`perf.core.rehearse`) and of the GPU pool
(:mod:`perf.core.gpu_pool`).

- ``--perf-rehearse-cuda[=N]`` (or ``PERF_REHEARSE_CUDA=N`` in the environment) reports N CUDA
  devices (default 1) in this pytest and every Python process it starts, installed before
  any conftest or test module is imported. A test (or a module at collection) that reaches
  the first real CUDA call is reported **skipped** with the reason "rehearsal: reached the
  first real CUDA call at file:line": an expected, visible outcome, never a pass.
  ``--perf-rehearse-stop`` ends the session there (exit 2, pytest's "Interrupted"), for
  drivers rehearsed up to their first real CUDA call.
- ``--perf-gpu-per-worker``: under pytest-xdist, each worker sees one GPU of the pool
  (``CUDA_VISIBLE_DEVICES``, set before conftests and test modules are imported).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from perf.core import gpu_pool, rehearse

REHEARSAL_KEY = pytest.StashKey[int]()
#: Set once a rehearsed pytest said so in its header: the pytests it starts (pytester's) stay
#: quiet, so their output is what it would be on the GPU box.
ANNOUNCED_ENV = "PERF_REHEARSE_CUDA_ANNOUNCED"
STOPPED_KEY = pytest.StashKey[str]()

# An inherited PERF_REHEARSE_CUDA (a child of a rehearsed process, an xdist worker) installs
# the fake now, before any conftest or test module; installing imports no torch.
_ENV_PROBLEM: str | None = None
try:
    rehearse.install_from_env()
except ValueError as _e:
    _ENV_PROBLEM = str(_e)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perf")
    group.addoption(
        "--perf-rehearse-cuda",
        nargs="?",
        const="1",
        default=None,
        metavar="N",
        help="Rehearse the GPU run on this box: report N CUDA devices (default 1, H100s) to "
        "this pytest and its Python children; a test that reaches a real CUDA call is skipped "
        "saying so. Use with --co to check a GPU job's collection. Also: PERF_REHEARSE_CUDA=N.",
    )
    group.addoption(
        "--perf-rehearse-stop",
        action="store_true",
        default=False,
        help="With the rehearsal: stop the session at the first test that reaches a real CUDA "
        "call (exit status 2).",
    )
    group.addoption(
        "--perf-gpu-per-worker",
        action="store_true",
        default=None,
        help="Under pytest-xdist: give each worker one GPU of the pool (CUDA_VISIBLE_DEVICES, "
        "worker K gets device K mod the pool's size); perf_timing tests then lock their GPU, "
        "not the whole session (default: ini perf_gpu_per_worker).",
    )
    parser.addini(
        "perf_gpu_per_worker", "default for --perf-gpu-per-worker", type="bool", default=False
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: Any, args: Any) -> None:
    """Before the first conftest: the rehearsal's fake, then this worker's GPU."""
    ns = early_config.known_args_namespace
    if _ENV_PROBLEM is not None:
        raise pytest.UsageError(_ENV_PROBLEM)
    spec = getattr(ns, "perf_rehearse_cuda", None)
    if spec is not None:
        try:
            n = rehearse.parse_count(spec)
        except ValueError:
            raise pytest.UsageError(
                f"--perf-rehearse-cuda={spec!r}: give the number of CUDA devices to report, "
                f"1 to {rehearse.MAX_DEVICES}, as --perf-rehearse-cuda=N (the = keeps a path "
                "after it a path)"
            ) from None
        rehearse.activate(n)
    early_config.stash[REHEARSAL_KEY] = rehearse.active()
    per_worker = getattr(ns, "perf_gpu_per_worker", None)
    if per_worker is None:
        per_worker = bool(early_config.getini("perf_gpu_per_worker"))
    if per_worker:
        try:
            gpu_pool.pin_this_worker(os.environ)
        except gpu_pool.PoolError as e:
            raise pytest.UsageError(f"--perf-gpu-per-worker: {e}") from None


def rehearsing(config: pytest.Config) -> int:
    """The rehearsal's device count in this run (0: a real run)."""
    return config.stash.get(REHEARSAL_KEY, 0)


def _skip(report: Any, reason: str, item: Any = None) -> None:
    path, line, _ = item.location if item is not None else (report.nodeid, None, "")
    report.outcome = "skipped"
    report.longrepr = (str(path), (line or 0) + 1 if line is not None else None, reason)


def _name_the_gpu(item: pytest.Item) -> None:
    """Each metric of a CUDA test says which physical GPU it came from (``extra["gpu"]``):
    in a pool every worker's tests are ``[cuda:0]``, on different GPUs."""
    from perf.plugin.core import perf_device_of
    from perf.plugin.metrics import ITEM_METRICS_KEY

    metrics = item.stash.get(ITEM_METRICS_KEY, None)
    dev = perf_device_of(item)
    if not metrics or dev is None or not dev.startswith("cuda"):
        return
    gpu: dict[str, Any] = {"device": dev, "physical": gpu_pool.physical(dev, os.environ)}
    try:
        import torch

        props = torch.cuda.get_device_properties(torch.device(dev))
        gpu.update(name=str(props.name), uuid=str(getattr(props, "uuid", "")))
    except (RuntimeError, AssertionError, rehearse.CudaRehearsalStop):
        pass
    for m in metrics:
        m.setdefault("extra", {}).setdefault("gpu", gpu)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Innermost (trylast): every other plugin sees the rehearsal's skip, never a failure to
    act on (perf's trace plugin would re-run a failing timing test under the profiler)."""
    if call.when == "teardown":
        _name_the_gpu(item)
    report = yield
    if call.excinfo is None or not rehearsing(item.config):
        return report
    reason = rehearse.reached_real_cuda(call.excinfo.value)
    if reason is not None and report.outcome == "failed":
        _skip(report, reason, item)
        if item.config.getoption("--perf-rehearse-stop") and STOPPED_KEY not in item.config.stash:
            item.config.stash[STOPPED_KEY] = reason
            item.session.shouldstop = f"{reason} (--perf-rehearse-stop)"
    return report


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """A module that reaches real CUDA at import is skipped at collection, saying so."""
    report = yield
    if report.failed and rehearsing(collector.config):
        text = str(getattr(report, "longreprtext", "") or "")
        reason: str | None = None
        if rehearse.CudaRehearsalStop.__name__ in text:
            line = next((ln for ln in text.splitlines() if rehearse.STOP_PREFIX in ln), "")
            reason = line[line.index(rehearse.STOP_PREFIX) :] if line else rehearse.STOP_PREFIX
        else:
            refused = [ln for ln in text.splitlines() if ln.startswith("E ")]
            hit = next(
                (ln for ln in refused if any(m in ln for m in rehearse.CPU_BUILD_ERRORS)), ""
            )
            if hit:
                reason = (
                    f"{rehearse.STOP_PREFIX} at import, which this CPU build of torch "
                    f"refused: {hit[1:].strip()}"
                )
        if reason is not None:
            report.outcome = "skipped"
            report.longrepr = (str(collector.path), None, reason)
    return report


def pytest_report_header(config: pytest.Config) -> list[str]:
    n = rehearsing(config)
    lines = []
    if n and not os.environ.get(ANNOUNCED_ENV):
        os.environ[ANNOUNCED_ENV] = "1"
        lines.append(
            f"perf: CUDA rehearsal: {n} simulated H100 device(s) reported "
            f"({rehearse.ENV}={n}); a test reaching a real CUDA call is skipped saying so"
        )
    pinned = os.environ.get(gpu_pool.PINNED_ENV)
    if pinned is not None:
        lines.append(f"perf: this worker's GPU: CUDA_VISIBLE_DEVICES={pinned}")
    return lines
