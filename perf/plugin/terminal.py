"""The gates' terminal sections, drawn from the session
(:class:`perf.plugin.session.PerfSession`): the stored gate's (:func:`stored_gate_section`)
and ``--perf-against``'s (:func:`against_section`). No hooks here: :mod:`perf.plugin.gate`
and :mod:`perf.plugin.against` call these from theirs; the Markdown is
:mod:`perf.plugin.gate_report`'s."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from perf.plugin.options import EXIT_NOT_WRITTEN

if TYPE_CHECKING:
    from perf.gate.verdict import GateResult
    from perf.plugin.session import PerfSession


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


def _verdict_table(
    tr: Any, result: GateResult, verbose: bool, runs: tuple[Any, Any] | None = None
) -> None:
    from perf.report.text import gate_table

    for line in gate_table(result, verbose=verbose):
        red = line.startswith(("REGRESS", "UNDECIDED"))
        tr.write_line(line, red=red, bold=red)
    github_warning(tr, result, runs)


def stored_gate_section(tr: Any, s: PerfSession) -> None:
    """The "perf gate" section, then what was saved, flagged or not written."""
    from perf.report.text import terminal_line

    if s.compare is not None:
        tr.section("perf gate")
        if s.error:
            tr.write_line(terminal_line(f"ERROR: {s.error}"), red=True, bold=True)
            tr.write_line(
                "The file was not modified. Fix or delete it, or compare against "
                "another run (--benchmark-compare=NUM)."
            )
        elif s.baseline_missing:
            tr.write_line(
                terminal_line(f"no baseline to compare with: {s.baseline_missing}"), yellow=True
            )
            tr.write_line(
                "FAILED: --perf-strict / --benchmark-compare-fail ask for a baseline"
                if s.strict
                else "Nothing gated; save one with --benchmark-autosave (or --benchmark-save=NAME)."
            )
        elif s.result is not None:
            _verdict_table(tr, s.result, s.config.getoption("verbose") > 0, s.runs)
            for line in s.drifts:
                tr.write_line(terminal_line(line), yellow=True)
            if s.remeasured:
                tr.write_line(terminal_line(f"re-measured: {', '.join(sorted(set(s.remeasured)))}"))
            if s.note:
                tr.write_line(terminal_line(s.note))
    if s.saved is not None:
        tr.write_line(f"perf: saved metrics of {len(s.results)} tests to {s.saved}")
        if s.partial:
            tr.write_line(
                f"perf: saved as a partial run ({s.partial}): a plain --benchmark-compare "
                "never picks it as the baseline",
                yellow=True,
            )
    for what, why in s.noisy.items():
        tr.write_line(
            terminal_line(
                f"perf: NOISY baseline {what}: {why}; saved flagged noisy, every comparison "
                "against it says so"
            ),
            yellow=True,
        )
    if s.save_skipped:
        tr.write_line(f"perf: nothing saved: {s.save_skipped}")
    for problem in s.not_written:
        tr.write_line(terminal_line(f"perf: ERROR: {problem}"), red=True, bold=True)
    if s.not_written:
        tr.write_line(
            f"perf: exit status {EXIT_NOT_WRITTEN}: results not written (the verdict above stands)",
            red=True,
        )


def against_section(tr: Any, s: PerfSession) -> None:
    """The "perf gate against REF" section."""
    req = s.against
    if req is None:
        return
    from perf.gate.base_tree import show_ref
    from perf.report.text import terminal_line

    shown = show_ref(req.ref)
    tr.section(terminal_line(f"perf gate against {shown}"))
    for problem in s.against_not_written:
        tr.write_line(terminal_line(f"perf: ERROR: {problem}"), red=True, bold=True)
    if s.interrupted:
        tr.write_line(terminal_line(f"interrupted: {s.interrupted}"), red=True)
        return
    if s.against_refused:
        tr.write_line(
            terminal_line(
                f"ERROR: cannot measure {shown} ({req.commit[:12]}): {s.against_refused}"
            ),
            red=True,
        )
        return
    for note in s.against_notes:
        tr.write_line(note)
    if s.against_result is not None:
        _verdict_table(tr, s.against_result, s.config.getoption("verbose") > 0)
