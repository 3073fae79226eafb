"""Plots of stored runs (matplotlib is an optional extra:
``pip install 'pytest-torch-perf[plots]'``).

All functions take plain run data (:class:`perf.store.runs.Run`), write a PNG/SVG/PDF to
``out`` and return its path; nothing here measures anything.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perf.store.runs import Run


class PlotError(ValueError):
    """The requested plot cannot be drawn from these runs (says what is missing)."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotError(
            "plots need matplotlib, which is not installed: "
            "pip install 'pytest-torch-perf[plots]' (from a checkout: pip install '.[plots]'; "
            "or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


_NUM = re.compile(r"(?:^|[-_\[])(?:n|bs|batch|size)?(\d+)(?:$|[-_\]])")


def _param_value(nodeid: str) -> float | None:
    """The size parameter of a parametrised test id (``test_x[cpu-n512]`` -> 512)."""
    if "[" not in nodeid:
        return None
    params = nodeid[nodeid.index("[") + 1 :].rstrip("]")
    nums = [int(m.group(1)) for m in _NUM.finditer(params.replace("-", "--"))]
    return float(nums[-1]) if nums else None


def series(run: Run, metric: str, test_prefix: str = "") -> list[tuple[float, float]]:
    """(size, value) points of ``metric`` across a parametrised test, sorted by size.

    The size comes from the metric's ``extra["size"]`` (or ``extra["batch"]``) when recorded,
    else from the last number in the test id's parameters.
    """
    pts: list[tuple[float, float]] = []
    for nodeid, entry in run.tests.items():
        if not nodeid.startswith(test_prefix):
            continue
        for m in entry["metrics"]:
            if m["name"] != metric:
                continue
            extra = m.get("extra") or {}
            x = extra.get("size", extra.get("batch"))
            x = float(x) if isinstance(x, (int, float)) else _param_value(nodeid)
            if x is not None:
                pts.append((x, float(m["value"])))
    return sorted(pts)


def _save(fig: Any, out: str | Path) -> Path:
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, bbox_inches="tight", dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return p


def speedup_vs_size(run: Run, metric: str, out: str | Path, test_prefix: str = "") -> Path:
    """A ratio metric (e.g. CPU time / GPU time) against the size parameter, with 1x marked."""
    pts = series(run, metric, test_prefix)
    if len(pts) < 2:
        raise PlotError(
            f"run {run.label}: metric {metric!r} has {len(pts)} sized points "
            f"(need 2+ parametrised tests recording it)"
        )
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("size")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs size ({run.label})")
    return _save(fig, out)


def memory_vs_batch(run: Run, metric: str, out: str | Path, test_prefix: str = "") -> Path:
    """A bytes metric against batch size with its least-squares line (P7: linear memory)."""
    from perf.core.stats import linear_fit

    pts = series(run, metric, test_prefix)
    if len(pts) < 2:
        raise PlotError(f"run {run.label}: metric {metric!r} has {len(pts)} sized points")
    plt = _pyplot()
    xs, ys = [p[0] for p in pts], [p[1] / 2**20 for p in pts]
    fit = linear_fit(xs, ys)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, ys, marker="o", linestyle="", label="measured")
    ax.plot(
        xs,
        [fit.slope * x + fit.intercept for x in xs],
        label=f"fit: {fit.slope:.3g} MiB/sample + {fit.intercept:.3g} MiB (R² {fit.r2:.3f})",
    )
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"{metric} (MiB)")
    ax.legend()
    ax.set_title(f"{metric} vs batch ({run.label})")
    return _save(fig, out)


def history(runs: Sequence[Run], nodeid: str, metric: str, out: str | Path) -> Path:
    """One metric of one test across stored runs (oldest first), with its CI where stored."""
    pts: list[tuple[str, float, Any]] = []
    for r in runs:
        for m in r.tests.get(nodeid, {}).get("metrics", []):
            if m["name"] == metric:
                pts.append((r.path.stem[:4] if r.path else r.name, float(m["value"]), m.get("ci")))
    if not pts:
        raise PlotError(f"no stored run has metric {metric!r} of test {nodeid!r}")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, len(pts) * 0.4), 4))
    xs = list(range(len(pts)))
    ax.plot(xs, [p[1] for p in pts], marker="o")
    for x, (_, _value, ci) in zip(xs, pts, strict=True):
        if ci:
            ax.vlines(x, ci[0], ci[1], color="grey")
    ax.set_xticks(xs, [p[0] for p in pts], rotation=90)
    ax.set_xlabel("run")
    ax.set_ylabel(metric)
    ax.set_title(f"{nodeid} {metric}")
    return _save(fig, out)
