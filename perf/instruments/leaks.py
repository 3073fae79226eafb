"""Memory that grows from step to step, named by the line that allocated it.

Why: a training loop that keeps a reference it should drop (``losses.append(loss)``,
``total += loss``, a cache of device tensors, hooks registered every step) grows until it runs
out of memory, hours in. The growth is decided by code: on ``sim`` it is an exact count of
bytes per step on a CPU-only box. :func:`memory_growth` runs a step ``warmup + steps`` times,
measures allocated bytes after each step, and attributes the growth to the first user frame
(file:line, function, source line, as sync sites are named) of the allocations still alive.

How the sites are found: every allocation after entry carries its Python stack (on ``sim``:
the model's blocks; on ``cuda``: ``torch.cuda.memory._record_memory_history(stacks="python")``
and a snapshot). Live bytes are summed per site after warm-up and after the last step; a site
whose live bytes grew is a leak site. A loop that reallocates what it frees at the same line
(gradients, optimizer temporaries) has no growing site.

On CUDA two things are process-wide and are handled so: the allocation-history recording is
one switch for the process, so :func:`memory_growth` leaves a recording it finds running (the
failure-snapshot plugin's, or the user's: ``torch._C._cuda_isHistoryEnabled()``, the check
torch's own ``_inductor/cudagraph_trees.py`` ``enable_history_recording`` makes) and stops only
one it started (:func:`cuda_history`); and ``torch.cuda.memory._snapshot()`` holds every
device's segments (its ``device`` argument is not passed on: ``_C._cuda_memorySnapshot(None)``),
so only the measured device's segments are read (each segment's ``device`` field,
:func:`census_from_snapshot`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from perf.instruments.sites import SKIP_DIRS, frame_site
from perf.instruments.timing import DeviceLike, as_device, synchronize
from perf.sim.tensors import NAME


@dataclass(frozen=True)
class LeakSite:
    """One line whose live allocations grew: bytes (allocator blocks) and blocks."""

    site: str
    function: str
    code: str
    grown_bytes: int
    grown_blocks: int


@dataclass(frozen=True)
class MemoryGrowth:
    """Allocated bytes over the measured steps and where the growth was allocated."""

    device: str
    steps: int
    warmup: int
    #: allocated bytes after warm-up, then after each measured step
    allocated_bytes: tuple[int, ...]
    #: leak sites, largest growth first
    sites: tuple[LeakSite, ...] = field(default_factory=tuple)

    @property
    def growth_bytes(self) -> int:
        """Allocated bytes after the last step minus after warm-up."""
        return self.allocated_bytes[-1] - self.allocated_bytes[0]

    @property
    def growth_bytes_per_step(self) -> int:
        """Average growth per measured step (floor), 0 for a loop that leaks nothing."""
        return self.growth_bytes // self.steps

    @property
    def per_step_bytes(self) -> tuple[int, ...]:
        """The growth of each measured step."""
        a = self.allocated_bytes
        return tuple(a[i + 1] - a[i] for i in range(len(a) - 1))

    @property
    def sites_extra(self) -> dict[str, dict[str, Any]]:
        """JSON-ready sites for a metric's extra data (the gate names grown sites):
        ``perf_metrics.record("leak_bytes_per_step", g.growth_bytes_per_step, "bytes",
        tolerance=0.0, sites=g.sites_extra)``."""
        return {
            s.site: {"n": s.grown_bytes, "function": s.function, "code": s.code} for s in self.sites
        }

    def describe(self) -> str:
        """One line per leak site, for assertion messages."""
        lines = [f"allocated memory grew {self.growth_bytes} bytes over {self.steps} steps"]
        for s in self.sites:
            lines.append(
                f"  {s.site} in {s.function} `{s.code}`: +{s.grown_bytes} bytes "
                f"in {s.grown_blocks} blocks"
            )
        return "\n".join(lines)


def _user_frame(frames: Any) -> tuple[str, str, str]:
    for f in frames:
        name, line, fn = (
            (f["filename"], f["line"], f["name"]) if isinstance(f, dict) else (f[0], f[1], f[2])
        )
        if not name.startswith(SKIP_DIRS) and not name.startswith("<frozen"):
            return frame_site(name, line, fn)
    return "<unknown>", "", ""


_Census = dict[tuple[str, str, str], list[int]]  # site -> [bytes, blocks]


def _census_sim() -> _Census:
    from perf.sim.memory import live_blocks, workspace_blocks

    skip = workspace_blocks()
    out: _Census = {}
    for b in live_blocks():
        if id(b) in skip:
            continue
        acc = out.setdefault(_user_frame(b.frames), [0, 0])
        acc[0] += b.size
        acc[1] += 1
    return out


def census_from_snapshot(snapshot: Mapping[str, Any], device_index: int) -> _Census:
    """Live bytes and blocks per allocating site, from a ``_snapshot()`` dict, for one device:
    segments of other devices (the snapshot holds all of them) are not read."""
    out: _Census = {}
    for seg in snapshot.get("segments", []):
        if seg.get("device", device_index) != device_index:
            continue
        for b in seg["blocks"]:
            if b["state"] != "active_allocated":
                continue
            acc = out.setdefault(_user_frame(b.get("frames", [])), [0, 0])
            acc[0] += b["size"]
            acc[1] += 1
    return out


@contextlib.contextmanager
def cuda_history(is_enabled: Callable[[], bool], record: Callable[..., None]) -> Iterator[bool]:
    """Allocation history with Python stacks inside the block; yields whether it started it.

    A recording already running (``is_enabled()``) is left exactly as found: restarting it
    with other settings would cut its history, stopping it would take the failure snapshot's
    history away. Otherwise one is started and stopped afterwards, also on error.
    ``is_enabled`` / ``record``: ``torch._C._cuda_isHistoryEnabled`` and
    ``torch.cuda.memory._record_memory_history`` (fakes in tests).
    """
    if is_enabled():
        yield False
        return
    record(max_entries=1, stacks="python")
    try:
        yield True
    finally:
        record(enabled=None)


def memory_growth(
    step: Callable[[], Any], device: DeviceLike, *, steps: int = 10, warmup: int = 2
) -> MemoryGrowth:
    """Run ``step()`` ``warmup + steps`` times on ``device`` (``sim`` or ``cuda``) and report
    how allocated memory grows per measured step, with the sites of the growth.

    Warm-up steps let lazily made state settle (optimizer state, cuBLAS workspaces, the
    first ``.grad``). Raises ``ValueError`` for a device without allocator statistics.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(
            f"memory_growth: steps must be >= 1 and warmup >= 0, got {steps}, {warmup}"
        )
    d = as_device(device)
    if d.type == NAME:
        from perf.sim.memory import capture_frames
        from perf.sim.memory_api import MemoryAPI

        allocated: Callable[[], int] = MemoryAPI.memory_allocated
        census = _census_sim
        prev = capture_frames(True)

        def stop() -> None:
            capture_frames(prev)
    elif d.type == "cuda":
        index = d.index if d.index is not None else torch.cuda.current_device()

        def allocated() -> int:
            return int(torch.cuda.memory_allocated(index))

        def census() -> _Census:
            return census_from_snapshot(torch.cuda.memory._snapshot(), index)

        history = cuda_history(
            torch._C._cuda_isHistoryEnabled, torch.cuda.memory._record_memory_history
        )
        history.__enter__()

        def stop() -> None:
            history.__exit__(None, None, None)
    else:
        raise ValueError(
            f"memory_growth needs a device with allocator statistics (cuda or perf's "
            f"simulated device), got {d}; use perf.simulated_device() on a CPU-only box"
        )
    try:
        for _ in range(warmup):
            step()
        synchronize(d)
        before = census()
        sizes = [allocated()]
        for _ in range(steps):
            step()
            synchronize(d)
            sizes.append(allocated())
        after = census()
    finally:
        stop()
    sites = []
    for key, (nbytes, nblocks) in after.items():
        b0, k0 = before.get(key, (0, 0))
        if nbytes > b0:
            sites.append(LeakSite(key[0], key[1], key[2], nbytes - b0, nblocks - k0))
    sites.sort(key=lambda s: (-s.grown_bytes, s.site))
    return MemoryGrowth(str(d), steps, warmup, tuple(sizes), tuple(sites))
