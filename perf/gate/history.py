"""Each metric over the stored runs, in commit order, and where its level changed.

Change points come from Apache Otava's e-divisive means (``otava.analysis``, the detector of
Fleming et al., "Hunter", ICPE 2023; optional extra ``history``): a regression that crept in a
few percent at a time never fails a one-baseline gate, but it is a new level in the series.
We do not write our own detector.

Everything here is a pure function of loaded runs, except :func:`git_commit_order`, which
asks git for the commit order once.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf.store.runs import Run

#: Kinds whose values are only comparable between equal machine fingerprints.
TIMED_KINDS = ("time", "ratio", "compile")
#: Otava's significance level: a change point is kept when its t-test p-value is below it.
MAX_PVALUE = 0.001


class OtavaMissing(ImportError):
    """Change points need Apache Otava, which is an optional extra."""

    def __init__(self) -> None:
        super().__init__(
            "change points need Apache Otava, which is not installed: "
            "pip install 'pytest-torch-perf[history]' (or pip install apache-otava)"
        )


@dataclass(frozen=True)
class Point:
    """One run's value of one metric."""

    run: str
    commit: str | None
    date: str
    value: float


@dataclass(frozen=True)
class Series:
    """One metric of one test over the runs, oldest first."""

    nodeid: str
    metric: str
    unit: str
    kind: str
    higher_is_better: bool
    points: tuple[Point, ...]

    @property
    def values(self) -> list[float]:
        return [p.value for p in self.points]


@dataclass(frozen=True)
class ChangePoint:
    """A new level of a series starting at ``points[index]`` (the first run on it)."""

    index: int
    commit: str | None
    run: str
    mean_before: float
    mean_after: float
    pvalue: float

    @property
    def change(self) -> float:
        """Relative change of the level (0.03: 3 % higher); inf from a zero level."""
        if self.mean_before == 0:
            return 0.0 if self.mean_after == 0 else math.inf
        return self.mean_after / self.mean_before - 1.0


def git_commit_order(cwd: str | Path | None = None) -> list[str]:
    """Commits of HEAD's history, oldest first (empty outside git)."""
    try:
        out = subprocess.run(
            ["git", "rev-list", "--topo-order", "--reverse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return out.stdout.split() if out.returncode == 0 else []


def order_runs(runs: Sequence[Run], commit_order: Sequence[str] = ()) -> list[Run]:
    """Runs by commit where git knows the commit, else by run time.

    Runs are first put in time order; the runs whose commits are in ``commit_order`` then
    take their own slots in commit order (a re-run of an old commit goes back to that
    commit), and the others keep theirs.
    """
    pos = {c: i for i, c in enumerate(commit_order)}
    by_time = sorted(runs, key=lambda r: (r.date, r.number or 0))
    slots = [i for i, r in enumerate(by_time) if r.commit.get("id") in pos]
    known = sorted(
        (by_time[i] for i in slots), key=lambda r: (pos[r.commit["id"]], r.date, r.number or 0)
    )
    out = list(by_time)
    for i, r in zip(slots, known, strict=True):
        out[i] = r
    return out


def series(
    runs: Sequence[Run],
    metrics: Iterable[str] | None = None,
    *,
    tests: str | None = None,
    include_partial: bool = False,
) -> list[Series]:
    """Every (test, metric) over ``runs`` (already ordered), passed tests only.

    ``metrics``: names to keep (all if None); ``tests``: a node-id prefix. Partial runs are
    left out unless ``include_partial`` (they never become baselines either). Time, ratio and
    compile metrics keep only runs whose fingerprint matches the newest run's on
    :data:`perf.core.devices.TIMING_KEYS`: other machines' times are another series.
    """
    from perf.core.devices import TIMING_KEYS, fingerprint_diff  # not on plugin load

    wanted = set(metrics) if metrics is not None else None
    used = [r for r in runs if include_partial or r.partial is None]
    newest_fp = used[-1].fingerprint if used else {}
    acc: dict[tuple[str, str], list[Point]] = {}
    meta: dict[tuple[str, str], Mapping[str, Any]] = {}
    for r in used:
        timed_ok = not fingerprint_diff(newest_fp, r.fingerprint, TIMING_KEYS)
        for nodeid, entry in r.tests.items():
            if entry.get("outcome") != "passed" or (tests and not nodeid.startswith(tests)):
                continue
            for m in entry["metrics"]:
                if wanted is not None and m["name"] not in wanted:
                    continue
                if m["kind"] == "info" or (m["kind"] in TIMED_KINDS and not timed_ok):
                    continue
                key = (nodeid, m["name"])
                meta.setdefault(key, m)
                acc.setdefault(key, []).append(
                    Point(r.label, r.commit.get("id"), r.date, float(m["value"]))
                )
    return [
        Series(
            nodeid,
            name,
            meta[(nodeid, name)]["unit"],
            meta[(nodeid, name)]["kind"],
            bool(meta[(nodeid, name)].get("higher_is_better", False)),
            tuple(points),
        )
        for (nodeid, name), points in sorted(acc.items())
    ]


def change_points(
    s: Series, *, max_pvalue: float = MAX_PVALUE, min_magnitude: float = 0.0, window: int = 50
) -> list[ChangePoint]:
    """Where ``s`` changes level, by Otava's e-divisive means (:class:`OtavaMissing` if absent).

    ``window``: Otava's sliding window (runs); ``min_magnitude``: relative changes below it
    are merged away even when significant.
    """
    try:
        from otava.analysis import compute_change_points
    except ImportError:
        raise OtavaMissing() from None
    values = s.values
    if len(values) < 3:
        return []
    found, _weak = compute_change_points(
        values, window_len=max(window, 3), max_pvalue=max_pvalue, min_magnitude=min_magnitude
    )
    out = []
    for cp in found:
        i = int(cp.index)
        p = s.points[i]
        out.append(
            ChangePoint(
                i,
                p.commit,
                p.run,
                float(cp.stats.mean_1),
                float(cp.stats.mean_2),
                float(cp.stats.pvalue),
            )
        )
    return out
