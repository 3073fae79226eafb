"""Whether a stored time can anchor a verdict: a baseline whose samples are too
dispersed to decide a change of the margin is re-measured before it is saved, and stored
flagged ``noisy`` with the reason if it stays dispersed. Pure functions, no I/O.

The rule: the 95% percentile-bootstrap interval of the metric's own location (the gate's
25th percentile, :attr:`perf.gate.verdict.Policy.time_quantile`) is wider than the margin
(``high / low - 1 > margin``). Such a baseline cannot anchor ``unchanged`` (the ratio's
interval is at least that wide, and the band inside the margin is ``2 x margin`` wide) and
lets a large slowdown straddle the margin. Seen on a loaded 2-core box: 7 samples, four at
2.1 ms and three at 11.6-14.0 ms (a bimodal split): q25's interval 2.1-11.6 ms, x5.5 wide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: A sample slower than this factor of the run's 25th percentile is counted in the slow mode
#: the reason names (information for people; the rule is the interval's width).
SLOW_MODE_FACTOR = 1.5


def dispersion(
    samples: Sequence[float],
    margin: float,
    *,
    q: float = 0.25,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    min_samples: int = 5,
) -> str | None:
    """Why ``samples`` are too dispersed to decide a change of ``margin`` (None: they are
    not, or there are too few to bootstrap: the gate says "no interval" for those)."""
    x = np.asarray([float(s) for s in samples], dtype=float)
    if len(x) < min_samples or float(x.min()) <= 0:
        return None
    x = x[np.linspace(0, len(x) - 1, min(len(x), 1000)).astype(int)]
    rng = np.random.default_rng(seed)
    qs = np.quantile(x[rng.integers(0, len(x), (n_resamples, len(x)))], q, axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = (float(v) for v in np.quantile(qs, [alpha, 1.0 - alpha]))
    width = hi / lo - 1.0
    if width <= margin:
        return None
    loc = float(np.quantile(x, q))
    slow = int((x > SLOW_MODE_FACTOR * loc).sum())
    split = (
        f"; {slow} of {len(x)} samples above x{SLOW_MODE_FACTOR:g} its q{int(q * 100)} "
        f"(up to x{float(x.max()) / loc:.1f})"
        if slow
        else ""
    )
    return (
        f"the {confidence:.0%} bootstrap interval of its q{int(q * 100)} is "
        f"{_s(lo)}-{_s(hi)} (x{1 + width:.2f} wide), wider than the {margin:.0%} margin{split}"
    )


def _s(v: float) -> str:
    return f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.3g} s"


def noisy_metrics(
    tests: Mapping[str, Mapping[str, Any]], default_margin: float, q: float = 0.25
) -> dict[tuple[str, str], str]:
    """(nodeid, metric) -> why, for every time metric of a run's ``tests`` (passed tests)
    that :func:`dispersion` finds too dispersed against its own margin."""
    out: dict[tuple[str, str], str] = {}
    for nodeid, entry in tests.items():
        if entry.get("outcome", "passed") != "passed":
            continue
        for m in entry.get("metrics", []):
            if m.get("kind") != "time":
                continue
            tol = m.get("tolerance")
            why = dispersion(
                m.get("samples") or [], float(tol) if tol is not None else default_margin, q=q
            )
            if why:
                out[(nodeid, m["name"])] = why
    return out
