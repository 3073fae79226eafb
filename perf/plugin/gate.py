"""pytest glue for the baseline store and the gate, riding on pytest-benchmark's options.

- ``--benchmark-autosave`` / ``--benchmark-save=NAME``: also store every perf metric (with raw
  samples) under ``<benchmark-storage>/perf/<machine>/NNNN_<name>.json``; on the xdist
  controller only, also when no test uses the ``benchmark`` fixture.
- ``--benchmark-compare[=NUM|ID]``: gate this run's metrics against that stored run (default:
  the latest of this machine with a matching fingerprint) and exit non-zero on a regression.
- ``benchmark`` fixture: pytest-benchmark's behaviour is unchanged unless the project opts in.
  ini ``perf_gate_benchmark = true``: its raw per-call times become a ``benchmark`` metric
  (stored and gated like every perf metric); ini ``perf_machine_info = true``:
  ``machine_info`` gains GPU, driver and torch / CUDA / cuDNN versions. A ``benchmark`` test
  that runs on perf's ``device`` = a CUDA device times with a synchronising timer.

A run in which no test recorded a perf metric saves, gates and prints nothing of perf's; one
that collected no perf test never imports torch or times the reference workload.

Exit status: 1 for a confirmed regression (or a missing baseline with
``--benchmark-compare-fail`` / ``--perf-strict``), 4 (usage error) for an unreadable baseline
or an option found unusable at configure time (:mod:`perf.gate.validate`), :data:`EXIT_NOT_WRITTEN`
when the run, the report or the step summary could not be written at session end.
Policies and statistics live in :mod:`perf.gate.compare`, the file format in
:mod:`perf.store.baseline`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perf.plugin.benchmark import (
    _BenchmarkMetric,
    _MachineInfo,
    pytest_collection_modifyitems,
    synchronizing_timer,
)
from perf.plugin.core import collected_metrics, uses_perf
from perf.plugin.gate_report import _write_markdown, pytest_terminal_summary
from perf.plugin.gate_state import (
    EXIT_NOT_WRITTEN,
    STATE_KEY,
    _active,
    _baseline,
    _contention,
    _environment,
    _gate,
    _ini_bool,
    _opt,
    _policy_inis_set,
    _State,
    _validate,
    _workers,
    policy_from_config,
    pytest_addoption,
)
from perf.plugin.timing_gate import timing_gate

__all__ = [
    "EXIT_NOT_WRITTEN",
    "STATE_KEY",
    "policy_from_config",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_terminal_summary",
    "synchronizing_timer",
]


def pytest_configure(config: pytest.Config) -> None:
    st = _State()
    st.save_name = _opt(config, "benchmark_save") or _opt(config, "benchmark_autosave")
    cmp = _opt(config, "benchmark_compare", [])
    st.compare = cmp if cmp not in ([], None, False) else None
    st.strict = bool(config.getoption("--perf-strict") or _opt(config, "benchmark_compare_fail"))
    st.workers = _workers(config)
    st.reference = not config.getoption("--perf-no-reference") and st.workers == 0
    st.child_out = config.getoption("--perf-child-out")
    if st.child_out:  # a re-measuring child never saves or gates, whatever it inherited
        st.save_name, st.compare = None, None
    config.stash[STATE_KEY] = st
    if config.getoption("--perf-remeasure") < 0:
        raise pytest.UsageError("--perf-remeasure must be >= 0")
    if _policy_inis_set(config):
        policy_from_config(config)  # fail early on a bad ini value
    if _ini_bool(config, "perf_gate_benchmark"):
        config.pluginmanager.register(_BenchmarkMetric(), "perf-benchmark-metric")
    if _ini_bool(config, "perf_machine_info"):
        config.pluginmanager.register(_MachineInfo(), "perf-machine-info")
    if not hasattr(config, "workerinput"):  # the controller checks; workers never write
        _check_options(config, st)
        if st.save_name is not None:
            config.pluginmanager.register(_CollectErrors(st), "perf-collect-errors")


def _check_options(config: pytest.Config, st: _State) -> None:
    """Refuse a doomed run before the first test (see :mod:`perf.gate.validate`)."""
    storage = _opt(config, "benchmark_storage")
    problems = []
    if st.save_name is not None:
        option = "--benchmark-save" if _opt(config, "benchmark_save") else "--benchmark-autosave"
        problems += [
            _validate.save_name_problem(option, str(st.save_name)),
            _validate.storage_problem(storage),
        ]
    report = config.getoption("--perf-report")
    if report:
        problems.append(_validate.report_problem(report))
    if st.compare is not None:
        store = _baseline.Store.from_storage(storage)
        problems.append(_validate.compare_problem(st.compare, store, _baseline.machine_name()))
    found = [p for p in problems if p]
    if found:
        raise pytest.UsageError("perf: " + "\nperf: ".join(found))


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if not _active(config):
        return
    st = config.stash[STATE_KEY]
    if st.workers == 0:  # xdist workers are our children but not yet reaped: unmeasurable
        st.cpu_start = _contention.snapshot()


def pytest_collection_finish(session: pytest.Session) -> None:
    """The reference's start bracket, only in sessions that collected a perf test (one that
    could record a timing): a suite without perf tests never pays for it."""
    config = session.config
    if not _active(config):
        return
    st = config.stash[STATE_KEY]
    if st.reference and any(_records_metrics(item) for item in session.items):
        st.reference_start = _gate.reference_samples()


def _records_metrics(item: pytest.Item) -> bool:
    return uses_perf(item) or (
        item.config.pluginmanager.has_plugin("perf-benchmark-metric")
        and "benchmark" in getattr(item, "fixturenames", ())
    )


# -- gate and save at session end -----------------------------------------------------------


def _partial_reason(session: pytest.Session) -> str | None:
    """What :func:`perf.store.baseline.partial_reason` needs, from this session."""
    from perf.plugin.core import OUTCOMES_KEY

    reported = session.config.stash.get(OUTCOMES_KEY, {})
    return _baseline.partial_reason(
        stopped=session.shouldfail or session.shouldstop or None,
        selected=session.testscollected,
        outcomes=list(reported.values()),
        collect_errors=session.config.stash[STATE_KEY].collect_errors,
    )


class _CollectErrors:
    """Counts collection errors (with --continue-on-collection-errors the run goes on)."""

    def __init__(self, st: _State) -> None:
        self.st = st

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.st.collect_errors += 1


def _current_run(config: pytest.Config, reference_end: list[float]) -> _baseline.Run:
    import os

    from perf.gate.remeasure import inherited_fingerprint

    st = config.stash[STATE_KEY]
    fp = inherited_fingerprint(os.environ) if st.child_out else None
    if fp is None:
        from perf.core.devices import fingerprint

        fp = fingerprint()
    ref = {}
    if st.reference_start:
        ref["start"] = st.reference_start
    if reference_end:
        ref["end"] = reference_end
    end = _contention.snapshot()
    cpu = (
        _contention.share(st.cpu_start, end).to_dict()
        if st.cpu_start is not None and end is not None
        else None
    )
    return _baseline.make_run(
        collected_metrics(config),
        name=st.save_name or ("remeasure" if st.child_out else "current"),
        fingerprint=fp,
        reference=ref,
        reference_threads=_gate.REFERENCE_THREADS if ref else None,
        workers=st.workers,
        cpu=cpu,
        partial=st.partial,
        environment=None if st.child_out else _environment.environment(),
    )


def _write_child_run(config: pytest.Config, run: _baseline.Run) -> None:
    st = config.stash[STATE_KEY]
    assert st.child_out is not None
    Path(st.child_out).write_text(json.dumps(run.to_json()), encoding="utf-8")


def _fail(session: pytest.Session, code: int) -> None:
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED, 0, 5):
        session.exitstatus = code


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not _active(config):
        return
    st = config.stash[STATE_KEY]
    if session.exitstatus == pytest.ExitCode.INTERRUPTED:
        st.save_skipped = "the session was interrupted; nothing gated or saved"
        return
    if not collected_metrics(config) and not st.child_out:
        st.quiet = True  # no perf metric in this run (e.g. pytest-benchmark alone): not ours
        return
    st.partial = _partial_reason(session)
    end = _gate.reference_samples() if st.reference and _recorded_timing(config) else []
    current = _current_run(config, end)
    if st.child_out:
        _write_child_run(config, current)
        return
    store = _baseline.Store.from_storage(_opt(config, "benchmark_storage"))
    if st.compare is not None:
        _run_gate(session, store, current)
        if session.exitstatus == pytest.ExitCode.INTERRUPTED:  # Ctrl-C while re-checking
            st.save_skipped = "the session was interrupted; nothing saved"
            return
    if st.save_name is not None:
        if current.tests:
            st.noisy = _flag_noisy(session, current)
            try:
                st.saved = store.save(current)
            except KeyboardInterrupt as e:
                # the store removes its temp file on the way out: nothing half-written is
                # left, and the interruption is reported the way pytest reports one (exit 2)
                st.save_skipped = (
                    "interrupted while saving (KeyboardInterrupt): no run file and no temporary "
                    "file were left; run again to save this run"
                )
                config.hook.pytest_keyboard_interrupt(
                    excinfo=pytest.ExceptionInfo.from_exception(e)
                )
                session.exitstatus = pytest.ExitCode.INTERRUPTED
                return
            except OSError as e:
                st.not_written.append(
                    f"could not save this run under {store.root / current.machine}: "
                    f"{_validate.os_error_text(e)}" + (f" ({e.filename})" if e.filename else "")
                )
        else:
            st.save_skipped = "no test recorded a metric"
    _write_markdown(config)
    if st.not_written:
        _fail(session, EXIT_NOT_WRITTEN)


def _run_gate(session: pytest.Session, store: _baseline.Store, current: _baseline.Run) -> None:
    config = session.config
    st = config.stash[STATE_KEY]
    try:
        ref = store.resolve(
            st.compare,
            machine=current.machine,
            fingerprint=current.fingerprint,
            timing_keys=_gate.TIMING_KEYS,
        )
        base = _baseline.load(ref.path)
    except _baseline.BaselineNotFound as e:
        st.baseline_missing = str(e)
        if st.strict:
            _fail(session, pytest.ExitCode.TESTS_FAILED)
        return
    except _baseline.BaselineError as e:
        st.error = str(e)
        _fail(session, pytest.ExitCode.USAGE_ERROR)
        return
    policy = policy_from_config(config)
    result = _gate.compare_runs(base, current, policy)
    result = timing_gate(config).settle_stored(
        session, base, result, policy, workers=st.workers, current=current
    )
    st.result = result
    st.runs = (base, current)
    if result.fails(policy):
        _fail(session, pytest.ExitCode.TESTS_FAILED)


def _flag_noisy(session: pytest.Session, current: _baseline.Run) -> dict[str, str]:
    """Before saving: re-measure, in one fresh process, every time too dispersed to anchor a
    verdict (:mod:`perf.gate.dispersion`); keep the fresh samples where they are not, and
    flag the rest ``noisy`` with the reason (never under xdist or ``--perf-remeasure=0``:
    flagged at once). Returns ``"nodeid metric" -> why`` of the flagged ones."""
    from perf.gate.dispersion import noisy_metrics

    config = session.config
    st = config.stash[STATE_KEY]
    policy = policy_from_config(config)
    found = noisy_metrics(current.tests, policy.time_tolerance, policy.time_quantile)
    if not found:
        return {}
    known = {it.nodeid for it in session.items}
    ids = sorted({n for n, _ in found if n in known})
    if ids and not st.workers and config.getoption("--perf-remeasure"):
        again, why = timing_gate(config).children.run(ids, 1)
        fresh = (
            noisy_metrics(again.tests, policy.time_tolerance, policy.time_quantile) if again else {}
        )
        for key in list(found):
            entry = (again.tests.get(key[0]) if again else None) or {}
            new = {m["name"]: m for m in entry.get("metrics", [])}.get(key[1])
            if new is None or entry.get("outcome") != "passed":
                found[key] += f"; re-measured in a fresh process: {why or 'not measured there'}"
            elif key not in fresh:
                _replace_metric(current, key, new)
                del found[key]
            else:
                found[key] = f"{fresh[key]} (and so in a fresh process: {found[key]})"
    for (nodeid, name), why in found.items():
        for m in current.tests[nodeid]["metrics"]:
            if m["name"] == name:
                m["noisy"] = why
    return {f"{n} {m}": why for (n, m), why in sorted(found.items())}


def _replace_metric(run: _baseline.Run, key: tuple[str, str], new: dict) -> None:
    ms = run.tests[key[0]]["metrics"]
    for i, m in enumerate(ms):
        if m["name"] == key[1]:
            ms[i] = {**m, "value": new["value"], "samples": list(new.get("samples") or [])}


def _recorded_timing(config: pytest.Config) -> bool:
    """Whether any test recorded a time or ratio (the reference normalises only those)."""
    return any(
        m.get("kind") in ("time", "ratio")
        for entry in collected_metrics(config).values()
        for m in entry["metrics"]
    )
