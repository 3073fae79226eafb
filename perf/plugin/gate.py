"""pytest hooks of the baseline store and the gate, riding on pytest-benchmark's options; they
hand off to the session (:class:`perf.plugin.session.PerfSession`).

- ``--benchmark-autosave`` / ``--benchmark-save=NAME``: also store every perf metric (with raw
  samples) under ``<benchmark-storage>/perf/<machine>/NNNN_<name>.json``; on the xdist
  controller only, also when no test uses the ``benchmark`` fixture.
- ``--benchmark-compare[=NUM|ID]``: gate this run's metrics against that stored run (default:
  the latest of this machine with a matching fingerprint) and exit non-zero on a regression.
  Doubtful timings are settled first (:mod:`perf.gate.settle`).
- ``benchmark`` fixture (:mod:`perf.plugin.benchmark`): pytest-benchmark's behaviour is
  unchanged unless the project opts in (ini ``perf_gate_benchmark``, ``perf_machine_info``).

A run in which no test recorded a perf metric saves, gates and prints nothing of perf's; one
that collected no perf test never imports torch or times the reference workload.

Exit status (:meth:`perf.plugin.session.PerfSession.fail`): 1 for a confirmed regression (or
a missing baseline with ``--benchmark-compare-fail`` / ``--perf-strict``), 4 (usage error) for
an unreadable baseline or an option found unusable at configure time
(:mod:`perf.gate.validate`), :data:`perf.plugin.session.EXIT_NOT_WRITTEN` when the run, the
report or the step summary could not be written at session end.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Generator
from typing import Any

import pytest

from perf.plugin.core import uses_perf
from perf.plugin.options import POLICY_INIS, benchmark_option, ini_bool, policy_from_config
from perf.plugin.session import perf_session
from perf.plugin.terminal import stored_gate_section


def synchronizing_timer() -> float:
    """``perf_counter`` after draining every initialised CUDA device: a correct GPU timer.

    Usable directly as ``--benchmark-timer perf.plugin.gate.synchronizing_timer``; the plugin
    applies it to ``benchmark`` tests parametrised on a CUDA device by itself
    (:mod:`perf.plugin.benchmark`).
    """
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)
    return time.perf_counter()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perf", "PyTorch performance properties (perf)")
    group.addoption(
        "--perf-report",
        metavar="PATH",
        default=None,
        help="Write the gate's Markdown report to PATH (it is also appended to "
        "$GITHUB_STEP_SUMMARY when that is set).",
    )
    group.addoption(
        "--perf-strict",
        action="store_true",
        default=False,
        help="With --benchmark-compare: fail when there is no baseline to compare with "
        "(default: a message and a passing run, e.g. the first run on a new runner).",
    )
    group.addoption(
        "--perf-remeasure",
        metavar="N",
        type=int,
        default=2,
        help="Re-run a test whose timing looks regressed in up to N fresh pytest processes "
        "before failing it; every re-measurement must confirm the regression "
        "(default 2; 0: never).",
    )
    group.addoption("--perf-child-out", default=None, help=argparse.SUPPRESS)
    group.addoption(
        "--perf-no-reference",
        action="store_true",
        default=False,
        help="Do not time the reference workload: saves ~1 s, but times are then judged "
        "raw, without reference normalisation (for quiet machines or sleep-bound tests; "
        "ini perf_busy_cpu_fraction = 1 also turns the busy-CPU check off).",
    )
    # Defaults come from perf.gate.verdict.Policy when the value is empty ("" = unset):
    # importing the gate here would import numpy and torch in every pytest run.
    for kind in ("time", "ratio", "bytes"):
        parser.addini(
            f"perf_{kind}_tolerance",
            f"default relative margin for {kind} metrics (default: perf.gate.verdict.Policy)",
            default="",
        )
    parser.addini(
        "perf_environment_change",
        "warn (default) or fail: what a timing gets that the stored baseline finds slower "
        "while its code measures as fast as the baseline's commit's here (interleaved), when "
        "a recorded difference that plausibly matters (packages, thread / allocator "
        "variables, machine) is the likely cause",
        default="",
    )
    parser.addini(
        "perf_undecided",
        "warn (default) or fail: what a timing verdict still undecided after settling does "
        "to the exit status (warn: exit 0, an UNDECIDED section, a ::warning on GitHub Actions)",
        default="",
    )
    parser.addini(
        "perf_settle_budget_s",
        "seconds of interleaved re-measurement (baseline's commit vs HEAD) one stored-gate "
        "session may spend settling doubtful and undecided timings (default 60)",
        default="",
    )
    parser.addini(
        "perf_busy_cpu_fraction",
        "times taken while other processes used more than this share of the CPUs are "
        "inconclusive (1 turns the check off, e.g. for sleep-bound tests; "
        "default: perf.gate.verdict.Policy)",
        default="",
    )
    parser.addini(
        "perf_gate_benchmark",
        "true: pytest-benchmark's `benchmark` times also become perf metrics, stored with "
        "--benchmark-autosave and gated by perf with --benchmark-compare (default false: "
        "pytest-benchmark's behaviour unchanged)",
        type="bool",
        default=False,
    )
    parser.addini(
        "perf_machine_info",
        "true: add torch / CUDA / cuDNN versions, GPUs, driver and torch threads to "
        "pytest-benchmark's machine_info (default false: its keys unchanged)",
        type="bool",
        default=False,
    )


def pytest_configure(config: pytest.Config) -> None:
    s = perf_session(config)
    if config.getoption("--perf-remeasure") < 0:
        raise pytest.UsageError("--perf-remeasure must be >= 0")
    if any(str(config.getini(ini)).strip() for ini in POLICY_INIS):
        policy_from_config(config)  # fail early on a bad ini value
    s.gate_benchmark = ini_bool(config, "perf_gate_benchmark")
    s.machine_info = ini_bool(config, "perf_machine_info")
    if not s.is_worker:  # the controller checks; workers never write
        _check_options(config)
    if s.compare is not None:
        _quiet_benchmark_compare(config)


def _quiet_benchmark_compare(config: pytest.Config) -> None:
    """pytest-benchmark warns "Can't compare. No benchmark files" at its configure (which
    runs after this one: it is ``trylast``) whenever it has no run of its own to compare,
    i.e. on every perf compare of a suite without ``benchmark`` tests. When perf's own store
    holds a run of this machine, perf answers the compare and the warning is noise. The
    filter is removed again at session start (:func:`pytest_sessionstart`)."""
    import warnings

    from perf.store.files import Store
    from perf.store.runs import machine_name

    store = Store.from_storage(benchmark_option(config, "benchmark_storage"))
    if store.runs(machine_name()):
        warnings.filterwarnings(
            "ignore", message="Can't compare. No benchmark files", category=pytest.PytestWarning
        )
        perf_session(config).quieted = warnings.filters[0]


def _check_options(config: pytest.Config) -> None:
    """Refuse a doomed run before the first test (see :mod:`perf.gate.validate`)."""
    s = perf_session(config)
    report = config.getoption("--perf-report")
    if s.save_name is None and s.compare is None and not report:
        return  # nothing to check: the checks' modules stay unimported
    from perf.gate import validate

    storage = benchmark_option(config, "benchmark_storage")
    problems = []
    if s.save_name is not None:
        saving = benchmark_option(config, "benchmark_save")
        option = "--benchmark-save" if saving else "--benchmark-autosave"
        problems += [
            validate.save_name_problem(option, str(s.save_name)),
            validate.storage_problem(storage),
        ]
    if report:
        problems.append(validate.report_problem(report))
    if s.compare is not None:
        from perf.store.files import Store
        from perf.store.runs import machine_name

        store = Store.from_storage(storage)
        problems.append(validate.compare_problem(s.compare, store, machine_name()))
    found = [p for p in problems if p]
    if found:
        raise pytest.UsageError("perf: " + "\nperf: ".join(found))


def pytest_sessionstart(session: pytest.Session) -> None:
    s = perf_session(session.config)
    if s.quieted is not None:
        import warnings

        if s.quieted in warnings.filters:
            warnings.filters.remove(s.quieted)  # type: ignore[attr-defined]
        s.quieted = None
    if s.gating and s.workers == 0:  # xdist workers are our children, not yet reaped
        from perf.core import contention

        s.cpu_start = contention.snapshot()


def pytest_collection_finish(session: pytest.Session) -> None:
    """The reference's start bracket, only in sessions that collected a perf test."""
    s = perf_session(session.config)
    if session.config.option.collectonly:
        return  # --co runs nothing: no reference to time (nor torch and numpy to import)
    if s.gating and s.reference and any(_records_metrics(item) for item in session.items):
        from perf.gate.reference import reference_samples

        s.reference_start = reference_samples()


def _records_metrics(item: pytest.Item) -> bool:
    return uses_perf(item) or (
        perf_session(item.config).gate_benchmark
        and "benchmark" in getattr(item, "fixturenames", ())
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Gate, save and report (the stored gate, then ``--perf-against``)."""
    perf_session(session.config).finish(session)


@pytest.hookimpl(hookwrapper=True, tryfirst=True, specname="pytest_sessionfinish")
def pytest_sessionfinish_quiet_save(session: pytest.Session) -> Generator[None]:
    """pytest-benchmark warns "Not saving anything, no benchmarks have been run!" in its own
    session-finish wrapper (inside this one) whenever ``--benchmark-autosave`` finds no test
    of its ``benchmark`` fixture. When perf saves this run's metrics the warning says the
    opposite of what happens, so it is filtered then (and only then)."""
    s = perf_session(session.config)
    if s.save_name is None or not s.results:
        yield
        return
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Not saving anything, no benchmarks have been")
        yield


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    s = perf_session(config)
    if s.gating and not s.quiet:
        stored_gate_section(terminalreporter, s)
