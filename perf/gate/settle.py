"""Settling the stored gate's doubtful timings: the algorithms, without pytest.

A stored comparison (:func:`perf.gate.compare.compare_runs`) can only say "this run is
slower than the stored one". Before that fails a pull request the gate asks again, and the
plugin session (:mod:`perf.plugin.session`) only supplies the ways to measure:

- :func:`recheck_against_commit`: measure the doubtful timings alternately on the baseline's
  commit's code and this tree's (``interleave``, :func:`perf.gate.against.interleave` in the
  plugin), and tell a slower *code* from a slower *machine or environment*;
- :func:`settle_stored`: where that is not possible, re-measure the suspects in up to
  ``tries`` fresh processes of this tree (``remeasure``); every re-measurement must confirm;
- :func:`flag_noisy`: before saving, re-measure once the times too dispersed to anchor a
  verdict, and flag those that stay dispersed.

The measuring callables are parameters so these functions are tested with recorded runs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path

from perf.gate import base_tree
from perf.gate import compare as _compare
from perf.gate.against import AgainstOutcome
from perf.gate.dispersion import noisy_metrics
from perf.gate.interleaved import code_or_environment, needs_recheck, paired_rows
from perf.gate.verdict import GateResult, Policy
from perf.store.runs import Run

#: ``remeasure(nodeids, attempt)``: those tests' run in a fresh process, or None and why not.
Remeasure = Callable[[list[str], int], "tuple[Run | None, str | None]"]
#: ``interleave(repo, commit, margins, units, nodeids, budget_s)``: the alternate measurement.
Interleave = Callable[
    [Path, str, dict[tuple[str, str], float], dict[tuple[str, str], str], list[str], float | None],
    AgainstOutcome,
]


class MeasurementInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped an interleaved measurement (the caller reported it)."""


@dataclass(frozen=True)
class Settled:
    """The settled verdicts, what the settling step says, and the tests re-measured."""

    result: GateResult
    note: str | None = None
    remeasured: tuple[str, ...] = ()
    #: True when the interleaved re-check answered (no fresh-process fallback needed).
    done: bool = False


def recheck_against_commit(
    baseline: Run,
    result: GateResult,
    policy: Policy,
    current: Run | None,
    *,
    rootpath: Path,
    interleave: Interleave,
) -> Settled:
    """Settle the doubtful timings (:func:`perf.gate.interleaved.needs_recheck`) by measuring
    them alternately on the baseline's commit's code and this tree's. ``done`` False: the
    caller falls back to re-measuring this tree; the note says why (no commit recorded, not
    in this repository, refused)."""
    doubtful = [r for r in result.results if needs_recheck(r)]
    if not doubtful:
        return Settled(result)
    commit_id = (baseline.commit or {}).get("id")
    if not isinstance(commit_id, str) or not commit_id:
        return Settled(result, "the baseline recorded no commit: re-measured in this tree only")
    shown = base_tree.show_ref(commit_id[:12])
    try:
        repo = base_tree.repo_root(rootpath)
        commit = base_tree.resolve_commit(repo, commit_id) if repo is not None else None
    except base_tree.GitMissing as e:
        return Settled(result, f"{e}: re-measured in this tree only")
    if repo is None or commit is None:
        where = "no git repository here" if repo is None else f"not in {repo}"
        fetch = " (fetch it to compare against its code)" if repo is not None else ""
        if repo is not None and not base_tree.HEX_COMMIT.match(commit_id):
            fetch = " (not a commit hash)"
        return Settled(
            result,
            f"the baseline's commit {shown} is {where}{fetch}; re-measured in this tree only",
        )
    margins = {(r.nodeid, r.name): policy.margin(r.kind, r.margin) for r in doubtful}
    units = {(r.nodeid, r.name): r.unit for r in doubtful}
    ids = sorted({r.nodeid for r in doubtful})
    try:
        out = interleave(repo, commit, margins, units, ids, policy.settle_budget_s)
    except MeasurementInterrupted as e:
        return Settled(result, str(e), done=True)
    except base_tree.Refused as e:
        return Settled(result, f"cannot measure the baseline's commit {commit[:12]}: {e}")
    settled = {(r.nodeid, r.name): r for r in paired_rows(out, policy)}
    rows = tuple(
        code_or_environment(r, settled[(r.nodeid, r.name)], baseline, current, policy)
        if (r.nodeid, r.name) in settled
        else r
        for r in result.results
    )
    dirty = " (the baseline was saved from a modified tree)" if baseline.commit.get("dirty") else ""
    note = (
        f"doubtful timings measured alternately against the baseline's commit "
        f"{commit[:12]}{dirty}: {out.children} child runs, {out.wall_s:.1f} s"
    )
    new = replace(result, results=rows, notes=(*result.notes, note, *out.notes))
    return Settled(new, note, done=True)


def settle_stored(
    baseline: Run,
    result: GateResult,
    policy: Policy,
    *,
    tries: int,
    workers: int,
    collected: Collection[str],
    remeasure: Remeasure,
    recheck: Callable[[GateResult], Settled] | None = None,
) -> Settled:
    """The stored gate's timing verdicts, settled: first ``recheck`` (against the baseline's
    commit, :func:`recheck_against_commit`), else by up to ``tries`` fresh runs of this
    tree's suspects among ``collected`` (never under xdist: ``workers`` > 0, the workers'
    runs are not one process's). A regression survives only if every re-measurement
    confirms it (:func:`perf.gate.compare.confirm`)."""
    if not tries:
        return Settled(result)
    if workers:
        note = "suspects not re-measured under xdist" if _compare.suspects(result) else None
        return Settled(result, note)
    first = recheck(result) if recheck is not None else Settled(result)
    if first.done:
        return first
    result, note = first.result, first.note
    if note and any(not r.recheck for r in result.undecided):
        note += "; undecided timings cannot be settled here and stay UNDECIDED"
    remeasured: list[str] = []
    for attempt in range(1, tries + 1):
        suspected = sorted(_compare.suspects(result))
        if not suspected:
            break
        sus = [n for n in suspected if n in collected]
        if not sus:
            note = "the suspects were not collected in this session; the first verdict stands"
            break
        again, why = remeasure(sus, attempt)
        if again is None:
            note = f"{why}; the first verdict stands"
            break
        remeasured.extend(sus)
        result = _compare.confirm(result, baseline, again, policy)
    return Settled(result, note, tuple(remeasured))


def flag_noisy(
    current: Run,
    policy: Policy,
    *,
    collected: Collection[str],
    remeasure: Remeasure | None,
) -> tuple[Run, dict[str, str]]:
    """Before saving: re-measure once, in a fresh process (``remeasure``; None: flag at
    once, e.g. under xdist), every time too dispersed to anchor a verdict
    (:mod:`perf.gate.dispersion`); keep the fresh samples where they are not, and flag the
    rest ``noisy`` with the reason. Returns the run to save and ``"nodeid metric" -> why``
    of the flagged ones; ``current`` itself is left as it was."""
    found = noisy_metrics(current.tests, policy.time_tolerance, policy.time_quantile)
    if not found:
        return current, {}
    tests = {
        nodeid: {**entry, "metrics": [dict(m) for m in entry["metrics"]]}
        for nodeid, entry in current.tests.items()
    }
    ids = sorted({n for n, _ in found if n in collected})
    if ids and remeasure is not None:
        again, why = remeasure(ids, 1)
        fresh = (
            noisy_metrics(again.tests, policy.time_tolerance, policy.time_quantile) if again else {}
        )
        for key in list(found):
            entry = (again.tests.get(key[0]) if again else None) or {}
            new = {m["name"]: m for m in entry.get("metrics", [])}.get(key[1])
            if new is None or entry.get("outcome") != "passed":
                found[key] += f"; re-measured in a fresh process: {why or 'not measured there'}"
            elif key not in fresh:
                for m in tests[key[0]]["metrics"]:
                    if m["name"] == key[1]:
                        m["value"] = new["value"]
                        m["samples"] = list(new.get("samples") or [])
                del found[key]
            else:
                found[key] = f"{fresh[key]} (and so in a fresh process: {found[key]})"
    for (nodeid, name), why in found.items():
        for m in tests[nodeid]["metrics"]:
            if m["name"] == name:
                m["noisy"] = why
    flagged = {f"{n} {m}": why for (n, m), why in sorted(found.items())}
    return replace(current, tests=tests), flagged
