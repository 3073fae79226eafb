"""pytest-benchmark's ``benchmark`` fixture under perf: a synchronising timer on CUDA
devices (:func:`perf.plugin.gate.synchronizing_timer`), and, opted into by ini values the
session holds, its times as a perf metric (``perf_gate_benchmark``) or perf's fields in its
machine_info (``perf_machine_info``)."""

from __future__ import annotations

from typing import Any

import pytest

from perf.plugin.core import perf_device_of
from perf.plugin.gate import synchronizing_timer
from perf.plugin.metrics import add_metric, item_metrics
from perf.plugin.session import perf_session


def _on_cuda(item: pytest.Item) -> bool:
    """Runs on a CUDA device of perf's ``device`` fixture (a project's own parametrization
    is the project's business)."""
    dev = perf_device_of(item)
    return dev is not None and dev.startswith("cuda")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "benchmark" not in getattr(item, "fixturenames", ()) or not _on_cuda(item):
            continue
        mark = item.get_closest_marker("benchmark")
        kwargs = dict(mark.kwargs) if mark is not None else {}
        if "timer" not in kwargs:
            kwargs["timer"] = synchronizing_timer
            # prepend: pytest-benchmark reads only the closest `benchmark` marker
            item.add_marker(pytest.mark.benchmark(**kwargs), append=False)


#: pytest-benchmark may run ~10^5 rounds of a fast function; we keep an even subsample.
MAX_BENCHMARK_SAMPLES = 500


def _thin(data: list[float], k: int) -> list[float]:
    """Every n-th sample so at most ``k`` remain, spread over the whole run (drift stays)."""
    if len(data) <= k:
        return data
    step = len(data) / k
    return [data[int(i * step)] for i in range(k)]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """ini ``perf_gate_benchmark = true``: after the test body, the ``benchmark`` fixture's
    raw times become a metric."""
    res = yield
    if perf_session(item.config).gate_benchmark:
        _record_benchmark(item)
    return res


def _record_benchmark(item: pytest.Item) -> None:
    """The ``benchmark`` fixture's raw times (thinned) as the ``benchmark`` metric."""
    bm = getattr(item, "funcargs", {}).get("benchmark")
    meta = getattr(bm, "stats", None)
    data = list(getattr(getattr(meta, "stats", None), "data", []) or [])
    if data and not any(m.get("name") == "benchmark" for m in item_metrics(item)):
        from perf.core.stats import median
        from perf.store.metrics import make_metric

        mark = item.get_closest_marker("perf_tolerance")
        tol = None
        if mark is not None:
            tol = mark.kwargs.get(
                "benchmark", mark.kwargs.get("default", mark.args[0] if mark.args else None)
            )
        kept = _thin(data, MAX_BENCHMARK_SAMPLES)
        m = make_metric(
            "benchmark",
            median(data),
            unit="s",
            samples=kept,
            tolerance=tol,
            extra={"source": "pytest-benchmark", "rounds": len(data)},
        )
        add_metric(item, m.to_dict())


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(
    config: pytest.Config, machine_info: dict[str, Any]
) -> None:
    """ini ``perf_machine_info = true``: torch and GPU fields in pytest-benchmark's
    machine_info (off by default: pytest-benchmark warns when machine_info keys differ from
    a stored run's, e.g. one saved before perf was installed)."""
    if perf_session(config).machine_info:
        from perf.core.devices import fingerprint

        fp = fingerprint()
        machine_info["torch_version"] = fp["torch"]
        machine_info["torch_threads"] = fp["torch_threads"]
        machine_info["cuda_version"] = fp["cuda"]
        machine_info["cudnn_version"] = fp["cudnn"]
        machine_info["gpu_driver"] = fp["driver"]
        machine_info["gpus"] = fp["gpus"]
