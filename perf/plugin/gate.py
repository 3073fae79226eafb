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

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from perf.plugin.core import add_metric, collected_metrics, item_metrics, perf_device_of, uses_perf
from perf.plugin.timing_gate import timing_gate

if TYPE_CHECKING:
    from perf.core import contention as _contention
    from perf.gate import compare as _gate
    from perf.gate import validate as _validate
    from perf.store import baseline as _baseline
else:

    class _Lazy:
        """A module imported on first attribute access: loading the plugin must not import
        numpy / torch (perf.gate.compare) in test runs that never gate."""

        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, attr: str) -> Any:
            import importlib

            return getattr(importlib.import_module(self._name), attr)

    _baseline = _Lazy("perf.store.baseline")
    _contention = _Lazy("perf.core.contention")
    _gate = _Lazy("perf.gate.compare")
    _validate = _Lazy("perf.gate.validate")

#: Exit status when perf could not write the run, ``--perf-report`` or the step summary
#: (disk full, read-only, a folder in the way) and nothing else failed. Not 1: that means
#: "regression / failed tests"; not 2-5: pytest's own (interrupted, internal error, usage
#: error, no tests). A CI script can tell "the code got slower" from "the runner's disk".
EXIT_NOT_WRITTEN = 6


@dataclass
class _State:
    """What this session asked for and what the gate found (mutable: filled as we go)."""

    save_name: str | None = None
    compare: str | bool | None = None
    strict: bool = False
    workers: int = 0
    reference: bool = True
    reference_start: list[float] = field(default_factory=list)
    cpu_start: _contention.CpuSnapshot | None = None
    #: Set in a re-measuring child: where to write its run instead of saving or gating.
    child_out: str | None = None
    result: _gate.GateResult | None = None
    baseline_missing: str | None = None
    error: str | None = None
    saved: Path | None = None
    save_skipped: str | None = None
    #: Why this run is partial (stopped early, failed tests); stored with the run.
    partial: str | None = None
    collect_errors: int = 0
    #: Session-end write failures, each naming the path and the OS error.
    not_written: list[str] = field(default_factory=list)
    #: No test recorded a perf metric: perf saves, gates and prints nothing.
    quiet: bool = False


STATE_KEY = pytest.StashKey[_State]()


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
    # Defaults come from perf.gate.compare.Policy when the value is empty ("" = unset):
    # importing the gate here would import numpy and torch in every pytest run.
    for kind in ("time", "ratio", "bytes"):
        parser.addini(
            f"perf_{kind}_tolerance",
            f"default relative margin for {kind} metrics (default: perf.gate.compare.Policy)",
            default="",
        )
    parser.addini(
        "perf_busy_cpu_fraction",
        "times taken while other processes used more than this share of the CPUs are "
        "inconclusive (1 turns the check off, e.g. for sleep-bound tests; "
        "default: perf.gate.compare.Policy)",
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


def _opt(config: pytest.Config, name: str, default: Any = None) -> Any:
    """pytest-benchmark's option, or ``default`` when pytest-benchmark is not loaded."""
    try:
        return config.getoption(name, default)
    except ValueError:
        return default


def _ini_fraction(config: pytest.Config, name: str) -> float:
    raw = str(config.getini(name)).strip()
    try:
        v = float(raw.rstrip("%"))
    except ValueError:
        raise pytest.UsageError(
            f"ini {name} = {raw!r} is not a number (e.g. 0.10 or 10% for 10%)"
        ) from None
    return v / 100.0 if raw.endswith("%") else v


_POLICY_INIS = {
    "time_tolerance": "perf_time_tolerance",
    "ratio_tolerance": "perf_ratio_tolerance",
    "bytes_tolerance": "perf_bytes_tolerance",
    "busy_cpu_fraction": "perf_busy_cpu_fraction",
}


def _policy_inis_set(config: pytest.Config) -> bool:
    return any(str(config.getini(ini)).strip() for ini in _POLICY_INIS.values())


def policy_from_config(config: pytest.Config) -> _gate.Policy:
    kwargs: dict[str, Any] = {
        field_: _ini_fraction(config, ini)
        for field_, ini in _POLICY_INIS.items()
        if str(config.getini(ini)).strip()
    }
    try:
        return _gate.Policy(**kwargs)
    except ValueError as e:
        raise pytest.UsageError(f"perf ini: {e}") from None


def _ini_bool(config: pytest.Config, name: str) -> bool:
    try:
        return bool(config.getini(name))
    except ValueError:
        raise pytest.UsageError(
            f"ini {name} = {config.inicfg.get(name)!r} is not a boolean (true or false)"
        ) from None


def _workers(config: pytest.Config) -> int:
    if _opt(config, "dist", "no") in ("no", None):
        return 0
    n = _opt(config, "numprocesses", 0)
    return int(n) if isinstance(n, int) else 2


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


def _active(config: pytest.Config) -> bool:
    st = config.stash.get(STATE_KEY, None)
    return (
        st is not None
        and not hasattr(config, "workerinput")
        and (st.save_name is not None or st.compare is not None or bool(st.child_out))
    )


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


# -- the benchmark fixture ------------------------------------------------------------------


def synchronizing_timer() -> float:
    """``perf_counter`` after draining every initialised CUDA device: a correct GPU timer.

    Usable directly as ``--benchmark-timer perf.plugin.gate.synchronizing_timer``; the plugin
    applies it to ``benchmark`` tests parametrised on a CUDA device by itself.
    """
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)
    return time.perf_counter()


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


class _BenchmarkMetric:
    """ini ``perf_gate_benchmark = true``: the ``benchmark`` fixture's times become a metric."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        """After the test body: turn the ``benchmark`` fixture's raw times into a metric."""
        res = yield
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
        return res


class _MachineInfo:
    """ini ``perf_machine_info = true``: torch and GPU fields in pytest-benchmark's
    machine_info (off by default: pytest-benchmark warns when machine_info keys differ from
    a stored run's, e.g. one saved before perf was installed)."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_machine_info(
        self, config: pytest.Config, machine_info: dict[str, Any]
    ) -> None:
        from perf.core.devices import fingerprint

        fp = fingerprint()
        machine_info["torch_version"] = fp["torch"]
        machine_info["torch_threads"] = fp["torch_threads"]
        machine_info["cuda_version"] = fp["cuda"]
        machine_info["cudnn_version"] = fp["cudnn"]
        machine_info["gpu_driver"] = fp["driver"]
        machine_info["gpus"] = fp["gpus"]


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
    from perf.core.devices import fingerprint

    st = config.stash[STATE_KEY]
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
        fingerprint=fingerprint(),
        reference=ref,
        reference_threads=_gate.REFERENCE_THREADS if ref else None,
        workers=st.workers,
        cpu=cpu,
        partial=st.partial,
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
    if st.save_name is not None:
        if current.tests:
            try:
                st.saved = store.save(current)
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
    result = timing_gate(config).settle_stored(session, base, result, policy, workers=st.workers)
    st.result = result
    if result.failed:
        _fail(session, pytest.ExitCode.TESTS_FAILED)


def _write_markdown(config: pytest.Config) -> None:
    from perf.report.text import gate_markdown

    st = config.stash[STATE_KEY]
    path = config.getoption("--perf-report")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path and not summary:
        return
    text = gate_markdown(
        st.result,
        saved=st.saved,
        missing=st.baseline_missing,
        error=st.error,
        problems=tuple(st.not_written),
    )
    if path:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text, encoding="utf-8")
        except OSError as e:
            st.not_written.append(
                f"could not write --perf-report {path}: {_validate.os_error_text(e)}"
            )
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as e:
            st.not_written.append(
                f"could not append to $GITHUB_STEP_SUMMARY {summary}: {_validate.os_error_text(e)}"
            )


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not _active(config):
        return
    st = config.stash[STATE_KEY]
    if st.quiet:
        return
    from perf.report.text import gate_table, terminal_line

    tr = terminalreporter
    if st.compare is not None:
        tr.section("perf gate")
        if st.error:
            tr.write_line(terminal_line(f"ERROR: {st.error}"), red=True, bold=True)
            tr.write_line(
                "The file was not modified. Fix or delete it, or compare against "
                "another run (--benchmark-compare=NUM)."
            )
        elif st.baseline_missing:
            tr.write_line(
                terminal_line(f"no baseline to compare with: {st.baseline_missing}"), yellow=True
            )
            tr.write_line(
                "FAILED: --perf-strict / --benchmark-compare-fail ask for a baseline"
                if st.strict
                else "Nothing gated; save one with --benchmark-autosave (or --benchmark-save=NAME)."
            )
        elif st.result is not None:
            for line in gate_table(st.result, verbose=config.getoption("verbose") > 0):
                red = line.startswith("REGRESS")
                tr.write_line(line, red=red, bold=red)
            tg = timing_gate(config)
            if tg.remeasured:
                tr.write_line(
                    terminal_line(f"re-measured: {', '.join(sorted(set(tg.remeasured)))}")
                )
            if tg.note:
                tr.write_line(terminal_line(tg.note))
    if st.saved is not None:
        tr.write_line(f"perf: saved metrics of {len(_saved_count(config))} tests to {st.saved}")
        if st.partial:
            tr.write_line(
                f"perf: saved as a partial run ({st.partial}): a plain --benchmark-compare "
                "never picks it as the baseline",
                yellow=True,
            )
    if st.save_skipped:
        tr.write_line(f"perf: nothing saved: {st.save_skipped}")
    for problem in st.not_written:
        tr.write_line(terminal_line(f"perf: ERROR: {problem}"), red=True, bold=True)
    if st.not_written:
        tr.write_line(
            f"perf: exit status {EXIT_NOT_WRITTEN}: results not written (the verdict above stands)",
            red=True,
        )


def _saved_count(config: pytest.Config) -> dict[str, Any]:
    return collected_metrics(config)


def _recorded_timing(config: pytest.Config) -> bool:
    """Whether any test recorded a time or ratio (the reference normalises only those)."""
    return any(
        m.get("kind") in ("time", "ratio")
        for entry in collected_metrics(config).values()
        for m in entry["metrics"]
    )
