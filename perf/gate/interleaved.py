"""The interleaved verdicts (:mod:`perf.gate.against`) as the gate's rows and result: pure
functions shared by ``--perf-against`` and the stored gate's re-check against the
baseline's commit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf.gate import against as _against
from perf.gate.verdict import GateResult, MetricResult, Policy, Status


@dataclass
class AgainstRequest:
    """What ``--perf-against`` asked for (checked at configure time)."""

    ref: str
    repo: Path
    commit: str


def paired_rows(out: _against.AgainstOutcome, policy: Policy) -> list[MetricResult]:
    """The interleaved verdicts as the gate's :class:`perf.gate.compare.MetricResult` rows."""
    from perf.gate import compare as _gate

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
        base_locs = sorted(p.base for p in r.pairs)
        head_locs = sorted(p.head for p in r.pairs)
        rows.append(
            _gate.MetricResult(
                r.nodeid,
                r.name,
                r.unit,
                "time" if r.unit == "s" else "ratio",
                "inconclusive" if r.verdict == "undecided" else r.verdict,
                old=base_locs[len(base_locs) // 2] if base_locs else None,
                new=head_locs[len(head_locs) // 2] if head_locs else None,
                ratio=r.median_ratio if r.pairs else None,
                ci=(r.lower, r.upper) if r.pairs else None,
                margin=r.margin,
                reason=reason,
                pairs=tuple(p.ratio for p in r.pairs),
                skewed_pairs=len(r.skewed),
            )
        )
    return rows


def gate_result(
    req: AgainstRequest,
    out: _against.AgainstOutcome,
    results: dict[str, dict[str, Any]],
    policy: Policy,
) -> GateResult:
    """One :class:`perf.gate.compare.GateResult`: counts and bytes against the base side's
    run, times and ratios from the interleaved pairs."""
    from perf.gate import compare as _gate
    from perf.store import baseline as _baseline

    timed = {(r.nodeid, r.name) for r in out.results}
    rows: list[MetricResult] = []
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
        f"interleaved against {req.ref} ({req.commit[:12]}): {out.children} child runs, "
        f"{out.wall_s:.1f} s",
        *out.notes,
    ]
    return _gate.GateResult(
        f"{req.ref} ({req.commit[:12]}) code", "this tree", tuple(rows), None, tuple(notes)
    )


def _rechecked(r: MetricResult) -> bool:
    """A stored-gate timing verdict worth settling against the baseline's code: a suspected
    regression, an inconclusive one, or one not compared because the machine differs."""
    return r.kind in ("time", "ratio") and (
        r.status in ("regression", "inconclusive")
        or (r.status == "refused" and r.reason.startswith("timings not compared"))
    )


def _stored_slower(r: MetricResult, policy: Policy) -> float | None:
    """How much slower (lower-is-better ratio) the stored comparison found ``r``, when beyond
    its margin; None otherwise."""
    ratio = r.ratio
    if ratio is None and r.old and r.new is not None:
        ratio = float(r.new) / float(r.old)
    if ratio is None or ratio <= 0:
        return None
    slower = 1.0 / ratio if r.higher_is_better else ratio
    margin = r.margin if r.margin is not None else policy.time_tolerance
    return slower if slower > 1.0 + margin else None


def code_or_environment(
    stored: MetricResult,
    interleaved: MetricResult,
    baseline: Any,
    current: Any,
    policy: Policy,
) -> MetricResult:
    """The verdict on a doubtful stored timing once its code was measured against the
    baseline's commit. Interleaving answers "is the code slower?", the stored baseline "is
    this run slower?": when the run is slower and the code is not, the change is the
    environment's, reported with what differs between the two runs and failed or not by
    ``policy.environment_change`` (nothing recorded differs: inconclusive, the machine's
    state is the likely cause)."""
    from dataclasses import replace

    from perf.store.environment import differences

    slower = _stored_slower(stored, policy)
    if slower is None or interleaved.status not in ("unchanged", "improvement"):
        return interleaved
    diffs = differences(
        getattr(baseline, "environment", None),
        getattr(current, "environment", None),
        getattr(baseline, "fingerprint", None),
        getattr(current, "fingerprint", None),
    )
    head = (
        f"x{slower:.2f} slower than the stored baseline, but this code is not slower than "
        f"the baseline's commit's in this environment ({interleaved.reason})"
    )
    status: Status
    if diffs:
        fail = policy.environment_change == "fail"
        reason = f"ENVIRONMENT changed: {'; '.join(diffs)}. {head}" + (
            "" if fail else "; not failed (perf_environment_change = warn)"
        )
        status = "regression" if fail else "inconclusive"
    else:
        reason = (
            f"{head}; nothing perf records differs (packages, environment variables, "
            "machine): the machine's state is the likely cause; not failed"
        )
        status = "inconclusive"
    return replace(
        interleaved,
        status=status,
        reason=reason,
        old=stored.old,
        new=stored.new,
        ratio=stored.ratio,
    )
