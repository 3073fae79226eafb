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
     workload at session start and end (:func:`reference_samples`), always on
     :data:`REFERENCE_THREADS` intra-op threads whatever the session's thread state (a test
     module calling ``torch.set_num_threads(1)`` made it 1.3x "slower" and every verdict
     inconclusive; runs whose references used other or unknown thread counts are not
     normalised against each other). A machine that is
     uniformly slower today slows the reference too, so a regression must show raw *and*
     divided by the reference's factor (quickest bracket now / quickest then). A factor
     outside ``1 +- reference_band`` (25%) means the machine is not in the state it was in:
     time verdicts are then ``inconclusive``, reported loudly, never failed.
  2. *Busy-machine check.* Other processes' share of the CPUs during each run
     (:mod:`perf.core.contention`, from ``/proc/stat``) above ``busy_cpu_fraction`` (10%) makes
     time verdicts ``inconclusive`` too (measured on a shared 2-core box: a neighbour slowed
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from perf.core.devices import TIMING_KEYS
from perf.store.baseline import Run

Status = Literal[
    "regression", "improvement", "unchanged", "inconclusive", "new", "missing", "refused"
]


@dataclass(frozen=True)
class Policy:
    """Default margins per kind and the statistics settings of the gate."""

    #: 10%: a suspect must clear it in this run *and* in every fresh-process re-measurement
    #: (:mod:`perf.gate.remeasure`); see README, "Gating PRs", for what it achieves.
    time_tolerance: float = 0.10
    ratio_tolerance: float = 0.10
    bytes_tolerance: float = 0.02
    confidence: float = 0.95
    #: Quantile of the raw time samples used as each run's location (see module docstring).
    time_quantile: float = 0.25
    #: Reference brackets further than this from the baseline's (relative) mark the machine
    #: as busy and time verdicts as inconclusive. Measured on a quiet 2-core VM: the
    #: reference itself drifts by up to ~20% between brackets, so 25%.
    reference_band: float = 0.25
    #: Other processes (and other guests, via steal time) using more than this share of the
    #: machine's CPUs during a run mark its times as taken on a busy machine
    #: (:mod:`perf.core.contention`). Measured on the 2-core dev VM: ~1-3% when quiet, ~50% with
    #: one CPU-bound neighbour.
    busy_cpu_fraction: float = 0.10
    #: Ignore time differences below this many seconds per call (clock resolution).
    min_abs_effect_s: float = 0.0
    #: Fewer samples than this per side: the timing is compared by value only, never failed.
    min_samples: int = 5
    n_resamples: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "time_tolerance",
            "ratio_tolerance",
            "bytes_tolerance",
            "reference_band",
            "busy_cpu_fraction",
        ):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 10.0):
                raise ValueError(f"{name} must be a relative margin in [0, 10], got {v!r}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if not 0.0 <= self.time_quantile <= 1.0:
            raise ValueError(f"time_quantile must be in [0, 1], got {self.time_quantile}")


@dataclass(frozen=True)
class MetricResult:
    """The verdict on one metric of one test."""

    nodeid: str
    name: str
    unit: str
    kind: str
    status: Status
    #: Values as stored: counts are exact ints, other kinds floats.
    old: float | int | None = None
    new: float | int | None = None
    #: new/old of the gate's statistic (after normalisation for times), None where undefined.
    ratio: float | None = None
    ci: tuple[float, float] | None = None
    margin: float | None = None
    higher_is_better: bool = False
    reason: str = ""
    #: Ratio of the re-measurement of a suspect (None: not re-measured).
    remeasured_ratio: float | None = None
    #: Inconclusive only because of the machine *now* (busy, reference off): a fresh
    #: re-measurement may still settle it.
    recheck: bool = False
    #: Fresh-process re-measurements that confirmed this regression.
    confirmations: int = 0
    #: head/base ratio of each interleaved pair behind this verdict, in the order run
    #: (:mod:`perf.gate.against`); empty for a verdict on two stored runs.
    pairs: tuple[float, ...] = ()
    #: Interleaved pairs set aside because the machine's load changed between their children.
    skewed_pairs: int = 0

    @property
    def explanation(self) -> str:
        """``reason`` with what the data fields add, for people (reports, terminal)."""
        if not self.confirmations:
            return self.reason
        n = self.confirmations
        tail = "confirmed by re-measurement" if n == 1 else f"confirmed by {n} re-measurements"
        return f"{self.reason}; {tail}" if self.reason else tail


@dataclass(frozen=True)
class GateResult:
    """All verdicts of one comparison; ``failed`` decides the exit status."""

    baseline: str
    current: str
    results: tuple[MetricResult, ...]
    timing_refused: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def by_status(self, status: Status) -> list[MetricResult]:
        return [r for r in self.results if r.status == status]

    @property
    def regressions(self) -> list[MetricResult]:
        return self.by_status("regression")

    @property
    def improvements(self) -> list[MetricResult]:
        return self.by_status("improvement")

    @property
    def unchanged(self) -> list[MetricResult]:
        return self.by_status("unchanged")

    @property
    def failed(self) -> bool:
        return bool(self.regressions)


# -- statistics ----------------------------------------------------------------------------


def _quantile(xs: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs, dtype=float), q))


def _thin(x: np.ndarray, k: int = 1000) -> np.ndarray:
    """At most ``k`` evenly spaced samples: bounds the bootstrap's memory (k x resamples)."""
    if len(x) <= k:
        return x
    return x[np.linspace(0, len(x) - 1, k).astype(int)]


def ratio_ci(
    new: Sequence[float],
    old: Sequence[float],
    *,
    q: float,
    confidence: float,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, tuple[float, float]]:
    """quantile_q(new) / quantile_q(old) and its percentile-bootstrap interval (fixed seed).

    The runs are unpaired, so each side is resampled on its own. Deterministic given inputs.
    """
    a = _thin(np.asarray(new, dtype=float))
    b = _thin(np.asarray(old, dtype=float))
    point = float(np.quantile(a, q) / np.quantile(b, q))
    rng = np.random.default_rng(seed)
    qa = np.quantile(a[rng.integers(0, len(a), (n_resamples, len(a)))], q, axis=1)
    qb = np.quantile(b[rng.integers(0, len(b), (n_resamples, len(b)))], q, axis=1)
    r = qa / qb
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(r, [alpha, 1.0 - alpha])
    return point, (float(lo), float(hi))


def reference_factor(new: Run, old: Run, q: float = 0.25) -> float | None:
    """How much longer the reference workload took now than in the baseline.

    The factor compares the *quickest* bracket of each run (session start, end; or a
    re-measuring child's), i.e. the machine at its best then and now. Measured on the 2-core
    dev VM with nothing else running in it: one 0.15 s bracket of a 5 s session ran 39% slower
    than the other (host-level interference the guest cannot see; steal time ~0), so any
    single bracket is a poor picture of the machine, while a machine that is uniformly slower
    today is slower in every bracket. None when either run has no reference samples.
    """
    old_locs = [_quantile(v, q) for v in old.reference.values() if len(v) >= 3]
    new_locs = [_quantile(v, q) for v in new.reference.values() if len(v) >= 3]
    if not old_locs or not new_locs or min(old_locs) <= 0:
        return None
    if reference_mismatch(new, old) is not None:
        return None
    return min(new_locs) / min(old_locs)


def reference_mismatch(new: Run, old: Run) -> str | None:
    """Why the two runs' reference timings cannot be divided (None: they can).

    The reference's speed depends on its thread count; runs stored before it was pinned
    (schema_version <= 2) do not say which count they used.
    """
    if not new.reference or not old.reference:
        return None
    a, b = old.reference_threads, new.reference_threads
    if a is None or b is None:
        return (
            "reference workload not comparable: its thread count is unknown for "
            + ("the baseline" if a is None else "this run")
            + " (stored before it was pinned); times are judged raw"
        )
    if a != b:
        return (
            f"reference workload not comparable: {a} threads in the baseline, {b} now; "
            "times are judged raw"
        )
    return None


# -- comparison ----------------------------------------------------------------------------


def _margin(new_m: Mapping[str, Any], old_m: Mapping[str, Any], default: float) -> float:
    tol = new_m.get("tolerance", old_m.get("tolerance"))
    return float(tol) if tol is not None else default


def _exact(v: Any) -> int:
    """A stored count as an int (schema <= 2 wrote them as floats)."""
    return v if isinstance(v, int) else int(v)


def sync_site_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 8, key: str = "sync_sites"
) -> str:
    """The call sites that are new or more frequent in ``new`` than in ``old`` (their metric
    extra data ``sync_sites``, from ``perf.count_syncs``; or ``sites``, any count or bytes
    metric's sites, e.g. leaked bytes per allocating line from ``perf.memory_growth``), e.g.
    ``train.py:88 in train_step `loss.item()` +20 (new)``; empty when there is no site data."""
    new_sites = (new.get("extra") or {}).get(key)
    if not isinstance(new_sites, dict):
        return ""
    old_sites = (old.get("extra") or {}).get(key)
    if not isinstance(old_sites, dict):
        what = "sync sites" if key == "sync_sites" else "sites"
        return f"the baseline has no {what} to compare with"

    def count(info: Any) -> int:  # stored data: anything but {"n": int} counts as 0
        n = info.get("n", 0) if isinstance(info, dict) else 0
        return n if isinstance(n, int) else 0

    grown = []
    for site, info in new_sites.items():
        before = count(old_sites.get(site))
        delta = count(info) - before
        if not isinstance(info, dict):
            continue
        if delta > 0:
            fn, code = info.get("function"), info.get("code")
            text = site + (f" in {fn}" if fn else "") + (f" `{code}`" if code else "")
            grown.append((-delta, site, f"{text} +{delta}" + ("" if before else " (new)")))
    grown.sort()
    more = f"; and {len(grown) - limit} more" if len(grown) > limit else ""
    return "; ".join(g[2] for g in grown[:limit]) + more


def _compare_count(nodeid: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> MetricResult:
    o, n = _exact(old["value"]), _exact(new["value"])  # exact above 2**53 too
    status: Status = "regression" if n > o else "improvement" if n < o else "unchanged"
    ratio = n / o if o else (math.inf if n else 1.0)
    sites = sync_site_changes(old, new) if status == "regression" else ""
    other = sync_site_changes(old, new, key="sites") if status == "regression" else ""
    if other:
        sites = f"{sites}; {other}" if sites else other
    return MetricResult(
        nodeid,
        new["name"],
        new["unit"],
        "count",
        status,
        o,
        n,
        ratio,
        margin=0.0,
        reason="counts are exact" + (f"; sync sites: {sites}" if sites else ""),
    )


def _compare_bytes(
    nodeid: str, old: Mapping[str, Any], new: Mapping[str, Any], policy: Policy
) -> MetricResult:
    o, n = float(old["value"]), float(new["value"])
    m = _margin(new, old, policy.bytes_tolerance)
    if o == 0:
        ratio = math.inf if n > 0 else 1.0
        status: Status = "regression" if n > 0 else "unchanged"
    else:
        ratio = n / o
        status = "regression" if ratio > 1 + m else "improvement" if ratio < 1 - m else "unchanged"
    sites = sync_site_changes(old, new, key="sites") if status == "regression" else ""
    return MetricResult(
        nodeid,
        new["name"],
        new["unit"],
        "bytes",
        status,
        o,
        n,
        ratio,
        margin=m,
        reason=f"sites: {sites}" if sites else "",
    )


def _compare_timed(
    nodeid: str,
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    policy: Policy,
    ref_factor: float | None,
    busy_now: str | None = None,
    busy_then: str | None = None,
) -> MetricResult:
    kind = new["kind"]
    hib = bool(new.get("higher_is_better", False)) and kind == "ratio"
    default = policy.time_tolerance if kind == "time" else policy.ratio_tolerance
    m = _margin(new, old, default)
    o, n = float(old["value"]), float(new["value"])
    so, sn = old.get("samples") or [], new.get("samples") or []
    base = MetricResult(
        nodeid,
        new["name"],
        new["unit"],
        kind,
        "unchanged",
        o,
        n,
        n / o if o else None,
        margin=m,
        higher_is_better=hib,
    )
    if len(so) < policy.min_samples or len(sn) < policy.min_samples:
        return replace(
            base, reason=f"fewer than {policy.min_samples} raw samples on a side: shown, not gated"
        )
    q = policy.time_quantile if kind == "time" else 0.5
    if min(so) <= 0 or min(sn) <= 0:
        return replace(base, reason="non-positive samples: shown, not gated")
    raw, (lo, hi) = ratio_ci(
        sn, so, q=q, confidence=policy.confidence, n_resamples=policy.n_resamples, seed=policy.seed
    )
    factor = ref_factor if kind == "time" else None
    f = factor if factor is not None else 1.0
    nlo, nhi = lo / f, hi / f
    # Judged in "lower is better" terms; a verdict must hold raw *and* normalised.
    if hib:
        flags = [1 / hi > 1 + m, 1 / nhi > 1 + m, 1 / lo < 1 / (1 + m), 1 / nlo < 1 / (1 + m)]
    else:
        flags = [lo > 1 + m, nlo > 1 + m, hi < 1 / (1 + m), nhi < 1 / (1 + m)]
    if kind == "time" and abs(n - o) < policy.min_abs_effect_s:
        flags = [False] * 4
    raw_worse, norm_worse, raw_better, norm_better = flags
    status: Status = (
        "regression"
        if raw_worse and norm_worse
        else "improvement"
        if raw_better and norm_better
        else "unchanged"
    )
    reason = f"q{int(q * 100)} ratio {raw:.3f} [{lo:.3f}, {hi:.3f}]"
    recheck = False
    if kind == "time" and factor is not None:
        reason += f"; reference x{factor:.3f}, normalised {raw / f:.3f} [{nlo:.3f}, {nhi:.3f}]"
    if kind == "time" and any(flags):
        band = 1 + policy.reference_band
        off = factor is not None and not 1 / band <= factor <= band
        why = None
        if busy_then:
            why = busy_then
        elif busy_now:
            why, recheck = busy_now, status == "regression"
        elif off:
            when = "now" if f > 1 else "when the baseline was saved"
            why = (
                f"machine busy {when}: the reference workload ran x{f:.2f} as long "
                f"as in the baseline (outside x{1 / band:.2f}..x{band:.2f})"
            )
            recheck = status == "regression"
        if why:
            reason = f"{why}, so this change is not trusted; {reason}"
            status = "inconclusive"
    return replace(base, status=status, ratio=raw, ci=(lo, hi), reason=reason, recheck=recheck)


def busy_reason(run: Run, policy: Policy, when: str) -> str | None:
    """Why ``run``'s times were taken on a busy machine (None: quiet, or unknown)."""
    share = (run.cpu or {}).get("others_fraction")
    if share is None or share <= policy.busy_cpu_fraction:
        return None
    return (
        f"machine busy {when}: other processes used {share:.0%} of the CPUs during the run "
        f"(more than {policy.busy_cpu_fraction:.0%})"
    )


def timing_refusal(baseline: Run, current: Run, keys: Iterable[str] = TIMING_KEYS) -> str | None:
    """Why timings of these two runs cannot be compared (None: they can)."""
    diff = {
        k: (baseline.fingerprint.get(k), current.fingerprint.get(k))
        for k in keys
        if baseline.fingerprint.get(k) != current.fingerprint.get(k)
    }
    if diff:
        fields = "; ".join(
            f"{k}: {_short(a)} (baseline) vs {_short(b)} (now)" for k, (a, b) in diff.items()
        )
        return f"machine fingerprint differs in {', '.join(diff)} ({fields})"
    par = [
        f"{label} ran under xdist with {r.workers} workers"
        for label, r in (("the baseline", baseline), ("this run", current))
        if r.workers > 1
    ]
    if par:
        return (
            " and ".join(par) + "; parallel workers share the cores, so their timings "
            "are not comparable (run timing tests serially, e.g. -p no:xdist)"
        )
    return None


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _unpaired(
    nodeid: str, name: str, m: Mapping[str, Any], current: Run, *, new_run: bool
) -> MetricResult:
    """A metric present in only one of the two runs: listed ("new" / "missing"), never failed."""
    if new_run:
        return MetricResult(
            nodeid,
            name,
            m["unit"],
            m["kind"],
            "new",
            new=float(m["value"]),
            reason="not in the baseline",
        )
    outcome = current.tests.get(nodeid, {}).get("outcome")
    why = (
        f"test {outcome} in this run"
        if outcome and outcome != "passed"
        else "not recorded in this run"
    )
    return MetricResult(
        nodeid, name, m["unit"], m["kind"], "missing", old=float(m["value"]), reason=why
    )


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
                out.append(_unpaired(nodeid, name, ref, current, new_run=om is None))
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
                out.append(_compare_count(nodeid, om, nm))
            elif kind == "bytes":
                out.append(_compare_bytes(nodeid, om, nm, policy))
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
                    )
                )
            else:
                out.append(_compare_timed(nodeid, om, nm, policy, factor, busy_now, busy_then))
    notes: list[str] = []
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
            f"reference workload's time moved beyond x{1 / band:.2f}..x{band:.2f}, so it is "
            "not used to normalise, and time verdicts that would change are inconclusive"
        )
    return GateResult(baseline.label, current.label, tuple(out), refused, tuple(notes))


def _is_suspect(r: MetricResult) -> bool:
    return r.kind in ("time", "ratio") and (
        r.status == "regression" or (r.status == "inconclusive" and r.recheck)
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
    machine) becomes or stays ``inconclusive``, re-checkable by a further re-measurement; a
    missing re-measurement keeps the first verdict. Applied once per re-measurement, a
    regression survives only if every re-measurement that could judge it confirms it.
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
        if s.status == "inconclusive":
            out.append(
                replace(
                    r,
                    status="inconclusive",
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


# -- the reference workload ----------------------------------------------------------------


#: Intra-op threads the reference workload always runs with. One: independent of the core
#: count, of OMP_NUM_THREADS, of xdist core sharing and of tests that change the session's
#: threads, and no OpenMP barrier waiting for a preempted thread on a busy box.
REFERENCE_THREADS = 1


def reference_samples(min_run_time_s: float = 0.15) -> list[float]:
    """Time a small fixed torch training step (seconds per call); used to normalise times.

    A 64x256 linear layer forward + backward exercises what perf tests usually spend time on
    (dispatcher, autograd, a BLAS call), so a machine or a neighbour that slows those down
    slows this too. It runs on :data:`REFERENCE_THREADS` threads and restores the session's
    count afterwards, so the session's thread state neither changes it nor is changed by it.
    Imports torch lazily.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(REFERENCE_THREADS)
    try:
        return _reference_step_samples(min_run_time_s)
    finally:
        torch.set_num_threads(before)


def _reference_step_samples(min_run_time_s: float) -> list[float]:
    import torch

    from perf.instruments.timing import measure

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g)
    w = torch.randn(256, 256, generator=g, requires_grad=True)

    def step() -> None:
        (x @ w).relu().sum().backward()
        w.grad = None

    t = measure(
        step,
        warmup=5,
        min_sample_time_s=0.005,
        min_samples=15,
        min_run_time_s=min_run_time_s,
        label="perf-reference",
    )
    return list(t.samples_s)
