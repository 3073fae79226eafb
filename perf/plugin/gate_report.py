"""The gates' Markdown for ``--perf-report`` and ``$GITHUB_STEP_SUMMARY``: plain functions
of what the session found (the session calls them at its end; no hooks here)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from perf.gate.interleaved import AgainstRequest
    from perf.gate.verdict import GateResult


def wants_markdown(config: pytest.Config) -> bool:
    """Whether a report is asked for (``--perf-report``, or a GitHub Actions step summary)."""
    return bool(config.getoption("--perf-report") or os.environ.get("GITHUB_STEP_SUMMARY"))


def write_markdown(config: pytest.Config, text: str, *, append: bool) -> tuple[list[str], bool]:
    """Write ``text`` to ``--perf-report`` (replacing the file, or appended to it when an
    earlier writer of the session wrote it: ``append``) and append it to
    ``$GITHUB_STEP_SUMMARY``. Returns what could not be written, each naming the path and
    the OS error, and whether ``--perf-report`` was written."""
    from perf.gate.validate import os_error_text

    problems = []
    written = False
    path = config.getoption("--perf-report")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a" if append else "w", encoding="utf-8") as fh:
                fh.write("\n" + text if append else text)
            written = True
        except OSError as e:
            problems.append(f"could not write --perf-report {path}: {os_error_text(e)}")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as e:
            problems.append(
                f"could not append to $GITHUB_STEP_SUMMARY {summary}: {os_error_text(e)}"
            )
    return problems, written


def against_markdown(
    req: AgainstRequest, refused: str | None, result: GateResult | None, notes: list[str]
) -> str:
    """``--perf-against``'s section (appended to the stored gate's report when both ran)."""
    from perf.report.text import gate_markdown, md_code, md_text

    title = f"## perf gate against {md_code(req.ref)}"
    if refused:
        return f"{title}\n\n**Error:** cannot measure it: {md_text(refused)}\n"
    body = gate_markdown(result).split("\n", 1)[1]
    return title + "\n" + "".join(f"> {md_text(n)}\n" for n in notes) + body
