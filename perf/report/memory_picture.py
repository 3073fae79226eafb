"""A memory picture that opens offline: the allocation timeline as a self-contained SVG / PNG.

Why: the HTML of :func:`perf.instruments.memviz.write_memviz` loads PyTorch's viewer from a
CDN, so on a runner or laptop without internet it opens blank. The snapshot already holds
the timeline (``device_traces``: every alloc / free / segment event with its stack frames),
so perf draws it itself: allocated and reserved bytes over the recorded events, the live
bytes of the top allocation sites stacked under the allocated line, leak sites highlighted.
The pickle stays for PyTorch's viewer (what a picture cannot show: each block's full stack).

:func:`timeline` is the pure data part (no matplotlib); :func:`draw` needs the optional
extra ``plots`` (matplotlib). The SVG draws its text as paths (``svg.fonttype = path``):
it references no font or file and looks the same everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Bands of the stack that are not one site.
BEFORE = "allocated before the recording"
OTHER = "other sites"

_ALLOC = {"alloc": 1, "free_completed": -1}
_RESERVE = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


@dataclass(frozen=True)
class Timeline:
    """Allocator bytes after each recorded event (``event`` 0 is the state before the first).

    ``bands`` hold the live bytes of each stacked band, in drawing order: what was allocated
    before the recording, the top sites (largest peak first), then the other sites; they add
    up to ``allocated_bytes`` at every event.
    """

    allocated_bytes: tuple[int, ...]
    reserved_bytes: tuple[int, ...]
    bands: tuple[tuple[str, tuple[int, ...]], ...]
    leak_sites: tuple[str, ...] = ()

    @property
    def events(self) -> int:
        return len(self.allocated_bytes) - 1

    @property
    def peak_allocated_bytes(self) -> int:
        return max(self.allocated_bytes)

    @property
    def peak_reserved_bytes(self) -> int:
        return max(self.reserved_bytes)


def user_site(frames: Sequence[Mapping[str, Any]]) -> str:
    """The first frame outside torch and perf as ``"path.py:88"``, the key perf's leak sites
    (:func:`perf.memory_growth`) use, so a leak site and its band match."""
    from perf.instruments.sites import SKIP_DIRS, frame_site  # torch: only when drawing

    for f in frames:
        name = str(f.get("filename", ""))
        if name and not name.startswith(SKIP_DIRS) and not name.startswith("<frozen"):
            return frame_site(name, int(f.get("line", 0)), str(f.get("name", "")))[0]
    return "<unknown>"


def timeline(
    snapshot: Mapping[str, Any],
    *,
    top: int = 6,
    leak_sites: Iterable[str] = (),
    site_of: Callable[[Sequence[Mapping[str, Any]]], str] = user_site,
    device: int = 0,
) -> Timeline:
    """The timeline of ``snapshot`` (``torch.cuda.memory._snapshot()``'s dict, or the ``sim``
    allocator's): the levels before the first event are the final ones (its ``segments``)
    minus every recorded change, so a history that dropped its oldest events still ends at
    the right bytes. The ``top`` sites by peak live bytes get a band each, and every leak
    site does too."""
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    segments = [s for s in snapshot.get("segments", []) if s.get("device", 0) == device]
    final_alloc = sum(int(s.get("allocated_size", 0)) for s in segments)
    final_reserved = sum(int(s.get("total_size", 0)) for s in segments)
    d_alloc = sum(_ALLOC.get(e.get("action"), 0) * int(e.get("size", 0)) for e in trace)
    d_res = sum(_RESERVE.get(e.get("action"), 0) * int(e.get("size", 0)) for e in trace)
    alloc, reserved = [final_alloc - d_alloc], [final_reserved - d_res]
    live: dict[int, tuple[str, int]] = {}  # address -> (site, size) of blocks allocated here
    site_bytes: dict[str, list[int]] = {}
    before = [alloc[0]]
    for i, e in enumerate(trace, start=1):
        action, size, addr = e.get("action"), int(e.get("size", 0)), int(e.get("addr", 0))
        alloc.append(alloc[-1] + _ALLOC.get(action, 0) * size)
        reserved.append(reserved[-1] + _RESERVE.get(action, 0) * size)
        before.append(before[-1])
        changed: tuple[str, int] | None = None
        if action == "alloc":
            site = site_of(e.get("frames") or [])
            live[addr] = (site, size)
            changed = (site, size)
        elif action == "free_completed":
            if addr in live:
                site, size = live.pop(addr)
                changed = (site, -size)
            else:  # allocated before the recording started
                before[-1] -= size
        for series in site_bytes.values():
            series.append(series[-1])
        if changed is not None:
            series = site_bytes.setdefault(changed[0], [0] * (i + 1))
            series[-1] += changed[1]
    leaks = tuple(dict.fromkeys(leak_sites))
    ranked = sorted(site_bytes, key=lambda s: (-max(site_bytes[s]), s))
    shown = [s for s in ranked[:top]] + [
        s for s in leaks if s in site_bytes and s not in ranked[:top]
    ]
    n = len(alloc)
    other = [0] * n
    for s, series in site_bytes.items():
        if s not in shown:
            other = [a + b for a, b in zip(other, series, strict=True)]
    bands = [(BEFORE, tuple(before))] + [(s, tuple(site_bytes[s])) for s in shown]
    if any(other):
        bands.append((OTHER, tuple(other)))
    return Timeline(tuple(alloc), tuple(reserved), tuple(bands), leaks)


def _unit(peak: int) -> tuple[float, str]:
    for name, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if peak >= scale:
            return float(scale), name
    return 1.0, "B"


def draw(tl: Timeline, path: str | Path, *, title: str = "") -> list[Path]:
    """Write ``<path>.svg`` and ``<path>.png`` of ``tl``; returns both paths. Raises
    ``ImportError`` naming the extra when matplotlib is missing.

    Two panels over the same events: reserved and allocated (the allocator's view), then the
    allocated bytes stacked by site, each in its own unit: a 2 MiB segment holding a few KiB
    would flatten the sites to nothing on one axis."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            "the offline memory picture needs matplotlib: pip install 'pytest-torch-perf[plots]'"
        ) from None
    from perf.report.text import plain

    x = list(range(tl.events + 1))
    fig = Figure(figsize=(10, 7), layout="constrained")
    top, ax = fig.subplots(2, 1, sharex=True, height_ratios=[1, 2])
    scale, unit = _unit(tl.peak_reserved_bytes)
    top.step(x, [v / scale for v in tl.reserved_bytes], where="post", color="#1f77b4",
             label="reserved")  # fmt: skip
    top.step(x, [v / scale for v in tl.allocated_bytes], where="post", color="black",
             label="allocated")  # fmt: skip
    top.set_ylabel(unit)
    top.legend(loc="upper left", fontsize=7)
    top.grid(alpha=0.3)
    peak = f"peak allocated {tl.peak_allocated_bytes / 2**20:.3f} MiB, reserved "
    peak += f"{tl.peak_reserved_bytes / 2**20:.3f} MiB"
    top.set_title(f"{plain(title)}\n{peak}" if title else peak, fontsize=10)
    scale, unit = _unit(tl.peak_allocated_bytes)
    tab10 = matplotlib.colormaps["tab10"]
    colours = [tab10(i) for i in range(10) if i != 3]  # red (3) marks leaks only
    labels, ys, faces, leaky = [], [], [], []
    for i, (name, series) in enumerate(tl.bands):
        leak = name in tl.leak_sites
        labels.append(plain(("LEAK " if leak else "") + name))
        ys.append([v / scale for v in series])
        grey = name in (BEFORE, OTHER)
        faces.append("#d62728" if leak else "#d9d9d9" if grey else colours[i % len(colours)])
        leaky.append(leak)
    polys = ax.stackplot(x, *ys, labels=labels, colors=faces, step="post", alpha=0.85)
    for poly, leak in zip(polys, leaky, strict=True):
        if leak:
            poly.set_hatch("///")
            poly.set_edgecolor("black")
    ax.step(x, [v / scale for v in tl.allocated_bytes], where="post", color="black", lw=1)
    ax.set_xlabel("allocator events, in order")
    ax.set_ylabel(f"allocated, {unit}, by site")
    ax.legend(loc="upper left", fontsize=7, framealpha=0.9)
    ax.grid(alpha=0.3)
    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    out = [base.with_name(base.name + ".svg"), base.with_name(base.name + ".png")]
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "perf"}):
        fig.savefig(out[0], metadata={"Date": None})
        fig.savefig(out[1], dpi=110)
    return out
