"""The ``modelled`` kind: a modelled GPU time (``perf.model_gpu_time``, unit ``modelled_s``),
compared like a count. Pure: no clocks, no I/O.

Why a kind of its own: the figure is deterministic (the same code and torch version give the
same bits on any machine), so it needs neither a machine fingerprint nor an interval, and a
change is reported with the source lines whose modelled time moved and what bounds them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from perf.gate.verdict import MetricResult, Status

#: Default relative margin of a ``modelled`` metric (a modelled GPU time): the figure has no
#: noise (same code and torch version: same bits), so the margin only keeps changes too small
#: to matter on the modelled GPU (under 1%) from failing a pull request.
MODELLED_TOLERANCE = 0.01


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.3g} ms" if abs(seconds) >= 1e-4 else f"{seconds * 1e6:+.3g} us"


def _op_change(old_op: str, new_op: str) -> str:
    """``"mm bf16"`` -> ``"mm fp32"`` reads ``mm bf16 → fp32``."""
    if not old_op or old_op == new_op:
        return new_op
    o, n = old_op.split(" "), new_op.split(" ")
    if len(o) == 2 and len(n) == 2 and o[0] == n[0]:
        return f"{n[0]} {o[1]} → {n[1]}"
    return f"{old_op} → {new_op}"


def model_site_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 8, *, fewer: bool = False
) -> str:
    """The sites whose modelled time grew (``fewer=True``: shrank), from the metrics' extra
    ``model_sites`` (``perf.model_gpu_time``'s ``sites``), largest change first, each with its
    op, what bounds it now and the change: ``model.py:41 mm bf16 → fp32: compute-bound,
    +1.9 ms`` (``before: launch-bound`` where the bound changed)."""
    new_sites = (new.get("extra") or {}).get("model_sites")
    old_sites = (old.get("extra") or {}).get("model_sites")
    if not isinstance(new_sites, dict) or not isinstance(old_sites, dict):
        return "" if fewer or not isinstance(new_sites, dict) else "the baseline has no sites"

    def seconds(info: Any) -> float:
        v = info.get("modelled_s", 0.0) if isinstance(info, dict) else 0.0
        return float(v) if isinstance(v, (int, float)) else 0.0

    rows = []
    for site in set(new_sites) | set(old_sites):
        o_info, n_info = old_sites.get(site), new_sites.get(site)
        delta = seconds(n_info) - seconds(o_info)
        if (delta <= 0) if not fewer else (delta >= 0):
            continue
        o_i = o_info if isinstance(o_info, dict) else {}
        n_i = n_info if isinstance(n_info, dict) else {}
        now = n_i or o_i
        op = _op_change(str(o_i.get("op", "")), str(n_i.get("op", ""))) if n_i else o_i.get("op")
        bound = str(now.get("bound", ""))
        text = f"{site} {op}: {bound}-bound"
        if o_i and n_i and o_i.get("bound") != n_i.get("bound"):
            text += f" (before: {o_i.get('bound')}-bound)"
        text += f", {_ms(delta)}"
        text += " (new)" if not o_i else " (gone)" if not n_i else ""
        rows.append((-abs(delta), site, text))
    rows.sort()
    more = f"; and {len(rows) - limit} more" if len(rows) > limit else ""
    return "; ".join(r[2] for r in rows[:limit]) + more


def model_version(metric: Mapping[str, Any]) -> Any:
    """The model version a stored modelled time was made with (its extra ``model``; 1 where
    there is none: version 1 stored no version)."""
    return (metric.get("extra") or {}).get("model", 1)


def compare_modelled(
    nodeid: str,
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    tolerance: float = MODELLED_TOLERANCE,
) -> MetricResult:
    """A modelled GPU time: deterministic, so compared by value on any machine (no
    fingerprint, no interval); beyond the margin (the metric's ``tolerance``, else
    :data:`MODELLED_TOLERANCE`) it is a regression / improvement naming the sites that moved.
    Two different targets, or two versions of the model, are never compared."""
    o, n = float(old["value"]), float(new["value"])
    t_old = (old.get("extra") or {}).get("target")
    t_new = (new.get("extra") or {}).get("target")
    if t_old != t_new:
        return MetricResult(
            nodeid, new["name"], new["unit"], "modelled", "refused", o, n,
            reason=f"modelled on {t_old} in the baseline, on {t_new} now: not comparable",
        )  # fmt: skip
    v_old, v_new = model_version(old), model_version(new)
    if v_old != v_new:
        return MetricResult(
            nodeid, new["name"], new["unit"], "modelled", "refused", o, n,
            reason=(
                f"modelled by version {v_old} of perf's GPU model in the baseline, by version "
                f"{v_new} now (its figures changed: docs/gpu-model.md): not comparable; "
                "record the baseline again"
            ),
        )  # fmt: skip
    tol = new.get("tolerance", old.get("tolerance"))
    m = float(tol) if tol is not None else tolerance
    ratio = n / o if o else (math.inf if n else 1.0)
    status: Status = (
        "regression" if ratio > 1 + m else "improvement" if ratio < 1 - m else "unchanged"
    )
    sites = ""
    if status in ("regression", "improvement"):
        sites = model_site_changes(old, new, fewer=status == "improvement")
    where = f" on {t_new}" if t_new else ""
    reason = f"modelled{where}, deterministic" + (f"; sites: {sites}" if sites else "")
    return MetricResult(
        nodeid, new["name"], new["unit"], "modelled", status, o, n, ratio, margin=m,
        reason=reason, sites=sites,
    )  # fmt: skip
