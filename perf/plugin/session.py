"""perf's one session object (pytest-benchmark's ``BenchmarkSession`` is the model).

:class:`PerfSession` lives in ``config.stash`` (:func:`perf_session`) and owns what one pytest
session of perf asked for and found: the options, the metrics the tests recorded, the stored
gate and ``--perf-against``'s verdicts, and the reports. The hook modules listed in
:data:`perf.plugin.pytest_plugins` hand off to it; it is not itself a plugin, so no hook
depends on an object being registered. It decides the exit status by one rule
(:meth:`PerfSession.fail`).

The settling algorithms are :mod:`perf.gate.settle`'s pure functions; this object supplies
the ways to measure (:class:`perf.plugin.children.Children`). Loading it imports neither
numpy nor torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from perf.plugin.children import Children
from perf.plugin.gate_report import against_markdown, wants_markdown, write_markdown
from perf.plugin.options import (
    EXIT_NOT_WRITTEN,
    benchmark_option,
    policy_from_config,
    xdist_workers,
)

if TYPE_CHECKING:
    from perf.core.contention import CpuSnapshot
    from perf.gate.interleaved import AgainstRequest
    from perf.gate.verdict import GateResult, Policy
    from perf.store.files import Store
    from perf.store.runs import Run


#: pytest exit statuses perf may replace with its own verdict: nothing else went wrong.
_REPLACEABLE = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)


@dataclass
class PerfSession:
    """One pytest session of perf (mutable: filled as the session goes)."""

    config: pytest.Config
    # -- options -------------------------------------------------------------------------
    save_name: str | None = None
    compare: str | bool | None = None
    strict: bool = False
    workers: int = 0
    reference: bool = True
    #: Set in a re-measuring child: where to write its run instead of saving or gating.
    child_out: str | None = None
    #: What ``--perf-against`` asked for (checked at configure time); None: not asked.
    against: AgainstRequest | None = None
    #: ini ``perf_gate_benchmark`` / ``perf_machine_info``.
    gate_benchmark: bool = False
    machine_info: bool = False
    # -- what the tests recorded (the controller's, or a serial run's) ---------------------
    #: nodeid -> {"outcome", "metrics": [metric dicts]} of every test that recorded a metric.
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: nodeid -> outcome of every test that reported (complete runs from partial ones).
    outcomes: dict[str, str] = field(default_factory=dict)
    collect_errors: int = 0
    # -- the stored gate -------------------------------------------------------------------
    reference_start: list[float] = field(default_factory=list)
    cpu_start: CpuSnapshot | None = None
    result: GateResult | None = None
    baseline_missing: str | None = None
    error: str | None = None
    saved: Path | None = None
    save_skipped: str | None = None
    #: Why this run is partial (stopped early, failed tests); stored with the run.
    partial: str | None = None
    #: No test recorded a perf metric: perf saves, gates and prints nothing.
    quiet: bool = False
    #: Saved times flagged ``noisy`` ("nodeid metric" -> why), for the terminal.
    noisy: dict[str, str] = field(default_factory=dict)
    #: Drift warnings over the stored history (:func:`perf.gate.drift.gate_lines`).
    drifts: list[str] = field(default_factory=list)
    #: The stored gate's (baseline, current) runs, for the annotations at the line.
    runs: tuple[Any, Any] | None = None
    #: Tests re-measured in this tree, and what the settling step says.
    remeasured: list[str] = field(default_factory=list)
    note: str | None = None
    # -- --perf-against --------------------------------------------------------------------
    against_result: GateResult | None = None
    against_refused: str | None = None
    against_notes: list[str] = field(default_factory=list)
    #: Set when Ctrl-C or SIGTERM stopped an interleaved measurement: what was cleaned up.
    interrupted: str | None = None
    # -- reports ---------------------------------------------------------------------------
    #: Session-end write failures of the stored gate, each naming the path and the OS error.
    not_written: list[str] = field(default_factory=list)
    #: The same for ``--perf-against``'s report.
    against_not_written: list[str] = field(default_factory=list)
    #: The warnings filter that keeps pytest-benchmark's "Can't compare" quiet while it
    #: configures (:mod:`perf.plugin.gate`), until session start.
    quieted: Any = None
    #: Set once this session wrote ``--perf-report``: a later writer appends.
    report_written: bool = False

    @classmethod
    def from_config(cls, config: pytest.Config) -> PerfSession:
        """The options of this session (no checks: :mod:`perf.plugin.gate` checks them)."""
        s = cls(config)
        s.save_name = benchmark_option(config, "benchmark_save") or benchmark_option(
            config, "benchmark_autosave"
        )
        cmp = benchmark_option(config, "benchmark_compare", [])
        s.compare = cmp if cmp not in ([], None, False) else None
        s.strict = bool(
            config.getoption("--perf-strict") or benchmark_option(config, "benchmark_compare_fail")
        )
        s.workers = xdist_workers(config)
        s.reference = not config.getoption("--perf-no-reference") and s.workers == 0
        s.child_out = config.getoption("--perf-child-out")
        if s.child_out:  # a re-measuring child never saves or gates, whatever it inherited
            s.save_name, s.compare = None, None
        return s

    @property
    def is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    @property
    def gating(self) -> bool:
        """The stored gate's hooks act: the controller (or a serial run) saves, compares or
        writes a child's run."""
        return not self.is_worker and (
            self.save_name is not None or self.compare is not None or bool(self.child_out)
        )

    @property
    def children(self) -> Children:
        return Children(self.config)

    def policy(self) -> Policy:
        return policy_from_config(self.config)

    # -- the one exit-status rule ----------------------------------------------------------

    def fail(self, session: pytest.Session, code: int) -> None:
        """Set perf's exit status ``code``, unless pytest's own status already says that
        something else went wrong (failed tests, interrupted, usage or internal error)."""
        if session.exitstatus in _REPLACEABLE:
            session.exitstatus = code

    # -- session end -----------------------------------------------------------------------

    def finish(self, session: pytest.Session) -> None:
        """Session end: write a child's run, or gate against the stored baseline, save, and
        gate against ``--perf-against``'s commit; each part sets the exit status through
        :meth:`fail`. The gates' warm starter, if one started, ends with them."""
        try:
            if self.gating:
                self._finish_stored(session)
            stopped = session.exitstatus == pytest.ExitCode.INTERRUPTED
            if self.against is not None and not self.is_worker and not stopped:
                code = self.gate_against(session)
                if code is not None:
                    self.fail(session, code)
                if code != pytest.ExitCode.INTERRUPTED and wants_markdown(self.config):
                    text = against_markdown(
                        self.against, self.against_refused, self.against_result, self.against_notes
                    )
                    self.against_not_written = self._write_markdown(text)
                    if self.against_not_written:
                        self.fail(session, EXIT_NOT_WRITTEN)
        finally:
            # the module the gate's code imported (``from perf.gate import processes``): where
            # sys.modules was swapped since (pytester's in-process runs restore a snapshot),
            # sys.modules can hold another copy whose list of starters is empty
            from perf.gate import processes

            processes.close_starters()

    def _finish_stored(self, session: pytest.Session) -> None:
        from perf.store.runs import partial_reason

        if session.exitstatus == pytest.ExitCode.INTERRUPTED:
            self.save_skipped = "the session was interrupted; nothing gated or saved"
            return
        if not self.results and not self.child_out:
            self.quiet = True  # no perf metric in this run (e.g. pytest-benchmark alone)
            return
        self.partial = partial_reason(
            stopped=session.shouldfail or session.shouldstop or None,
            selected=session.testscollected,
            outcomes=list(self.outcomes.values()),
            collect_errors=self.collect_errors,
        )
        current = self._current_run()
        if self.child_out:
            Path(self.child_out).write_text(json.dumps(current.to_json()), encoding="utf-8")
            return
        from perf.store.files import Store

        store = Store.from_storage(benchmark_option(self.config, "benchmark_storage"))
        if self.compare is not None:
            self._run_gate(session, store, current)
            if session.exitstatus == pytest.ExitCode.INTERRUPTED:  # Ctrl-C while re-checking
                self.save_skipped = "the session was interrupted; nothing saved"
                return
        if self.save_name is not None:
            if current.tests:
                self._save(session, store, current)
                if session.exitstatus == pytest.ExitCode.INTERRUPTED:
                    return
            else:
                self.save_skipped = "no test recorded a metric"
        if wants_markdown(self.config):
            from perf.report.text import gate_markdown

            text = gate_markdown(self.result, saved=self.saved, missing=self.baseline_missing,
                                 error=self.error, problems=tuple(self.not_written))  # fmt: skip
            if self.drifts:  # perf.gate.drift: warnings over the stored history
                from perf.report.text import md_text

                text = text.rstrip("\n") + "\n\n### Drift over the stored runs\n\n"
                text += "".join(f"- {md_text(line)}\n" for line in self.drifts)
            self.not_written.extend(self._write_markdown(text))
        if self.not_written:
            self.fail(session, EXIT_NOT_WRITTEN)

    def _write_markdown(self, text: str) -> list[str]:
        """:func:`perf.plugin.gate_report.write_markdown`: the session's first report
        replaces ``--perf-report``, later ones append."""
        problems, written = write_markdown(self.config, text, append=self.report_written)
        self.report_written = self.report_written or written
        return problems

    def _recorded_timing(self) -> bool:
        """Whether any test recorded a time or ratio (the reference normalises only those)."""
        return any(
            m.get("kind") in ("time", "ratio")
            for entry in self.results.values()
            for m in entry["metrics"]
        )

    def _current_run(self) -> Run:
        from perf.core import contention
        from perf.gate.remeasure import inherited_fingerprint
        from perf.store.runs import make_run

        reference_end = []
        if self.reference and self._recorded_timing():
            from perf.gate.reference import reference_samples

            reference_end = reference_samples()
        fp = inherited_fingerprint(os.environ) if self.child_out else None
        if fp is None:
            from perf.core.devices import fingerprint

            fp = fingerprint()
        ref = {}
        if self.reference_start:
            ref["start"] = self.reference_start
        if reference_end:
            ref["end"] = reference_end
        end = contention.snapshot()
        cpu = (
            contention.share(self.cpu_start, end).to_dict()
            if self.cpu_start is not None and end is not None
            else None
        )
        return make_run(
            dict(self.results),
            name=self.save_name or ("remeasure" if self.child_out else "current"),
            fingerprint=fp,
            reference=ref,
            reference_threads=_reference_threads() if ref else None,
            workers=self.workers,
            cpu=cpu,
            partial=self.partial,
            environment=None if self.child_out else _environment(),
        )

    def _save(self, session: pytest.Session, store: Store, current: Run) -> None:
        from perf.gate.settle import flag_noisy
        from perf.gate.validate import os_error_text

        # re-measured in a fresh process, never under xdist or with --perf-remeasure=0
        tries = self.config.getoption("--perf-remeasure")
        again = self.children.run if tries and not self.workers else None
        ids = {it.nodeid for it in session.items}
        current, self.noisy = flag_noisy(current, self.policy(), collected=ids, remeasure=again)
        try:
            self.saved = store.save(current)
        except KeyboardInterrupt as e:
            # the store removes its temp file on the way out: nothing half-written is left,
            # and the interruption is reported the way pytest reports one (exit 2)
            self.save_skipped = (
                "interrupted while saving (KeyboardInterrupt): no run file and no temporary "
                "file were left; run again to save this run"
            )
            self.config.hook.pytest_keyboard_interrupt(
                excinfo=pytest.ExceptionInfo.from_exception(e)
            )
            session.exitstatus = pytest.ExitCode.INTERRUPTED
        except OSError as e:
            self.not_written.append(
                f"could not save this run under {store.root / current.machine}: "
                f"{os_error_text(e)}" + (f" ({e.filename})" if e.filename else "")
            )

    def _run_gate(self, session: pytest.Session, store: Store, current: Run) -> None:
        from perf.core.devices import TIMING_KEYS
        from perf.gate.compare import compare_runs
        from perf.gate.settle import recheck_against_commit, settle_stored
        from perf.store.runs import BaselineNotFound
        from perf.store.schema import BaselineError

        try:
            ref = store.resolve(
                self.compare,
                machine=current.machine,
                fingerprint=current.fingerprint,
                timing_keys=TIMING_KEYS,
            )
            from perf.store.merge import load_merged

            base = load_merged(ref.path)  # a run file, or a folder of shard runs
        except BaselineNotFound as e:
            self.baseline_missing = str(e)
            if self.strict:
                self.fail(session, pytest.ExitCode.TESTS_FAILED)
            return
        except BaselineError as e:
            self.error = str(e)
            self.fail(session, pytest.ExitCode.USAGE_ERROR)
            return
        policy = self.policy()
        result = compare_runs(base, current, policy)
        kids = self.children

        def recheck(first: GateResult) -> Any:
            def interleave(repo: Any, commit: Any, mg: Any, un: Any, ids: Any, b: Any) -> Any:
                return kids.interleave(session, repo, commit, mg, un, ids, policy, b)

            return recheck_against_commit(
                base, first, policy, current, rootpath=self.config.rootpath, interleave=interleave
            )

        settled = settle_stored(
            base,
            result,
            policy,
            tries=self.config.getoption("--perf-remeasure"),
            workers=self.workers,
            collected={it.nodeid for it in session.items},
            remeasure=kids.run,
            recheck=recheck,
        )
        self.result, self.note = settled.result, settled.note
        self.runs = (base, current)
        from perf.gate.drift import gate_lines

        self.drifts = gate_lines(store, current)  # warns; never fails the gate (docs/gating.md)
        if session.exitstatus == pytest.ExitCode.INTERRUPTED:  # Ctrl-C while re-checking
            self.interrupted = settled.note
        self.remeasured.extend(settled.remeasured)
        if self.result.fails(policy):
            self.fail(session, pytest.ExitCode.TESTS_FAILED)

    def gate_against(self, session: pytest.Session) -> int | None:
        """Measure this session's timings against ``--perf-against``'s commit; the exit
        status it calls for (None: no change)."""
        from perf.gate.base_tree import Refused
        from perf.gate.interleaved import gate_result, timed_margins
        from perf.gate.settle import MeasurementInterrupted

        req = self.against
        assert req is not None
        results = dict(self.results)
        if not results:
            self.against_notes.append("no test recorded a metric: nothing to gate")
            return None
        policy = self.policy()
        margins, units = timed_margins(results, policy)
        try:
            outcome = self.children.interleave(
                session, req.repo, req.commit, margins, units, sorted(results), policy
            )
        except MeasurementInterrupted as e:
            self.interrupted = str(e)
            return pytest.ExitCode.INTERRUPTED
        except Refused as e:
            self.against_refused = str(e)
            return pytest.ExitCode.USAGE_ERROR
        self.against_result = gate_result(req, outcome, results, policy)
        return pytest.ExitCode.TESTS_FAILED if self.against_result.fails(policy) else None


SESSION_KEY = pytest.StashKey[PerfSession]()


def perf_session(config: pytest.Config) -> PerfSession:
    """This pytest session's :class:`PerfSession`, made from its options on first use."""
    s = config.stash.get(SESSION_KEY, None)
    if s is None:
        s = config.stash[SESSION_KEY] = PerfSession.from_config(config)
    return s


def _environment() -> dict[str, Any]:
    from perf.store.environment import environment

    return environment()


def _reference_threads() -> int:
    from perf.gate.reference import REFERENCE_THREADS  # numpy: only when the reference ran

    return REFERENCE_THREADS
