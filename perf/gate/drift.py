"""Drift: a metric whose last runs form a new, worse level, though no single step did.

The gate compares a run with one baseline and a margin, so +3 % per merge under a 5 % margin
passes forever. Over the history the same creep is a change point (:mod:`perf.gate.history`);
once the new level has held for ``k`` runs it is a *drift*, reported with the commit that
started it. Drift warns by default: it names a past commit, not the change under review, and
a level the team accepted (a feature that costs time) must not fail every later pull request.
``python -m perf history --fail-on-drift`` makes it fail (a scheduled job).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass

from perf.gate.history import (
    MAX_PVALUE,
    OtavaMissing,
    Series,
    change_points,
    git_commit_order,
    order_runs,
    series,
)
from perf.report.text import format_value
from perf.store.files import Store
from perf.store.runs import Run, load
from perf.store.schema import BaselineError

#: A new level must hold for this many runs before it is a drift (not one noisy run).
DEFAULT_K = 5
#: ... and is reported while it is at most this many runs old (after that it is history).
DEFAULT_WINDOW = 20
#: Smallest relative change of level reported as a drift.
DEFAULT_MIN_CHANGE = 0.01


@dataclass(frozen=True)
class Drift:
    """``metric`` of ``nodeid`` moved from ``before`` to ``after`` from ``commit`` on."""

    nodeid: str
    metric: str
    unit: str
    commit: str | None
    run: str
    before: float
    after: float
    runs_since: int
    pvalue: float

    @property
    def change(self) -> float:
        return self.after / self.before - 1.0 if self.before else float("inf")

    def message(self) -> str:
        where = f"commit {self.commit[:12]}" if self.commit else f"run {self.run}"
        return (
            f"{self.nodeid} {self.metric}: drifted {self.change:+.1%} "
            f"({format_value(self.before, self.unit)} -> {format_value(self.after, self.unit)}) "
            f"from {where} on, "
            f"held for the last {self.runs_since} runs (change point p={self.pvalue:.2g})"
        )


def worse(s: Series, before: float, after: float) -> bool:
    """Whether a level change from ``before`` to ``after`` is a regression of ``s``."""
    return after < before if s.higher_is_better else after > before


def drift(
    s: Series,
    *,
    k: int = DEFAULT_K,
    window: int = DEFAULT_WINDOW,
    min_change: float = DEFAULT_MIN_CHANGE,
    max_pvalue: float = MAX_PVALUE,
) -> Drift | None:
    """The drift of ``s``: its newest change point, if the level after it is worse by at
    least ``min_change``, has held for ``k`` to ``window`` runs, and reaches the last run."""
    if k < 1 or window < k:
        raise ValueError(f"drift needs 1 <= k <= window, got k={k}, window={window}")
    cps = change_points(s, max_pvalue=max_pvalue)
    if not cps:
        return None
    cp = cps[-1]
    since = len(s.points) - cp.index
    if not (k <= since <= window) or not worse(s, cp.mean_before, cp.mean_after):
        return None
    if abs(cp.change) < min_change:
        return None
    return Drift(
        s.nodeid,
        s.metric,
        s.unit,
        cp.commit,
        cp.run,
        cp.mean_before,
        cp.mean_after,
        since,
        cp.pvalue,
    )


def drifts(
    series: Sequence[Series],
    *,
    k: int = DEFAULT_K,
    window: int = DEFAULT_WINDOW,
    min_change: float = DEFAULT_MIN_CHANGE,
    max_pvalue: float = MAX_PVALUE,
) -> list[Drift]:
    """:func:`drift` of every series that has one, largest change first."""
    found = []
    for s in series:
        d = drift(s, k=k, window=window, min_change=min_change, max_pvalue=max_pvalue)
        if d is not None:
            found.append(d)
    return sorted(found, key=lambda d: -abs(d.change))


#: Stored runs the gate reads for drift: Otava's window, enough to see a level and its past.
GATE_HISTORY_RUNS = 50


def gate_lines(store: Store, current: Run, *, k: int = DEFAULT_K) -> list[str]:
    """The gate's drift warnings: the newest stored complete runs of ``current``'s machine,
    then ``current``, in commit order (the one function here that reads files and git).

    Nothing is read before Otava is known to be installed; without it, one line says drift
    was not checked, once the store holds runs enough for it to mean something (``2 * k``).
    Unreadable stored runs are left out (the gate names the one it compares with).
    """
    refs = store.runs(current.machine)[-GATE_HISTORY_RUNS:]
    if len(refs) + 1 < 2 * k:
        return []
    if importlib.util.find_spec("otava") is None:
        return [f"perf drift: not checked ({OtavaMissing()})"]
    past = []
    for ref in refs:
        try:
            run = load(ref.path)
        except BaselineError:
            continue
        if run.partial is None:
            past.append(run)
    ordered = order_runs(past, git_commit_order())
    try:
        found = drifts(series([*ordered, current], include_partial=True), k=k)
    except OtavaMissing as e:  # installed but cannot be imported
        return [f"perf drift: not checked ({e})"]
    return [f"DRIFT {d.message()}" for d in found]
