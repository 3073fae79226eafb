"""Each metric over the runs, one panel per (test, metric), a dashed line where Otava found a
new level (matplotlib: the optional ``plots`` extra)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from perf.gate.history import ChangePoint, Series
from perf.report.plots import PlotError

#: Panels drawn at most (a suite has hundreds of series; name them with --metric / --test).
MAX_PANELS = 24


def history_plot(
    series: Sequence[Series],
    found: Mapping[tuple[str, str], Sequence[ChangePoint]],
    out: str | Path,
) -> Path:
    """Write the plot to ``out`` (PNG, SVG or PDF by suffix); returns its path."""
    if not series:
        raise PlotError("no metric to plot: no stored run has a passed test with it")
    try:
        import matplotlib
    except ImportError:
        raise PlotError(
            "the history plot needs matplotlib, which is not installed: "
            "pip install 'pytest-torch-perf[plots]'"
        ) from None
    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    shown = list(series)[:MAX_PANELS]
    fig, axes = plt.subplots(
        len(shown), 1, figsize=(9, 2.4 * len(shown)), squeeze=False, constrained_layout=True
    )
    for ax, s in zip(axes[:, 0], shown, strict=True):
        xs = list(range(len(s.points)))
        ax.plot(xs, s.values, marker="o", markersize=3, linewidth=1)
        for cp in found.get((s.nodeid, s.metric), ()):
            ax.axvline(cp.index - 0.5, color="tab:red", linestyle="--", linewidth=1)
            label = (cp.commit or cp.run)[:8]
            ax.annotate(
                f"{label} {cp.change:+.1%}",
                (cp.index - 0.5, 1.0),
                xycoords=("data", "axes fraction"),
                va="top",
                fontsize=7,
                color="tab:red",
            )
        ticks = [(p.commit or p.run)[:7] for p in s.points]
        step = max(1, len(ticks) // 12)
        ax.set_xticks(xs[::step], ticks[::step], rotation=45, fontsize=6)
        ax.set_title(f"{s.nodeid}  {s.metric}", fontsize=8)
        ax.set_ylabel(s.unit, fontsize=7)
    if len(series) > len(shown):
        fig.suptitle(f"first {len(shown)} of {len(series)} series", fontsize=8)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
