"""pytest glue for ``--perf-against=REF``: gate this run's timings against REF's *code*, measured
alternately with the working tree's in fresh processes on this machine (:mod:`perf.against`).

The gate for runners where no two jobs share a machine (hosted CI): no stored baseline is
needed. Counts and bytes are gated too, against the base side's first child run.

Exit status: 1 on a regression; 4 (usage error) when REF names no local commit (checked at
start-up) or the base commit's code cannot be measured (the reason is printed).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from perf import against as _against


@dataclass
class AgainstState:
    """What ``--perf-against`` asked for, and what it found (filled at session end)."""

    ref: str
    repo: Path
    commit: str
    max_pairs: int
    outcome: _against.AgainstOutcome | None = None
    result: Any = None  # perf.gate.GateResult
    refused: str | None = None
    notes: list[str] = field(default_factory=list)


STATE_KEY = pytest.StashKey[AgainstState]()


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
        default=5,
        help="At most N base/head pairs per --perf-against verdict (default 5, the fewest "
        "that bound a median at 95%%; unchanged tests usually stop after 1).",
    )


def pytest_configure(config: pytest.Config) -> None:
    ref = config.getoption("--perf-against")
    if not ref or hasattr(config, "workerinput") or config.getoption("--perf-child-out", None):
        return
    pairs = config.getoption("--perf-pairs")
    if _against.lower_rank(pairs, 0.95) < 1:
        raise pytest.UsageError(
            f"--perf-pairs={pairs}: at least 5 pairs are needed to bound a median at 95%"
        )
    repo = _against.repo_root(config.rootpath)
    if repo is None:
        raise pytest.UsageError(
            f"--perf-against={ref}: {config.rootpath} is not inside a git repository"
        )
    commit = _against.resolve_commit(repo, ref)
    if commit is None:
        raise pytest.UsageError(
            f"--perf-against={ref}: no such commit in {repo}. In CI, fetch it first "
            f"(actions/checkout with fetch-depth: 0, or `git fetch origin {ref}`)."
        )
    config.stash[STATE_KEY] = AgainstState(ref, repo, commit, pairs)


def _child_env(config: pytest.Config) -> dict[str, str]:
    from perf import remeasure

    torch = sys.modules.get("torch")  # same intra-op threads on both sides, if torch is in use
    return remeasure.child_env(os.environ, torch.get_num_threads() if torch else None)


def _set_exit(session: pytest.Session, code: pytest.ExitCode) -> None:
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = code


def _interleave(
    session: pytest.Session,
    repo: Path,
    commit: str,
    margins: dict[tuple[str, str], float],
    units: dict[tuple[str, str], str],
    all_nodeids: list[str],
    policy: Any,
) -> _against.AgainstOutcome:
    """:func:`perf.against.interleave` with this session's children: its arguments (minus
    saving, gating, reporting, xdist), its torch threads, this session's project packages."""
    from perf import remeasure

    config = session.config
    positionals = config.args if config.args_source == pytest.Config.ArgsSource.ARGS else []

    def head_cmd(nodeids: list[str], out: Path) -> list[str]:
        cmd = remeasure.child_command(
            config.invocation_params.args,
            positionals,
            nodeids,
            config.rootpath,
            out,
            xdist_loaded=config.pluginmanager.hasplugin("xdist"),
        )
        # pairs cancel the machine's drift: the reference workload would only cost time
        cmd[3:3] = ["--perf-no-reference"]
        return cmd

    project = _against.project_roots(sys.modules, repo, [str(item.path) for item in session.items])
    return _against.interleave(
        repo=repo,
        commit=commit,
        project=project,
        head_cmd=head_cmd,
        env=_child_env(config),
        cwd=config.invocation_params.dir,
        margins=margins,
        units=units,
        all_nodeids=all_nodeids,
        max_pairs=config.getoption("--perf-pairs"),
        confidence=policy.confidence,
        quantile=policy.time_quantile,
        max_load_skew=policy.busy_cpu_fraction if policy.busy_cpu_fraction < 1 else None,
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    st = config.stash.get(STATE_KEY, None)
    if st is None or session.exitstatus == pytest.ExitCode.INTERRUPTED:
        return
    from perf.plugin import collected_metrics
    from perf.plugin_gate import policy_from_config

    results = collected_metrics(config)
    if not results:
        st.notes.append("no test recorded a metric: nothing to gate")
        return
    policy = policy_from_config(config)
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
        st.outcome = _interleave(
            session, st.repo, st.commit, margins, units, sorted(results), policy
        )
    except _against.Refused as e:
        st.refused = str(e)
        _set_exit(session, pytest.ExitCode.USAGE_ERROR)
        return
    st.result = gate_result(st, results, policy)
    if st.result.failed:
        _set_exit(session, pytest.ExitCode.TESTS_FAILED)


def paired_rows(out: _against.AgainstOutcome, policy: Any) -> list[Any]:
    """The interleaved verdicts as the gate's :class:`perf.gate.MetricResult` rows."""
    from perf import gate as _gate

    rows = []
    for r in out.results:
        reason = r.describe()
        busy = [
            s
            for p in r.pairs
            for s in (p.base_busy, p.head_busy)
            if s is not None and s > policy.busy_cpu_fraction
        ]
        if busy:
            # information only: a neighbour present during both children of a pair cancels in
            # its ratio; one that came or went between them set that pair aside (skewed)
            reason += (
                f"; {len(busy)} of {2 * len(r.pairs)} children shared the machine "
                f"(up to {max(busy):.0%} of the CPUs), on both sides of their pairs"
            )
        status = "inconclusive" if r.verdict == "undecided" else r.verdict
        base_locs = sorted(p.base for p in r.pairs)
        head_locs = sorted(p.head for p in r.pairs)
        rows.append(
            _gate.MetricResult(
                r.nodeid,
                r.name,
                r.unit,
                "time" if r.unit == "s" else "ratio",
                status,
                old=base_locs[len(base_locs) // 2] if base_locs else None,
                new=head_locs[len(head_locs) // 2] if head_locs else None,
                ratio=r.median_ratio if r.pairs else None,
                ci=(r.lower, r.upper) if r.pairs else None,
                margin=r.margin,
                reason=reason,
            )
        )
    return rows


def gate_result(st: AgainstState, results: dict[str, dict[str, Any]], policy: Any) -> Any:
    """One :class:`perf.gate.GateResult`: counts and bytes against the base side's run, times
    and ratios from the interleaved pairs."""
    from perf import baseline as _baseline
    from perf import gate as _gate

    assert st.outcome is not None
    out = st.outcome
    timed = {(r.nodeid, r.name) for r in out.results}
    rows: list[Any] = []
    if out.base_run is not None:
        current = _baseline.make_run(
            results, name="head", fingerprint=out.base_run.fingerprint, commit={}
        )
        counted = _gate.compare_runs(
            out.base_run,
            current,
            policy,
            only=lambda nodeid, name: (nodeid, name) not in timed,
        )
        rows.extend(r for r in counted.results if r.kind not in ("time", "ratio"))
    rows.extend(paired_rows(out, policy))
    notes = [
        f"interleaved against {st.ref} ({st.commit[:12]}): {out.children} child runs, "
        f"{out.wall_s:.1f} s",
        *out.notes,
    ]
    return _gate.GateResult(
        f"{st.ref} ({st.commit[:12]}) code", "this tree", tuple(rows), None, tuple(notes)
    )


def _rechecked(r: Any) -> bool:
    """A stored-gate timing verdict worth settling against the baseline's code: a suspected
    regression, an inconclusive one, or one not compared because the machine differs."""
    return r.kind in ("time", "ratio") and (
        r.status in ("regression", "inconclusive")
        or (r.status == "refused" and r.reason.startswith("timings not compared"))
    )


def recheck_against_baseline_commit(
    session: pytest.Session, baseline: Any, result: Any, policy: Any
) -> tuple[Any, str | None, bool]:
    """For ``--benchmark-compare``: settle the stored gate's doubtful timings by measuring
    them alternately on the baseline's commit's code and this tree's.

    Returns ``(result, note, done)``; ``done`` False means the caller falls back to its own
    re-measurement (the note says why: no commit recorded, not in this repository, refused).
    """
    from dataclasses import replace

    doubtful = [r for r in result.results if _rechecked(r)]
    if not doubtful:
        return result, None, False
    config = session.config
    commit_id = (baseline.commit or {}).get("id")
    if not isinstance(commit_id, str) or not commit_id:
        return result, "the baseline recorded no commit: re-measured in this tree only", False
    repo = _against.repo_root(config.rootpath)
    commit = _against.resolve_commit(repo, commit_id) if repo is not None else None
    if repo is None or commit is None:
        where = "no git repository here" if repo is None else f"not in {repo}"
        return (
            result,
            f"the baseline's commit {commit_id[:12]} is {where} (fetch it to compare against "
            "its code); re-measured in this tree only",
            False,
        )
    margins = {(r.nodeid, r.name): float(r.margin or policy.time_tolerance) for r in doubtful}
    units = {(r.nodeid, r.name): r.unit for r in doubtful}
    try:
        out = _interleave(
            session, repo, commit, margins, units, sorted({r.nodeid for r in doubtful}), policy
        )
    except _against.Refused as e:
        return result, f"cannot measure the baseline's commit {commit[:12]}: {e}", False
    settled = {(r.nodeid, r.name): r for r in paired_rows(out, policy)}
    rows = tuple(settled.get((r.nodeid, r.name), r) for r in result.results)
    dirty = " (the baseline was saved from a modified tree)" if baseline.commit.get("dirty") else ""
    note = (
        f"doubtful timings measured alternately against the baseline's commit "
        f"{commit[:12]}{dirty}: {out.children} child runs, {out.wall_s:.1f} s"
    )
    return replace(result, results=rows, notes=(*result.notes, note, *out.notes)), note, True


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    st = config.stash.get(STATE_KEY, None)
    if st is None:
        return
    from perf.report import gate_table

    tr = terminalreporter
    tr.section(f"perf gate against {st.ref}")
    if st.refused:
        tr.write_line(f"ERROR: cannot measure {st.ref} ({st.commit[:12]}): {st.refused}", red=True)
        return
    for note in st.notes:
        tr.write_line(note)
    if st.result is not None:
        for line in gate_table(st.result, verbose=config.getoption("verbose") > 0):
            red = line.startswith("REGRESS")
            tr.write_line(line, red=red, bold=red)
