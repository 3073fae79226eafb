"""pytest glue for ``--perf-against=REF``: gate this run's timings against REF's *code*, measured
alternately with the working tree's in fresh processes on this machine (:mod:`perf.gate.against`).
The options, their checks and the terminal section live here; the session end is the
session's (:meth:`perf.plugin.session.PerfSession.gate_against`, called from
:mod:`perf.plugin.gate`'s ``pytest_sessionfinish`` after the stored gate).

The gate for runners where no two jobs share a machine (hosted CI): no stored baseline is
needed. Counts and bytes are gated too, against the base side's first child run.

Exit status: 1 on a regression; 4 (usage error) when REF names no local commit (checked at
start-up) or the base commit's code cannot be measured (the reason is printed).
"""

from __future__ import annotations

from typing import Any

import pytest

from perf.gate import base_tree
from perf.gate.paired import DEFAULT_PAIRS, lower_rank
from perf.plugin.session import perf_session
from perf.plugin.terminal import against_section


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perf", "PyTorch performance properties (perf)")
    group.addoption(
        "--perf-against",
        metavar="REF",
        default=None,
        help="Gate timings against the code of git commit REF (e.g. origin/main, HEAD~1): "
        "the tests that recorded a time are re-run alternately on REF's code (a temporary "
        "git worktree) and on this tree's, each in a fresh process; counts and bytes are "
        "compared with REF's run too. Exit 1 on a regression.",
    )
    group.addoption(
        "--perf-pairs",
        metavar="N",
        type=int,
        default=DEFAULT_PAIRS,
        help="Base/head pairs per --perf-against verdict (default 8: a regression needs 7 "
        "of 8 pairs slower and the median pair beyond the margin; at least 5; unchanged "
        "tests usually stop after 3-4; pairs set aside for a machine-state change are "
        "replaced, at most N extra).",
    )


def pytest_configure(config: pytest.Config) -> None:
    ref = config.getoption("--perf-against")
    if ref is None or hasattr(config, "workerinput") or config.getoption("--perf-child-out", None):
        return
    shown = base_tree.show_ref(ref)
    if not ref.strip():
        # --perf-against="$BASE_SHA" with the variable unset: never a silently disabled gate
        raise pytest.UsageError(
            "--perf-against is empty (an unset CI variable such as $BASE_SHA?): name a commit "
            "(e.g. --perf-against=origin/main) or leave the option out"
        )
    workers = getattr(config.option, "numprocesses", None)
    if workers not in (None, 0, "0") and config.pluginmanager.hasplugin("xdist"):
        # The base tree's code is found from what this process imported; an xdist controller
        # imports no test module, so nothing would be swapped and every verdict would
        # compare the working tree with itself.
        raise pytest.UsageError(
            f"--perf-against cannot run under pytest-xdist (-n {workers}): the base commit's "
            "code is found from the modules this process imports, and an xdist controller "
            "imports none; run it in one process: pytest -p no:xdist --perf-against=REF"
        )
    pairs = config.getoption("--perf-pairs")
    if lower_rank(pairs, 0.95) < 1:
        raise pytest.UsageError(
            f"--perf-pairs={pairs}: at least 5 pairs are needed to bound a median at 95%"
        )
    try:
        repo = base_tree.repo_root(config.rootpath)
        if repo is None:
            raise pytest.UsageError(
                f"--perf-against={shown}: {config.rootpath} is not inside a git repository"
            )
        commit = base_tree.resolve_commit(repo, ref)
        if commit is None:
            raise pytest.UsageError(
                f"--perf-against={shown}: {base_tree.missing_commit_problem(repo, ref)}"
            )
    except base_tree.GitMissing as e:
        raise pytest.UsageError(f"--perf-against={shown}: {e}") from None
    from perf.gate.interleaved import AgainstRequest

    s = perf_session(config)
    s.against = AgainstRequest(ref, repo, commit)
    # a run killed outright (SIGKILL) could not remove its base worktree: this one does
    s.against_notes.extend(base_tree.remove_stale_worktrees(repo))


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """After the stored gate's section and the metrics table."""
    against_section(terminalreporter, perf_session(config))
