"""One comparison per metric kind (count, bytes, time / ratio) and the guards that decide
whether two runs' timings may be compared at all. Pure: no clocks, no I/O."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from perf.core.devices import TIMING_KEYS
from perf.core.verdicts import Reason, TimedVerdict, Verdict, classify
from perf.gate.verdict import MetricResult, Policy, Status
from perf.store.runs import Run


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


def _margin(new_m: Mapping[str, Any], old_m: Mapping[str, Any], policy: Policy) -> float:
    """The metric's own margin (this run's, else the baseline's), else the policy's."""
    tol = new_m.get("tolerance", old_m.get("tolerance"))
    return policy.margin(str(new_m["kind"]), None if tol is None else float(tol))


def _exact(v: Any) -> int:
    """A stored count as an int (schema <= 2 wrote them as floats)."""
    return v if isinstance(v, int) else int(v)


def sync_site_changes(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    limit: int = 8,
    key: str = "sync_sites",
    *,
    fewer: bool = False,
) -> str:
    """The call sites that are new or more frequent in ``new`` than in ``old`` (their metric
    extra data ``sync_sites``, from ``perf.count_syncs``; or ``sites``, any count or bytes
    metric's sites, e.g. leaked bytes per allocating line from ``perf.memory_growth``, graph
    breaks and recompiles from ``perf.count_compiles``), e.g.
    ``train.py:88 in train_step `loss.item()` +20 (new)``; empty when there is no site data.
    A site's optional ``"what"`` follows its code (``... `if x.sum() > 0:` graph break
    (Data-dependent branching) +1 (new)``). ``fewer=True``: the sites gone or less frequent
    (``-1 (gone)``), for an improvement."""
    new_sites = (new.get("extra") or {}).get(key)
    if not isinstance(new_sites, dict):
        return ""
    old_sites = (old.get("extra") or {}).get(key)
    if not isinstance(old_sites, dict):
        what = "sync sites" if key == "sync_sites" else "sites"
        return "" if fewer else f"the baseline has no {what} to compare with"
    if fewer:
        old_sites, new_sites = new_sites, old_sites

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
            fn, code, event = info.get("function"), info.get("code"), info.get("what")
            text = site + (f" in {fn}" if fn else "") + (f" `{code}`" if code else "")
            text += f" {event}" if event else ""
            sign, first = ("-", " (gone)") if fewer else ("+", " (new)")
            grown.append((-delta, site, f"{text} {sign}{delta}" + ("" if before else first)))
    grown.sort()
    more = f"; and {len(grown) - limit} more" if len(grown) > limit else ""
    return "; ".join(g[2] for g in grown[:limit]) + more


def _site_text(
    old: Mapping[str, Any], new: Mapping[str, Any], status: Status, keys: tuple[str, ...]
) -> str:
    """``"sync sites: ...; sites: ..."`` behind a regression, ``"fewer sites: ..."`` behind an
    improvement (a removed graph break, a sync gone); empty otherwise."""
    if status not in ("regression", "improvement"):
        return ""
    fewer = status == "improvement"
    parts = []
    for key in keys:
        text = sync_site_changes(old, new, key=key, fewer=fewer)
        if text:
            words = "sync sites" if key == "sync_sites" else "sites"
            parts.append(f"{'fewer ' if fewer else ''}{words}: {text}")
    return "; ".join(parts)


def compare_count(nodeid: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> MetricResult:
    o, n = _exact(old["value"]), _exact(new["value"])  # exact above 2**53 too
    status: Status = "regression" if n > o else "improvement" if n < o else "unchanged"
    ratio = n / o if o else (math.inf if n else 1.0)
    sites = _site_text(old, new, status, ("sync_sites", "sites"))
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
        reason="counts are exact" + (f"; {sites}" if sites else ""),
        sites=sites,
    )


def compare_bytes(
    nodeid: str, old: Mapping[str, Any], new: Mapping[str, Any], policy: Policy
) -> MetricResult:
    o, n = float(old["value"]), float(new["value"])
    m = _margin(new, old, policy)
    if o == 0:
        ratio = math.inf if n > 0 else 1.0
        status: Status = "regression" if n > 0 else "unchanged"
    else:
        ratio = n / o
        status = "regression" if ratio > 1 + m else "improvement" if ratio < 1 - m else "unchanged"
    sites = _site_text(old, new, status, ("sites",))
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
        reason=sites,
        sites=sites,
    )


def compare_compile(
    nodeid: str, old: Mapping[str, Any], new: Mapping[str, Any], policy: Policy
) -> MetricResult:
    """Compile time: one value per run, compared only when Inductor's cache was in the same
    state in both runs (a warm cache compiles ~10x faster: seen as a 10x "jump"); a change
    beyond ``compile_tolerance`` is a regression / improvement. Never re-measured."""
    o, n = float(old["value"]), float(new["value"])
    c_old = (old.get("extra") or {}).get("cache", "none")
    c_new = (new.get("extra") or {}).get("cache", "none")
    base = MetricResult(nodeid, new["name"], new["unit"], "compile", "refused", o, n)
    if c_old != c_new:
        return replace(
            base,
            reason=f"compile times not compared: Inductor cache {c_old} in the baseline, "
            f"{c_new} now",
        )
    m = _margin(new, old, policy)
    ratio = n / o if o else (math.inf if n else 1.0)
    status: Status = (
        "regression" if ratio > 1 + m else "improvement" if ratio < 1 / (1 + m) else "unchanged"
    )
    return replace(base, status=status, ratio=ratio, margin=m, reason=f"cache {c_new} both runs")


def compare_timed(
    nodeid: str,
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    policy: Policy,
    ref_factor: float | None,
    busy_now: str | None = None,
    busy_then: str | None = None,
) -> MetricResult:
    """One of the four verdicts (:mod:`perf.core.verdicts`) on a time or ratio metric.

    ``unchanged`` needs the interval inside the margin both ways, raw *and* divided by the
    reference factor; an interval that leaves the margin without clearing it is
    ``undecided`` (reason ``STRADDLES``), never "unchanged". A regression or
    improvement seen on a busy machine is undecided too (``MACHINE_BUSY`` /
    ``REFERENCE_MOVED``): the settling step measures it again."""
    kind = new["kind"]
    hib = bool(new.get("higher_is_better", False)) and kind == "ratio"
    m = _margin(new, old, policy)
    o, n = float(old["value"]), float(new["value"])
    so, sn = old.get("samples") or [], new.get("samples") or []
    noisy = str(old.get("noisy") or "")
    base = MetricResult(
        nodeid,
        new["name"],
        new["unit"],
        kind,
        "undecided",
        o,
        n,
        n / o if o else None,
        margin=m,
        higher_is_better=hib,
        noisy=noisy,
    )

    def undecided(reason: Reason, why: str) -> MetricResult:
        tv = TimedVerdict(Verdict.UNDECIDED, reason, base.ratio, None, None, m, hib, why)
        return replace(base, reason=why + _noisy_text(noisy), timed=tv)

    if len(so) < policy.min_samples or len(sn) < policy.min_samples:
        return undecided(
            Reason.NO_INTERVAL,
            f"fewer than {policy.min_samples} raw samples on a side: no interval",
        )
    q = policy.time_quantile if kind == "time" else 0.5
    if min(so) <= 0 or min(sn) <= 0:
        return undecided(Reason.NO_INTERVAL, "non-positive samples: no interval")
    raw, (lo, hi) = ratio_ci(
        sn, so, q=q, confidence=policy.confidence, n_resamples=policy.n_resamples, seed=policy.seed
    )
    factor = ref_factor if kind == "time" else None
    f = factor if factor is not None else 1.0
    nlo, nhi = lo / f, hi / f
    v_raw = classify(lo, hi, m, higher_is_better=hib)
    v_norm = classify(nlo, nhi, m, higher_is_better=hib)
    verdict = v_raw if v_raw == v_norm else Verdict.UNDECIDED
    why = Reason.INTERVAL if verdict is not Verdict.UNDECIDED else Reason.STRADDLES
    reason = f"q{int(q * 100)} ratio {raw:.3f} [{lo:.3f}, {hi:.3f}]"
    if kind == "time" and abs(n - o) < policy.min_abs_effect_s:
        verdict, why = Verdict.UNCHANGED, Reason.INTERVAL
        reason += f"; within {policy.min_abs_effect_s:g} s (clock resolution)"
    recheck = False
    if kind == "time" and factor is not None:
        reason += f"; reference x{factor:.3f}, normalised {raw / f:.3f} [{nlo:.3f}, {nhi:.3f}]"
    if verdict is Verdict.UNDECIDED:
        reason = f"the interval leaves the {m:.0%} margin without clearing it: {reason}"
    moved = {v_raw, v_norm} & {Verdict.REGRESSION, Verdict.IMPROVEMENT}
    if kind == "time" and moved and verdict is not Verdict.UNCHANGED:
        band = 1 + policy.reference_band
        off = factor is not None and not 1 / band <= factor <= band
        busy: str | None = None
        if busy_then:
            busy, why = busy_then, Reason.MACHINE_BUSY
        elif busy_now:
            busy, why = busy_now, Reason.MACHINE_BUSY
            recheck = verdict is Verdict.REGRESSION
        elif off:
            when = "now" if f > 1 else "when the baseline was saved"
            busy = (
                f"machine busy {when}: the reference workload ran x{f:.2f} as long "
                f"as in the baseline (outside x{1 / band:.2f}..x{band:.2f})"
            )
            why = Reason.REFERENCE_MOVED
            recheck = verdict is Verdict.REGRESSION
        if busy:
            reason = f"{busy}, so this change is not trusted; {reason}"
            verdict = Verdict.UNDECIDED
    tv = TimedVerdict(verdict, why, raw, lo, hi, m, hib, reason)
    return replace(
        base,
        status=verdict.value,
        ratio=raw,
        ci=(lo, hi),
        reason=reason + _noisy_text(noisy),
        recheck=recheck,
        timed=tv,
    )


def _noisy_text(noisy: str) -> str:
    return f"; the baseline is flagged noisy ({noisy})" if noisy else ""


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


def unpaired(
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
