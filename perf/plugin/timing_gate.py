"""The timing gate's one home: a session object (:class:`TimingGate`), registered as a plugin
the way pytest-benchmark registers its ``BenchmarkSession``, that settles timing verdicts.

Two ways in, one machinery:

- ``--benchmark-compare`` (:mod:`perf.plugin.gate`): the stored-baseline gate's doubtful
  timings (a suspected regression, an inconclusive one, one not compared because the machine
  differs) are measured alternately against the *baseline's commit's code*
  (:meth:`TimingGate.recheck_against_commit`); where that commit is not here, suspects are
  re-measured in fresh processes of this tree (:meth:`TimingGate.confirm_stored`).
- ``--perf-against=REF`` (:mod:`perf.plugin.against`): every timing of the session is measured
  alternately on REF's code and this tree's, and counts and bytes are compared with REF's run
  (:meth:`TimingGate.gate_against`).

Every child process is built by :class:`Children`: one command (:mod:`perf.gate.remeasure`'s
option tables), one environment (this session's torch threads), one timeout. Verdict
details (pairs, confirmations, pairs set aside) are fields of
:class:`perf.gate.compare.MetricResult`, not text.

The hooks here are the session end of ``--perf-against`` and its terminal section; the
stored gate's hooks stay in :mod:`perf.plugin.gate` and call in.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from perf.gate import against as _against
from perf.gate.interleaved import (
    AgainstRequest,
    _rechecked,
    code_or_environment,
    gate_result,
    paired_rows,
)
from perf.plugin.children import CHILD_TIMEOUT_S, Children

if TYPE_CHECKING:
    from perf.gate.compare import GateResult, Policy
    from perf.store.baseline import Run

__all__ = [
    "CHILD_TIMEOUT_S",
    "AgainstRequest",
    "Children",
    "TimingGate",
    "gate_result",
    "paired_rows",
    "timing_gate",
]


@dataclass
class TimingGate:
    """This session's timing gate (mutable: filled at session end)."""

    config: pytest.Config
    against: AgainstRequest | None = None
    #: ``--perf-against``'s verdicts, or why the base could not be measured.
    against_result: GateResult | None = None
    against_refused: str | None = None
    against_notes: list[str] = field(default_factory=list)
    #: Stored gate: tests re-measured in this tree, and what the settling step says.
    remeasured: list[str] = field(default_factory=list)
    note: str | None = None
    #: Set when Ctrl-C or SIGTERM stopped an interleaved measurement: what was cleaned up.
    interrupted: str | None = None
    #: ``--perf-report`` / step summary writes of ``--perf-against`` that failed.
    not_written: list[str] = field(default_factory=list)

    @property
    def children(self) -> Children:
        return Children(self.config)

    # -- interleaved measurement -----------------------------------------------------------

    def interleave(
        self,
        session: pytest.Session,
        repo: Path,
        commit: str,
        margins: dict[tuple[str, str], float],
        units: dict[tuple[str, str], str],
        all_nodeids: list[str],
        policy: Policy,
        budget_s: float | None = None,
    ) -> _against.AgainstOutcome:
        """:func:`perf.gate.against.interleave` with this session's children and packages."""
        from perf.gate import processes

        kids = self.children
        project = _against.project_roots(
            sys.modules, repo, [str(item.path) for item in session.items]
        )
        try:
            with processes.terminate_as_interrupt():
                return _against.interleave(
                    repo=repo,
                    commit=commit,
                    project=project,
                    head_cmd=lambda ids, out: kids.command(ids, out, no_reference=True),
                    env=kids.env(measure_scale=_against.MEASURE_SCALE),
                    cwd=kids.cwd,
                    margins=margins,
                    units=units,
                    all_nodeids=all_nodeids,
                    max_pairs=self.config.getoption("--perf-pairs"),
                    confidence=policy.confidence,
                    max_load_skew=policy.busy_cpu_fraction
                    if policy.busy_cpu_fraction < 1
                    else None,
                    timeout_s=CHILD_TIMEOUT_S,
                    budget_s=budget_s,
                )
        except KeyboardInterrupt as e:
            # pytest's own handling of Ctrl-C ends before sessionfinish: report it the way
            # pytest does (exit status 2, "!!! KeyboardInterrupt !!!"), after the worktree
            # and the running child were removed on the way out.
            what = "SIGTERM" if isinstance(e, processes.Terminated) else "KeyboardInterrupt"
            self.interrupted = (
                f"{what} while measuring against {commit[:12]}: the running child was "
                "stopped and the base worktree removed; no timing verdict"
            )
            self.config.hook.pytest_keyboard_interrupt(
                excinfo=pytest.ExceptionInfo.from_exception(e)
            )
            session.exitstatus = pytest.ExitCode.INTERRUPTED
            raise GateInterrupted(self.interrupted) from None

    # -- the stored-baseline gate ----------------------------------------------------------

    def settle_stored(
        self,
        session: pytest.Session,
        baseline: Run,
        result: GateResult,
        policy: Policy,
        *,
        workers: int = 0,
        current: Run | None = None,
    ) -> GateResult:
        """The stored gate's timing verdicts, settled: against the baseline's commit's code
        where possible, else by up to ``--perf-remeasure`` fresh runs of this tree (never
        under xdist: the workers' runs are not one process's)."""
        from perf.gate import compare as _gate

        tries = self.config.getoption("--perf-remeasure")
        if not tries:
            return result
        if workers:
            if _gate.suspects(result):
                self.note = "suspects not re-measured under xdist"
            return result
        result, self.note, done = self.recheck_against_commit(
            session, baseline, result, policy, current
        )
        if done:
            return result
        if self.note and any(not r.recheck for r in result.undecided):
            self.note += "; undecided timings cannot be settled here and stay UNDECIDED"
        known = {it.nodeid for it in session.items}
        for attempt in range(1, tries + 1):
            suspected = sorted(_gate.suspects(result))
            if not suspected:
                break
            sus = [n for n in suspected if n in known]
            if not sus:
                self.note = (
                    "the suspects were not collected in this session; the first verdict stands"
                )
                break
            again, why = self.children.run(sus, attempt)
            if again is None:
                self.note = f"{why}; the first verdict stands"
                break
            self.remeasured.extend(sus)
            result = _gate.confirm(result, baseline, again, policy)
        return result

    def recheck_against_commit(
        self,
        session: pytest.Session,
        baseline: Run,
        result: GateResult,
        policy: Policy,
        current: Run | None = None,
    ) -> tuple[GateResult, str | None, bool]:
        """Settle the stored gate's doubtful timings by measuring them alternately on the
        baseline's commit's code and this tree's.

        Returns ``(result, note, done)``; ``done`` False means the caller falls back to
        re-measuring this tree (the note says why: no commit recorded, not in this
        repository, refused).
        """
        doubtful = [r for r in result.results if _rechecked(r)]
        if not doubtful:
            return result, None, False
        commit_id = (baseline.commit or {}).get("id")
        if not isinstance(commit_id, str) or not commit_id:
            return result, "the baseline recorded no commit: re-measured in this tree only", False
        shown = _against.show_ref(commit_id[:12])
        try:
            repo = _against.repo_root(self.config.rootpath)
            commit = _against.resolve_commit(repo, commit_id) if repo is not None else None
        except _against.GitMissing as e:
            return result, f"{e}: re-measured in this tree only", False
        if repo is None or commit is None:
            where = "no git repository here" if repo is None else f"not in {repo}"
            fetch = " (fetch it to compare against its code)" if repo is not None else ""
            if repo is not None and not _against.HEX_COMMIT.match(commit_id):
                fetch = " (not a commit hash)"
            return (
                result,
                f"the baseline's commit {shown} is {where}{fetch}; re-measured in this tree only",
                False,
            )
        margins = {(r.nodeid, r.name): float(r.margin or policy.time_tolerance) for r in doubtful}
        units = {(r.nodeid, r.name): r.unit for r in doubtful}
        try:
            out = self.interleave(
                session,
                repo,
                commit,
                margins,
                units,
                sorted({r.nodeid for r in doubtful}),
                policy,
                budget_s=policy.settle_budget_s,
            )
        except GateInterrupted as e:
            return result, str(e), True
        except _against.Refused as e:
            return result, f"cannot measure the baseline's commit {commit[:12]}: {e}", False
        settled = {(r.nodeid, r.name): r for r in paired_rows(out, policy)}
        rows = tuple(
            code_or_environment(r, settled[(r.nodeid, r.name)], baseline, current, policy)
            if (r.nodeid, r.name) in settled
            else r
            for r in result.results
        )
        dirty = (
            " (the baseline was saved from a modified tree)" if baseline.commit.get("dirty") else ""
        )
        note = (
            f"doubtful timings measured alternately against the baseline's commit "
            f"{commit[:12]}{dirty}: {out.children} child runs, {out.wall_s:.1f} s"
        )
        return replace(result, results=rows, notes=(*result.notes, note, *out.notes)), note, True

    # -- --perf-against --------------------------------------------------------------------

    def gate_against(self, session: pytest.Session) -> pytest.ExitCode | None:
        """Measure this session's timings against ``--perf-against``'s commit; the exit
        status it calls for (None: no change)."""
        from perf.plugin.core import collected_metrics
        from perf.plugin.gate_state import policy_from_config

        req = self.against
        assert req is not None
        results = collected_metrics(self.config)
        if not results:
            self.against_notes.append("no test recorded a metric: nothing to gate")
            return None
        policy = policy_from_config(self.config)
        margins: dict[tuple[str, str], float] = {}
        units: dict[tuple[str, str], str] = {}
        for nodeid, entry in results.items():
            if entry["outcome"] != "passed":
                continue
            for m in entry["metrics"]:
                if m["kind"] not in ("time", "ratio"):
                    continue
                default = policy.time_tolerance if m["kind"] == "time" else policy.ratio_tolerance
                tol = m.get("tolerance")
                margins[(nodeid, m["name"])] = float(tol) if tol is not None else default
                units[(nodeid, m["name"])] = m["unit"]
        try:
            outcome = self.interleave(
                session, req.repo, req.commit, margins, units, sorted(results), policy
            )
        except GateInterrupted:
            return pytest.ExitCode.INTERRUPTED
        except _against.Refused as e:
            self.against_refused = str(e)
            return pytest.ExitCode.USAGE_ERROR
        self.against_result = gate_result(req, outcome, results, policy)
        return pytest.ExitCode.TESTS_FAILED if self.against_result.fails(policy) else None

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.against is None or session.exitstatus == pytest.ExitCode.INTERRUPTED:
            return
        code = self.gate_against(session)
        if code is not None and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = code
        if code != pytest.ExitCode.INTERRUPTED:
            self.write_against_markdown(session)

    def write_against_markdown(self, session: pytest.Session) -> None:
        """``--perf-report`` and the step summary for ``--perf-against`` (appended to the
        stored gate's report when both ran)."""
        from perf.plugin.gate_state import EXIT_NOT_WRITTEN, write_markdown
        from perf.report.text import gate_markdown, md_code, md_text

        req = self.against
        assert req is not None
        if not self.config.getoption("--perf-report") and not os.environ.get("GITHUB_STEP_SUMMARY"):
            return
        title = f"## perf gate against {md_code(req.ref)}"
        if self.against_refused:
            text = f"{title}\n\n**Error:** cannot measure it: {md_text(self.against_refused)}\n"
        else:
            body = gate_markdown(self.against_result).split("\n", 1)[1]
            notes = "".join(f"> {md_text(n)}\n" for n in self.against_notes)
            text = f"{title}\n{notes}{body}"
        self.not_written = write_markdown(self.config, text)
        if self.not_written and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = EXIT_NOT_WRITTEN

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        req = self.against
        if req is None:
            return
        from perf.report.text import gate_table, terminal_line

        tr = terminalreporter
        shown = _against.show_ref(req.ref)
        tr.section(terminal_line(f"perf gate against {shown}"))
        for problem in self.not_written:
            tr.write_line(terminal_line(f"perf: ERROR: {problem}"), red=True, bold=True)
        if self.interrupted:
            tr.write_line(terminal_line(f"interrupted: {self.interrupted}"), red=True)
            return
        if self.against_refused:
            tr.write_line(
                terminal_line(
                    f"ERROR: cannot measure {shown} ({req.commit[:12]}): {self.against_refused}"
                ),
                red=True,
            )
            return
        for note in self.against_notes:
            tr.write_line(note)
        if self.against_result is not None:
            verbose = self.config.getoption("verbose") > 0
            for line in gate_table(self.against_result, verbose=verbose):
                red = line.startswith(("REGRESS", "UNDECIDED"))
                tr.write_line(line, red=red, bold=red)
            github_warning(tr, self.against_result)


def github_warning(tr: Any, result: GateResult, runs: tuple[Any, Any] | None = None) -> None:
    """On GitHub Actions (``GITHUB_ACTIONS=true``): every regression as an ``::error`` on the
    line of each site behind it (``runs``: the baseline and current run, which hold the
    sites), and the undecided timings as ``::warning`` lines, so a passing job still shows
    them (:mod:`perf.report.annotations`)."""
    from perf.report.annotations import github_annotations

    base, current = runs if runs is not None else (None, None)
    config = tr.config
    for line in github_annotations(
        result,
        base,
        current,
        environ=os.environ,
        root=str(config.rootpath),
        cwd=str(config.invocation_params.dir),
    ):
        tr.write_line(line)


class GateInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped an interleaved measurement (already reported)."""


GATE_KEY = pytest.StashKey[TimingGate]()


def timing_gate(config: pytest.Config) -> TimingGate:
    """This session's :class:`TimingGate`, created and registered as a plugin on first use."""
    gate = config.stash.get(GATE_KEY, None)
    if gate is None:
        gate = config.stash[GATE_KEY] = TimingGate(config)
        config.pluginmanager.register(gate, "perf-timing-gate")
    return gate
