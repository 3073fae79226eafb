"""The stored gate's output: the terminal section, ``--perf-report`` and the step summary."""

from __future__ import annotations

import os
from typing import Any

import pytest

from perf.plugin.core import collected_metrics
from perf.plugin.gate_state import EXIT_NOT_WRITTEN, STATE_KEY, _active, write_markdown
from perf.plugin.timing_gate import github_warning, timing_gate


def _write_markdown(config: pytest.Config) -> None:
    from perf.report.text import gate_markdown

    st = config.stash[STATE_KEY]
    if not config.getoption("--perf-report") and not os.environ.get("GITHUB_STEP_SUMMARY"):
        return
    text = gate_markdown(
        st.result,
        saved=st.saved,
        missing=st.baseline_missing,
        error=st.error,
        problems=tuple(st.not_written),
    )
    st.not_written.extend(write_markdown(config, text))


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
                red = line.startswith(("REGRESS", "UNDECIDED"))
                tr.write_line(line, red=red, bold=red)
            github_warning(tr, st.result, st.runs)
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
    for what, why in st.noisy.items():
        tr.write_line(
            terminal_line(
                f"perf: NOISY baseline {what}: {why}; saved flagged noisy, every comparison "
                "against it says so"
            ),
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
