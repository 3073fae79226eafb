"""pytest glue: options, markers, fixtures and the metric channel. No measuring logic here.

Metrics recorded by a test ride on ``report.user_properties`` (key ``"perf_metric"``), which
pytest-xdist serialises back to the controller, so the controller sees every metric whether the
run was serial or parallel.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
import torch

from perf import devices as _devices
from perf.metrics import Metric, make_metric

USER_PROPERTY = "perf_metric"

#: nodeid -> {"outcome": str, "metrics": [metric dicts]}; filled on the controller.
RESULTS_KEY = pytest.StashKey[dict[str, dict[str, Any]]]()
DEVICES_KEY = pytest.StashKey[list[str]]()
SIZES_KEY = pytest.StashKey[list[int]]()

CUDA_SKIP_REASON = "needs CUDA: torch.cuda.is_available() is False on this machine"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perf", "PyTorch performance properties (perf)")
    group.addoption(
        "--perf-devices",
        default=None,
        help="Devices for the `device` fixture: comma list of cpu, cuda, cuda:N, mps, sim (the "
        "simulated accelerator of CPU-only boxes), all (default: ini perf_devices, else all "
        "devices present).",
    )
    group.addoption(
        "--perf-sizes",
        default=None,
        help="Sizes for the `tensor_size` fixture: comma list of positive integers, e.g. "
        "64,512,4096 (default: ini perf_sizes).",
    )
    parser.addini("perf_devices", "default for --perf-devices", default="all")
    parser.addini("perf_sizes", "default for --perf-sizes", default="64,512,2048")


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config) -> Any:
    # `pytest -n N` alone distributes test by test; switch to loadgroup so that the tests marked
    # `timing` (one xdist_group) share one worker and never time each other's noise. An explicit
    # --dist is left alone.
    opt = config.option
    if getattr(opt, "numprocesses", None) and getattr(opt, "dist", None) == "no":
        opt.dist = "loadgroup"
    return (yield)


def loadgroup_is_broken() -> bool:
    """pytest >= 9.2 with pytest-xdist <= 3.8: loadgroup silently stops grouping, because xdist
    still rewrites the legacy ``_nodeid`` field that pytest no longer reads
    (pytest-xdist#1386)."""
    try:
        from importlib.metadata import version

        xdist = tuple(int(p) for p in version("pytest-xdist").split(".")[:2])
    except Exception:
        return False
    return pytest.version_tuple[:2] >= (9, 2) and xdist <= (3, 8)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    # xdist workers re-parse the command line and never see the controller's choice above.
    node.workerinput["perf_dist"] = node.config.option.dist


def _share_cores(workers: int) -> None:
    """Give each xdist worker its share of the cores for torch's intra-op pool.

    ``-n 2`` on 2 cores with torch's default 2 threads per worker oversubscribes the CPU:
    OpenMP barriers wait for preempted threads and a 100-microsecond op takes tens of
    milliseconds (measured here: an Iris forward, 0.1 ms -> 25 ms). One share per worker is what
    torchrun does for its ranks. An explicit OMP_NUM_THREADS is respected.
    """
    if os.environ.get("OMP_NUM_THREADS") or workers < 1:
        return
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def parse_sizes(spec: str) -> list[int]:
    out: list[int] = []
    for raw in spec.split(","):
        tok = raw.strip().replace("_", "")
        if not tok:
            continue
        if not tok.isdigit() or int(tok) <= 0:
            raise ValueError(
                f"--perf-sizes: {raw.strip()!r} is not a size; a size is a positive integer "
                f"(e.g. --perf-sizes 64,512,4096)"
            )
        out.append(int(tok))
    if not out:
        raise ValueError("--perf-sizes names no size; give e.g. --perf-sizes 64,512,4096")
    return out


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "cuda(min_devices=1): needs CUDA (and at least min_devices GPUs); skipped with a reason "
        "naming CUDA where there is none.",
    )
    config.addinivalue_line(
        "markers",
        "timing: measures wall-clock time; kept on one xdist worker (deselect with "
        "-m 'not timing' for a counters-only run).",
    )
    config.addinivalue_line(
        "markers",
        "perf_tolerance(default=None, **per_metric): relative gate margin for this test's "
        "metrics, e.g. perf_tolerance(0.1, step_time_s=0.25).",
    )
    dev_spec = config.getoption("--perf-devices") or str(config.getini("perf_devices"))
    size_spec = config.getoption("--perf-sizes") or str(config.getini("perf_sizes"))
    try:
        config.stash[DEVICES_KEY] = _devices.parse_devices(dev_spec)
        config.stash[SIZES_KEY] = parse_sizes(size_spec)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if workerinput.get("perf_dist") == "loadgroup":
            config.option.loadgroup = True
        _share_cores(int(workerinput.get("workercount", 1)))
    if (
        workerinput is None
        and getattr(config.option, "dist", "no") == "loadgroup"
        and loadgroup_is_broken()
    ):
        config.issue_config_time_warning(
            pytest.PytestConfigWarning(
                "perf: tests marked `timing` are NOT kept to one xdist worker: pytest "
                f"{pytest.__version__} with this pytest-xdist ignores --dist loadgroup "
                "(pytest-xdist#1386). Run timing tests serially (pytest -m timing -p no:xdist) "
                "or use pytest<9.2."
            ),
            stacklevel=2,
        )
    config.stash[RESULTS_KEY] = {}
    config.pluginmanager.register(_Collector(config.stash[RESULTS_KEY]), "perf-collector")


def _cuda_need(item_or_def: Any) -> int | None:
    m = item_or_def.get_closest_marker("cuda")
    if m is None:
        return None
    return int(m.kwargs.get("min_devices", m.args[0] if m.args else 1))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    cfg = metafunc.config
    if "device" in metafunc.fixturenames:
        devs = cfg.stash[DEVICES_KEY]
        if _cuda_need(metafunc.definition) is not None:
            cuda = [d for d in devs if d.startswith("cuda")]
            params: list[Any] = (
                [torch.device(d) for d in cuda]
                if cuda
                else [pytest.param("cuda", marks=pytest.mark.skip(reason=CUDA_SKIP_REASON))]
            )
            ids = cuda or ["cuda"]
        else:
            params, ids = [_devices.make_device(d) for d in devs], devs
        metafunc.parametrize("device", params, ids=ids)
    if "tensor_size" in metafunc.fixturenames:
        sizes = cfg.stash[SIZES_KEY]
        metafunc.parametrize("tensor_size", sizes, ids=[f"n{s}" for s in sizes])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        need = _cuda_need(item)
        if need is not None and n_cuda < need:
            reason = (
                CUDA_SKIP_REASON
                if n_cuda == 0
                else f"needs {need} CUDA devices, this machine has {n_cuda}"
            )
            item.add_marker(pytest.mark.skip(reason=reason))
        if item.get_closest_marker("timing") is not None:
            callspec = getattr(item, "callspec", None)
            if callspec is not None and _devices.is_sim(callspec.params.get("device")):
                item.add_marker(pytest.mark.skip(reason=_devices.SIM_TIMING_SKIP_REASON))
            # With `--dist loadgroup` all timing tests share one worker and never run beside
            # each other; without xdist the marker is inert.
            item.add_marker(pytest.mark.xdist_group(TIMING_GROUP))


class PerfMetrics:
    """The ``perf_metrics`` fixture: attach named figures to the running test."""

    def __init__(self, node: pytest.Item) -> None:
        self._node = node
        self._names: set[str] = set()

    def record(
        self,
        name: str,
        value: Any,
        unit: str | None = None,
        *,
        tolerance: float | None = None,
        higher_is_better: bool | None = None,
        **extra: Any,
    ) -> Metric:
        """Record ``value`` (a number, a ``Timing`` or a ``Comparison``) under ``name``.

        ``tolerance`` is this metric's relative margin for the gate (0.05 = 5%). Extra keyword
        values (JSON types) are stored alongside. Raises ``ValueError`` on bad input.
        """
        if name in self._names:
            raise ValueError(f"metric {name!r} was already recorded by this test")
        marker = self._node.get_closest_marker("perf_tolerance")
        if tolerance is None and marker is not None:
            tolerance = marker.kwargs.get(
                name, marker.kwargs.get("default", marker.args[0] if marker.args else None)
            )
        m = make_metric(
            name,
            value,
            unit=unit,
            tolerance=tolerance,
            higher_is_better=higher_is_better,
            extra=extra,
        )
        self._names.add(name)
        self._node.user_properties.append((USER_PROPERTY, m.to_dict()))
        return m

    @property
    def recorded(self) -> list[Metric]:
        return [
            Metric.from_dict(v)  # type: ignore[arg-type]
            for k, v in self._node.user_properties
            if k == USER_PROPERTY
        ]


@pytest.fixture
def perf_metrics(request: pytest.FixtureRequest) -> PerfMetrics:
    """Record metrics for this test; they reach the summary and the baseline store."""
    return PerfMetrics(request.node)


TIMING_GROUP = "perf-timing"


_XDIST_GROUP_SUFFIX = re.compile(r"@[^\[\]/:@]+$")


def canonical_nodeid(nodeid: str) -> str:
    """The test id without xdist's ``@group`` suffix (``--dist loadgroup`` appends it), so
    serial and -n runs key their metrics alike."""
    return _XDIST_GROUP_SUFFIX.sub("", nodeid)


class _Collector:
    """Controller-side sink of the metrics that tests attach to their reports."""

    def __init__(self, results: dict[str, dict[str, Any]]) -> None:
        self.results = results

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.results.setdefault(
            canonical_nodeid(report.nodeid), {"outcome": "passed", "metrics": []}
        )
        if report.when == "call" or (report.when == "setup" and not report.passed):
            entry["outcome"] = report.outcome
        if report.when == "teardown":
            entry["metrics"] = [v for k, v in report.user_properties if k == USER_PROPERTY]
            if report.failed and entry["outcome"] == "passed":
                entry["outcome"] = "error"


def collected_metrics(config: pytest.Config) -> dict[str, dict[str, Any]]:
    """nodeid -> {"outcome", "metrics"} for every test that recorded a metric."""
    return {k: v for k, v in config.stash.get(RESULTS_KEY, {}).items() if v["metrics"]}


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    from perf.report import metrics_table

    results = collected_metrics(config)
    if not results:
        return
    terminalreporter.section("perf metrics")
    for line in metrics_table(results):
        terminalreporter.write_line(line)
