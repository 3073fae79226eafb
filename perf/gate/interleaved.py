"""The interleaved verdicts (:mod:`perf.gate.against`) as the gate's rows and result: pure
functions shared by ``--perf-against`` and the stored gate's re-check against the
baseline's commit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf.core.verdicts import Reason, TimedVerdict, Verdict
from perf.gate import against as _against
from perf.gate.verdict import GateResult, MetricResult, Policy, Status


@dataclass
class AgainstRequest:
    """What ``--perf-against`` asked for (checked at configure time)."""

    ref: str
    repo: Path
    commit: str


def timed_margins(
    results: dict[str, dict[str, Any]], policy: Policy
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], str]]:
    """The margin and unit of every time / ratio metric of the passed tests of ``results``
    (nodeid -> {"outcome", "metrics"}): what ``--perf-against`` measures alternately."""
    margins: dict[tuple[str, str], float] = {}
    units: dict[tuple[str, str], str] = {}
    for nodeid, entry in results.items():
        if entry["outcome"] != "passed":
            continue
        for m in entry["metrics"]:
            if m["kind"] in ("time", "ratio"):
                margins[(nodeid, m["name"])] = policy.margin(m["kind"], m.get("tolerance"))
                units[(nodeid, m["name"])] = m["unit"]
    return margins, units


def paired_rows(out: _against.AgainstOutcome, policy: Policy) -> list[MetricResult]:
    """The interleaved verdicts as the gate's :class:`perf.gate.verdict.MetricResult` rows."""
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
        finite = r.pairs and r.lower > 0 and r.upper < float("inf")
        ci = (r.lower, r.upper) if finite else None
        ratio = r.median_ratio if r.pairs else None
        verdict = Verdict(r.verdict)
        timed = TimedVerdict(
            verdict,
            r.reason,
            ratio,
            ci[0] if ci else None,
            ci[1] if ci else None,
            r.margin,
            detail=reason,
        )
        rows.append(
            MetricResult(
                r.nodeid,
                r.name,
                r.unit,
                "time" if r.unit == "s" else "ratio",
                verdict.value,
                old=base_locs[len(base_locs) // 2] if base_locs else None,
                new=head_locs[len(head_locs) // 2] if head_locs else None,
                ratio=ratio,
                ci=ci,
                margin=r.margin,
                reason=reason,
                pairs=tuple(p.ratio for p in r.pairs),
                skewed_pairs=len(r.skewed),
                timed=timed,
                interleaved_ci=ci,
            )
        )
    return rows


def gate_result(
    req: AgainstRequest,
    out: _against.AgainstOutcome,
    results: dict[str, dict[str, Any]],
    policy: Policy,
) -> GateResult:
    """One :class:`perf.gate.verdict.GateResult`: counts and bytes against the base side's
    run, times and ratios from the interleaved pairs."""
    from perf.gate import compare as _gate
    from perf.store.runs import make_run

    timed = {(r.nodeid, r.name) for r in out.results}
    rows: list[MetricResult] = []
    if out.base_run is not None:
        current = make_run(results, name="head", fingerprint=out.base_run.fingerprint, commit={})
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
    return GateResult(
        f"{req.ref} ({req.commit[:12]}) code", "this tree", tuple(rows), None, tuple(notes)
    )


def needs_recheck(r: MetricResult) -> bool:
    """A stored-gate timing verdict worth settling against the baseline's code: a suspected
    regression, an undecided one, or one not compared because the machine differs (by its
    reason code, never its text)."""
    return r.kind in ("time", "ratio") and (
        r.status in ("regression", "undecided")
        or (
            r.status == "refused"
            and r.timed is not None
            and r.timed.reason is Reason.NOT_COMPARABLE
        )
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
    margin = policy.margin(r.kind, r.margin)
    return slower if slower > 1.0 + margin else None


#: Environment variables that plausibly change how fast an uncompiled CPU or CUDA step runs
#: (thread pools, affinity, allocators, preloaded libraries). Others (``TORCHINDUCTOR_*``,
#: ``TORCH_LOGS``, ...) are listed as differing, never named as the cause on their own.
PLAUSIBLE_ENV = (
    "OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOMP_", "VECLIB_", "NUMEXPR_", "LD_PRELOAD",
    "LD_LIBRARY_PATH", "MALLOC_", "PYTHONMALLOC", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING",
    "CUBLAS_", "CUDNN_", "DNNL_", "ONEDNN_", "PYTORCH_CUDA_ALLOC_CONF",
)  # fmt: skip


def plausible(diff: str) -> bool:
    """Whether one :func:`perf.store.environment.differences` item plausibly changes a
    step's speed: a package or machine change, or a thread / allocator variable."""
    kind, _, rest = diff.partition(" ")
    if kind in ("package", "machine"):
        return True
    return kind == "env" and rest.startswith(PLAUSIBLE_ENV)


def _reference_factor(baseline: Any, current: Any) -> float | None:
    """The reference workload's factor now / then; None where either run lacks it."""
    from perf.gate.reference import reference_factor

    try:
        return reference_factor(current, baseline)
    except (AttributeError, TypeError):
        return None


def machine_evidence(baseline: Any, current: Any, policy: Policy) -> list[str]:
    """What says the *machine's state* differed between the two runs: the reference
    workload beyond its band, other processes' CPU share beyond ``busy_cpu_fraction``."""
    from perf.gate.kinds import busy_reason

    out = []
    factor = _reference_factor(baseline, current)
    band = 1 + policy.reference_band
    if factor is not None and not 1 / band <= factor <= band:
        out.append(f"the reference workload ran x{factor:.2f} as long as in the baseline")
    for run, when in ((current, "now"), (baseline, "when the baseline was saved")):
        try:
            busy = busy_reason(run, policy, when)
        except (AttributeError, TypeError):
            busy = None
        if busy:
            out.append(busy)
    return out


def evidence_text(baseline: Any, current: Any) -> str:
    """The machine-state figures behind a code-or-environment verdict, whatever they say:
    the reference workload's factor and other processes' CPU share in each run."""
    parts = []
    factor = _reference_factor(baseline, current)
    parts.append("reference workload " + (f"x{factor:.2f}" if factor else "not measured"))
    for run, when in ((current, "now"), (baseline, "then")):
        share = (getattr(run, "cpu", None) or {}).get("others_fraction")
        parts.append(
            f"other processes {share:.0%} of the CPUs {when}"
            if share is not None
            else f"CPU share unknown {when}"
        )
    return "evidence: " + ", ".join(parts)


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
    *machine's or environment's*, never the code's, reported with the evidence (reference
    workload, CPU-contention probe, the packages and variables that differ and which of them
    plausibly matter). A variable is named as the likely cause only when the machine looked
    the same in both runs and it plausibly matters; only then may
    ``policy.environment_change = fail`` fail it. Otherwise it is undecided (``ENVIRONMENT``).
    The row keeps the stored ratio with the stored interval, and the interleaved interval
    beside it (``1.423x [0.936, 0.999]`` was once printed, one beside the other)."""
    from dataclasses import replace

    from perf.store.environment import differences

    slower = _stored_slower(stored, policy)
    code_same = interleaved.status in ("unchanged", "improvement")
    if interleaved.status == "undecided" and stored.ratio is not None:
        # neither measurement decided: show both intervals, the stored one beside its ratio
        return replace(
            stored,
            status="undecided",
            reason=f"{stored.reason}; interleaved against the baseline's commit: "
            f"{interleaved.reason}",
            interleaved_ci=interleaved.ci,
            pairs=interleaved.pairs,
            skewed_pairs=interleaved.skewed_pairs,
            timed=interleaved.timed,
            recheck=False,
        )
    if slower is None or not code_same:
        return replace(interleaved, noisy=stored.noisy) if stored.noisy else interleaved
    diffs = differences(
        getattr(baseline, "environment", None),
        getattr(current, "environment", None),
        getattr(baseline, "fingerprint", None),
        getattr(current, "fingerprint", None),
    )
    machine = machine_evidence(baseline, current, policy)
    likely = [d for d in diffs if plausible(d)]
    head = (
        f"x{slower:.2f} slower than the stored baseline, but this code is not slower than "
        f"the baseline's commit's in this environment ({interleaved.reason})"
    )
    status: Status = "undecided"
    if machine:
        reason = f"MACHINE changed: {'; '.join(machine)}: the machine's state is the likely cause"
        if diffs:
            reason += f" (also differs: {'; '.join(diffs)})"
        reason += f". {head}; not failed"
    elif likely:
        fail = policy.environment_change == "fail"
        others = [d for d in diffs if d not in likely]
        reason = f"ENVIRONMENT changed: {'; '.join(likely)}" + (
            f" (also differs, unlikely to matter: {'; '.join(others)})" if others else ""
        )
        reason += f". {head}" + ("" if fail else "; not failed (perf_environment_change = warn)")
        status = "regression" if fail else "undecided"
    else:
        what = (
            f"only {'; '.join(diffs)} differs, which is not known to change a step's speed"
            if diffs
            else "nothing perf records differs (packages, environment variables, machine)"
        )
        reason = f"{head}; {what}: the machine's state is the likely cause; not failed"
    reason += f" ({evidence_text(baseline, current)})"
    timed = TimedVerdict(
        Verdict(status),
        Reason.ENVIRONMENT,
        stored.ratio,
        stored.ci[0] if stored.ci else None,
        stored.ci[1] if stored.ci else None,
        policy.margin(stored.kind, stored.margin),
        stored.higher_is_better,
        reason,
    )
    return replace(
        interleaved,
        status=status,
        reason=reason,
        old=stored.old,
        new=stored.new,
        ratio=stored.ratio,
        ci=stored.ci,
        higher_is_better=stored.higher_is_better,
        interleaved_ci=interleaved.ci,
        timed=timed,
        noisy=stored.noisy,
    )
