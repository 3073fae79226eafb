"""The regression gate: compare a run's metrics with a stored run, one policy per metric kind.

Policies (design.md, "Metrics model"):

- ``count``: exact. Any increase is a regression, any decrease an improvement. Counts ignore
  tolerances on purpose: a count is identical on every run, so a margin could only hide a bug.
- ``bytes``: relative tolerance (default 2%).
- ``time``: statistical, only between runs with equal machine fingerprints (``TIMING_KEYS``)
  and only between serial runs (xdist workers share the cores, so their clocks lie). A time
  regresses when the whole confidence interval (bootstrap, fixed seed) of the ratio
  new/old lies above ``1 + margin``: the interval gives the confidence, the margin (default
  10%) is the minimum effect worth failing a build for. Because the interval only knows the
  noise *inside* each run, not the drift *between* runs, three more guards apply:

  1. *Reference normalisation.* Every saving or comparing run times a small fixed torch
     workload at session start and end (:func:`~perf.gate.reference.reference_samples`),
     always on :data:`~perf.gate.reference.REFERENCE_THREADS` intra-op threads whatever the
     session's thread state (a test module calling ``torch.set_num_threads(1)`` made it
     1.3x "slower" and every verdict inconclusive; runs whose references used other or
     unknown thread counts are not normalised against each other). A machine that is
     uniformly slower today slows the reference too, so a regression must show raw *and*
     divided by the reference's factor (quickest bracket now / quickest then). A factor
     outside ``1 +- reference_band`` (25%) means the machine is not in the state it was in:
     time verdicts are then ``undecided``, reported loudly, failed only under
     ``perf_undecided = fail``.
  2. *Busy-machine check.* Other processes' share of the CPUs during each run
     (:mod:`perf.core.contention`, from ``/proc/stat``) above ``busy_cpu_fraction`` (10%) makes
     time verdicts ``undecided`` too (measured on a shared 2-core box: a neighbour slowed
     a 1-thread Python loop ~2x while the reference moved under 2%).
  3. *Re-measurement in fresh processes.* A suspected time regression (or one made
     inconclusive only by the machine's state now) is measured again by the plugin in a
     new pytest process that runs just the suspects (:mod:`perf.gate.remeasure`), with its own
     reference brackets and CPU share, and fails only if every such re-measurement confirms
     it (:func:`confirm`). A fresh process, because per-process bias (memory layout, core,
     host) survives re-running inside the same process.

  The location statistic is a low quantile (25th percentile) of the raw samples, not the
  median: interference from a neighbour only ever *adds* time, so the lower part of the
  sample distribution moves with the code, and much less with the neighbour.
- ``ratio``: paired within-run ratios (``perf.compare``) are already relative, so they need no
  reference; they are compared like times (median of the per-pair ratios), with the
  direction taken from ``higher_is_better``.
- ``info``: never gated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from perf.core.verdicts import Reason, TimedVerdict, Verdict
from perf.gate.kinds import (
    busy_reason,
    compare_bytes,
    compare_compile,
    compare_count,
    compare_timed,
    timing_refusal,
    unpaired,
)
from perf.gate.modelled import compare_modelled
from perf.gate.reference import (
    reference_factor,
    reference_mismatch,
)
from perf.gate.verdict import GateResult, MetricResult, Policy
from perf.store.runs import Run

__all__ = ["compare_runs", "confirm", "suspects"]


def compare_runs(
    baseline: Run,
    current: Run,
    policy: Policy | None = None,
    *,
    only: Callable[[str, str], bool] | None = None,
) -> GateResult:
    """Compare every metric of ``current`` with ``baseline``. Pure: no clocks, no I/O.

    ``only(nodeid, metric_name)`` restricts the comparison (used to re-check suspects).
    """
    policy = policy or Policy()
    refused = timing_refusal(baseline, current)
    factor = None if refused else reference_factor(current, baseline)
    busy_now = busy_reason(current, policy, "now")
    busy_then = busy_reason(baseline, policy, "when the baseline was saved")
    out: list[MetricResult] = []
    for nodeid in sorted(set(baseline.tests) | set(current.tests)):
        old_ms = {m["name"]: m for m in baseline.tests.get(nodeid, {}).get("metrics", [])}
        new_ms = {m["name"]: m for m in current.tests.get(nodeid, {}).get("metrics", [])}
        for name in sorted(set(old_ms) | set(new_ms)):
            if only is not None and not only(nodeid, name):
                continue
            om, nm = old_ms.get(name), new_ms.get(name)
            ref = nm if nm is not None else om
            assert ref is not None
            if ref["kind"] == "info":
                continue
            if om is None or nm is None:
                out.append(unpaired(nodeid, name, ref, current, new_run=om is None))
                continue
            if om["unit"] != nm["unit"]:
                out.append(
                    MetricResult(
                        nodeid,
                        name,
                        nm["unit"],
                        nm["kind"],
                        "refused",
                        float(om["value"]),
                        float(nm["value"]),
                        reason=f"unit changed from {om['unit']!r} to {nm['unit']!r}",
                    )
                )
                continue
            kind = nm["kind"]
            if kind == "count":
                out.append(compare_count(nodeid, om, nm))
            elif kind == "bytes":
                out.append(compare_bytes(nodeid, om, nm, policy))
            elif kind == "compile":
                out.append(compare_compile(nodeid, om, nm, policy))
            elif kind == "modelled":
                out.append(compare_modelled(nodeid, om, nm))
            elif refused:
                out.append(
                    MetricResult(
                        nodeid,
                        name,
                        nm["unit"],
                        kind,
                        "refused",
                        float(om["value"]),
                        float(nm["value"]),
                        reason=f"timings not compared: {refused}",
                        timed=TimedVerdict(
                            Verdict.UNDECIDED,
                            Reason.NOT_COMPARABLE,
                            None,
                            None,
                            None,
                            policy.margin(kind, nm.get("tolerance")),
                            detail=refused,
                        ),
                    )
                )
            else:
                out.append(compare_timed(nodeid, om, nm, policy, factor, busy_now, busy_then))
    notes: list[str] = []
    # the reference workload speaks only to times: no note where only counts were compared
    if any(r.kind not in ("count", "bytes", "compile", "modelled") for r in out):
        mismatch = None if refused else reference_mismatch(current, baseline)
        band = 1 + policy.reference_band
        if mismatch:
            notes.append(mismatch)
        elif factor is not None and 1 / band <= factor <= band:
            notes.append(
                f"reference workload ran x{factor:.3f} as long as in the baseline (quickest "
                "bracket now / then); times are judged raw and divided by it"
            )
        elif factor is not None:
            notes.append(
                f"the machine is not in the state it was in when the baseline was saved: the "
                f"reference workload's time moved beyond x{1 / band:.2f}..x{band:.2f}, so it "
                "is not used to normalise, and time verdicts that would change are undecided"
            )
    return GateResult(baseline.label, current.label, tuple(out), refused, tuple(notes))


def _is_suspect(r: MetricResult) -> bool:
    return r.kind in ("time", "ratio") and (
        r.status == "regression" or (r.status == "undecided" and r.recheck)
    )


def suspects(result: GateResult) -> dict[str, set[str]]:
    """nodeid -> metric names worth measuring again: statistical regressions, and
    regressions made inconclusive only by the state of the machine during this run."""
    out: dict[str, set[str]] = {}
    for r in result.results:
        if _is_suspect(r):
            out.setdefault(r.nodeid, set()).add(r.name)
    return out


def confirm(
    result: GateResult, baseline: Run, remeasured: Run, policy: Policy | None = None
) -> GateResult:
    """Keep a time/ratio regression only if a re-measurement regresses too.

    ``remeasured`` holds the suspects' metrics from a second run of those tests (a fresh
    process, with its own reference samples and CPU share). A suspect the second measurement
    clears becomes ``unchanged``, with both ratios in its reason; one it cannot judge (busy
    machine, an interval across the margin, an improvement) becomes ``undecided``,
    re-checkable by a further re-measurement; a missing re-measurement keeps the first
    verdict. Applied once per re-measurement, a regression survives only if every
    re-measurement that could judge it confirms it.
    """
    sus = suspects(result)
    if not sus:
        return result
    again = compare_runs(
        baseline, remeasured, policy, only=lambda nid, name: name in sus.get(nid, set())
    )
    second = {(r.nodeid, r.name): r for r in again.results}
    out: list[MetricResult] = []
    for r in result.results:
        s = second.get((r.nodeid, r.name))
        if not _is_suspect(r) or s is None or s.status in ("missing", "new"):
            out.append(r)
            continue
        if s.status == "refused":
            out.append(replace(r, reason=f"{r.reason}; re-measurement not comparable: {s.reason}"))
            continue
        first = f"{r.ratio:.3f}" if r.ratio is not None else "n/a"
        if s.status in ("undecided", "improvement"):
            # busy again, straddling, or the two measurements disagree: nothing proven
            out.append(
                replace(
                    r,
                    status="undecided",
                    timed=s.timed,
                    recheck=s.recheck,
                    remeasured_ratio=s.ratio,
                    reason=f"first measurement {first}; re-measurement: {s.reason}",
                )
            )
        elif s.status == "regression":
            # Report the milder of the two measurements: that is what is proven.
            keep = s if _severity(s) < _severity(r) or r.status != "regression" else r
            out.append(
                replace(
                    keep,
                    status="regression",
                    recheck=False,
                    remeasured_ratio=s.ratio,
                    confirmations=r.confirmations + 1,
                )
            )
        else:
            out.append(
                replace(
                    r,
                    status="unchanged",
                    recheck=False,
                    timed=s.timed,
                    remeasured_ratio=s.ratio,
                    reason=f"first measurement {first}, re-measured {s.ratio:.3f}: not confirmed"
                    if s.ratio is not None
                    else f"first measurement {first}; re-measurement: {s.reason}",
                )
            )
    return replace(result, results=tuple(out))


def _severity(r: MetricResult) -> float:
    if r.ratio is None:
        return math.inf
    return 1 / r.ratio if r.higher_is_better else r.ratio
