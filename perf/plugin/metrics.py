"""The metric channel: tests attach metric dicts (``perf_metrics`` fixture, :func:`add_metric`),
they travel on the teardown report as the attribute :data:`REPORT_ATTR` (serialised by
pytest-xdist like any report attribute, so the controller sees every metric whether the run
was serial or parallel, and JUnit XML, which writes ``user_properties``, is not touched), and
the controller keeps them with each test's outcome in the session
(:attr:`perf.plugin.session.PerfSession.results`). Its hooks and fixture are registered
from :data:`perf.plugin.pytest_plugins`."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest

from perf.plugin.guest import PERF_TOLERANCE
from perf.plugin.session import PerfSession, perf_session

if TYPE_CHECKING:
    from perf.store.metrics import Metric

#: Name of the report attribute that carries a test's metrics (list of metric dicts).
REPORT_ATTR = "perf_metrics"

#: The metrics a test recorded (metric dicts), on the item.
ITEM_METRICS_KEY = pytest.StashKey[list[dict[str, Any]]]()


def add_metric(item: pytest.Item, metric: dict[str, Any]) -> None:
    """Attach a metric dict to a running test (it travels on the test's teardown report)."""
    item.stash.setdefault(ITEM_METRICS_KEY, []).append(metric)


def item_metrics(item: pytest.Item) -> list[dict[str, Any]]:
    """The metric dicts a test recorded so far."""
    if ITEM_METRICS_KEY not in item.stash:
        return []
    recorded: list[dict[str, Any]] = item.stash[ITEM_METRICS_KEY]
    return list(recorded)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if call.when == "teardown" and ITEM_METRICS_KEY in item.stash:
        setattr(report, REPORT_ATTR, item_metrics(item))
    return report


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
        """Record ``value`` under ``name``: a number (``unit`` required), or an instrument's
        result, stored with its sites so a regression names its line (``SyncCount``,
        ``OpCount``, ``TransferCount``, ``CompileCount``, ``PeakMemory``, ``MemoryGrowth``,
        ``Timing``, ``Comparison``: :func:`perf.store.metrics.instrument_figure`).

        ``tolerance`` is this metric's relative margin for the gate (0.05 = 5%). Extra keyword
        values (JSON types) are stored alongside. Raises ``ValueError`` on bad input.
        """
        from perf.store.metrics import make_metric

        if name in self._names:
            raise ValueError(f"metric {name!r} was already recorded by this test")
        marker = self._node.get_closest_marker(PERF_TOLERANCE)
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
        add_metric(self._node, m.to_dict())
        return m

    @property
    def recorded(self) -> list[Metric]:
        from perf.store.metrics import Metric

        return [Metric.from_dict(v) for v in item_metrics(self._node)]


@pytest.fixture
def perf_metrics(request: pytest.FixtureRequest) -> PerfMetrics:
    """Record metrics for this test; they reach the summary and the baseline store."""
    return PerfMetrics(request.node)


_XDIST_GROUP_SUFFIX = re.compile(r"@[^\[\]/:@]+$")


def canonical_nodeid(nodeid: str) -> str:
    """The test id without xdist's ``@group`` suffix (``--dist loadgroup`` appends it to tests
    with an ``xdist_group`` mark), so serial and -n runs key their metrics alike."""
    return _XDIST_GROUP_SUFFIX.sub("", nodeid)


class Collector:
    """The controller's sink of the metrics tests attach to their reports, in its session
    (``pytest_runtest_logreport`` has no ``config`` argument, so this object, registered by
    :func:`pytest_configure` below, holds the session).

    Keeps each test's outcome, and the metrics of those that recorded any (a test's metrics
    arrive with its teardown report, after its call report)."""

    def __init__(self, session: PerfSession) -> None:
        self.results = session.results
        self.outcomes = session.outcomes
        self.session = session
        self._not_passed: dict[str, str] = {}

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """Collection errors (with --continue-on-collection-errors the run goes on) make a
        saved run partial."""
        if report.failed:
            self.session.collect_errors += 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        key = canonical_nodeid(report.nodeid)
        if report.when != "teardown":
            if not report.passed and (report.when == "call" or report.when == "setup"):
                self._not_passed[report.nodeid] = report.outcome
            # a test that started counts as run even if pytest.exit() in its body means no
            # teardown report follows
            self.outcomes[key] = self._not_passed.get(report.nodeid, "passed")
            return
        outcome = self._not_passed.pop(report.nodeid, "passed")
        if report.failed and outcome == "passed":
            outcome = "error"
        self.outcomes[key] = outcome
        metrics = getattr(report, REPORT_ATTR, None)
        if metrics:
            self.results[key] = {"outcome": outcome, "metrics": list(metrics)}


def pytest_configure(config: pytest.Config) -> None:
    s = perf_session(config)
    if not s.is_worker:  # the controller (or a serial run) collects; workers only send
        config.pluginmanager.register(Collector(s), "perf-collector")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    results = dict(perf_session(config).results)
    if not results:
        return  # no test recorded a metric: perf prints nothing
    from perf.report.text import metrics_table

    terminalreporter.section("perf metrics")
    for line in metrics_table(results):
        terminalreporter.write_line(line)
