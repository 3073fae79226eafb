"""pytest glue for ``--perf-trace-dir=DIR``: a Chrome trace of each failing timing test.

- A test marked ``perf_timing`` (perf acts on its own, ``perf_``-prefixed markers only: a
  project's ``timing`` marker is the project's) runs with perf's measured-callable record on
  (:func:`perf.instruments.trace.arm`). When its call fails, right after the failure and
  before its fixtures are torn down, one call of each function its last ``perf.measure`` /
  ``perf.compare`` timed runs under ``torch.profiler``
  (:func:`perf.instruments.trace.trace_measured`); a test that measured nothing through perf
  is re-run whole instead (the note says which). The trace goes to
  ``DIR/failed__<test>.json``, capped in size (the note says when it was truncated). When a
  profiler session is already running, nothing is traced and the note says why.
- In a re-measuring child of the gate (:mod:`perf.gate.remeasure`, which passes this option on),
  every timing test it runs is a suspect: each is traced to ``DIR/suspect__<test>_<pid>.json``.
- At the end of the session the traces written during it are listed in the terminal and
  appended as links to ``--perf-report`` (and to ``$GITHUB_STEP_SUMMARY``).

A whole-test re-run gets a throwaway ``perf_metrics`` so the metrics of the timed run stay the
ones recorded. Tests using pytest-benchmark's ``benchmark`` fixture that measured nothing
through perf are not re-run (the fixture runs once per test).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

TIMING_MARKERS = ("perf_timing",)

_T0_KEY = pytest.StashKey[float]()
_NOTES_KEY = pytest.StashKey[list[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perf", "PyTorch performance properties (perf)")
    group.addoption(
        "--perf-trace-dir",
        metavar="DIR",
        default=None,
        help="Write a torch.profiler Chrome trace of each failing timing test (re-run once "
        "after its timed run) and of each gate suspect to DIR; the report links them.",
    )


def _trace_dir(config: pytest.Config) -> Path | None:
    d = config.getoption("--perf-trace-dir", None)
    return Path(d) if d else None


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_T0_KEY] = time.time()
    config.stash[_NOTES_KEY] = []
    d = _trace_dir(config)
    if d is not None and not hasattr(config, "workerinput"):
        problem = trace_dir_problem(d)
        if problem:
            raise pytest.UsageError(f"--perf-trace-dir {_show(d)}: {problem}")


def _show(path: Path) -> str:
    import shlex

    s = str(path)
    return shlex.quote(s) if s.isprintable() else repr(s)


def trace_dir_problem(d: Path) -> str | None:
    """Why traces cannot be written to ``d`` (None: they can), found before any test runs
    by creating the folder and a file in it: a test's failure must never be lost to an
    unwritable trace folder at the end."""
    import tempfile

    if d.exists() and not d.is_dir():
        return "exists and is not a directory"
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".perf-probe-", delete=True):
            pass
    except OSError as e:
        what = e.strerror or type(e).__name__
        return f"cannot write a trace there ({what}); pick a writable folder"
    return None


def _is_timing(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) is not None for m in TIMING_MARKERS)


class _Throwaway:
    """Stands in for the test node while the re-run records its metrics into the void."""

    def __init__(self, item: pytest.Item) -> None:
        self.user_properties: list[tuple[str, object]] = []
        self.stash = pytest.Stash()  # where perf.plugin.metrics.add_metric keeps a test's metrics
        self.get_closest_marker = item.get_closest_marker


def _rerun(item: pytest.Item) -> None:
    funcargs: dict[str, Any] = getattr(item, "funcargs", {})
    saved = funcargs.get("perf_metrics")
    if saved is not None:
        from perf.plugin.metrics import PerfMetrics

        funcargs["perf_metrics"] = PerfMetrics(_Throwaway(item))  # type: ignore[arg-type]
    try:
        item.runtest()
    finally:
        if saved is not None:
            funcargs["perf_metrics"] = saved


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Keep the callables perf.measure / perf.compare time in a traced timing test."""
    if _trace_dir(item.config) is not None and _is_timing(item):
        from perf.instruments import trace

        trace.arm()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    config = item.config
    d = _trace_dir(config)
    if d is None or rep.when != "call" or not _is_timing(item):
        return rep
    from perf.instruments import trace

    measured = trace.disarm()  # always: the record must not outlive the test
    child = bool(config.getoption("--perf-child-out", None))
    if not (rep.failed or child):
        return rep
    notes = config.stash[_NOTES_KEY]
    if not measured and "benchmark" in getattr(item, "fixturenames", ()):
        notes.append(f"not traced (uses the once-per-test `benchmark` fixture): {item.nodeid}")
        return rep
    reason = "suspect" if child else "failed"
    path = d / trace.trace_filename(item.nodeid, reason, str(os.getpid()) if child else "")
    try:
        if measured:
            res = trace.trace_measured(measured, path, nodeid=item.nodeid, reason=reason)
        else:
            res = trace.trace_call(lambda: _rerun(item), path, nodeid=item.nodeid, reason=reason)
    except trace.NotTraced as e:  # a profiler running already, a CUDA rehearsal
        notes.append(f"not traced ({e}): {item.nodeid}")
        return rep
    except OSError as e:  # the folder went away or filled up since start-up
        notes.append(f"trace of {item.nodeid} NOT written ({e.strerror or e}): {path}")
        return rep
    how = f"re-run ended with {res.rerun_error}" if res.rerun_error else "re-run passed"
    if not path.is_file():
        notes.append(f"trace of {item.nodeid} NOT written (the profiler wrote nothing): {path}")
        return rep
    cut = (
        f"; TRUNCATED: kept {res.kept_events} of {res.total_events} events" if res.truncated else ""
    )
    notes.append(
        f"trace of {item.nodeid} ({reason}; {res.what}; {how}; {res.duration_s:.1f} s{cut}): {path}"
    )
    return rep


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """After the gate (which wrote the report and ran any re-measuring children): link every
    trace written during this session."""
    config = session.config
    d = _trace_dir(config)
    if d is None or hasattr(config, "workerinput") or config.getoption("--perf-child-out", None):
        return
    from perf.instruments.trace import markdown_section, traces_since

    traces = traces_since(d, config.stash[_T0_KEY])
    if not traces:
        return
    notes = config.stash[_NOTES_KEY]
    report = config.getoption("--perf-report", None)
    if report:
        rp = Path(report)
        try:
            rp.parent.mkdir(parents=True, exist_ok=True)
            with open(rp, "a", encoding="utf-8") as fh:
                fh.write(markdown_section(traces, rp.parent.resolve()))
        except OSError as e:
            notes.append(f"trace links NOT added to --perf-report {rp}: {e.strerror or e}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(markdown_section(traces, None))
        except OSError as e:
            notes.append(f"trace links NOT added to $GITHUB_STEP_SUMMARY: {e.strerror or e}")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    d = _trace_dir(config)
    if d is None:
        return
    from perf.instruments.trace import traces_since

    notes = config.stash.get(_NOTES_KEY, [])
    traces = traces_since(d, config.stash[_T0_KEY])
    if not notes and not traces:
        return
    terminalreporter.section("perf traces")
    for line in notes:
        terminalreporter.write_line(line)
    for p in traces:
        terminalreporter.write_line(f"written: {p}")
