"""A picture of device memory: the snapshot PyTorch's memory visualiser reads.

Why: a failing memory figure says *how much*; the allocation timeline with stack frames says
*what*. :func:`memory_snapshot` returns the dict of ``torch.cuda.memory._snapshot()`` (on
``sim`` from the allocator model, on ``cuda`` from the allocator itself);
:func:`write_memviz` writes it as the pickle that https://pytorch.org/memory_viz opens and as
the self-contained HTML that ``torch.cuda._memory_viz.trace_plot`` makes from it.
:func:`recording` turns on the history (``_record_memory_history``) for a block.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from perf.instruments.timing import DeviceLike, as_device
from perf.sim.tensors import NAME


def _device(device: DeviceLike) -> torch.device:
    if isinstance(device, str) and device.split(":")[0] == NAME:
        from perf.sim.device import simulated_device

        simulated_device()  # "sim" names a device only once it is installed
    return as_device(device)


def _check(d: torch.device) -> None:
    if d.type not in ("cuda", NAME):
        raise ValueError(
            f"memory snapshots need a device with an allocator (cuda or perf's simulated "
            f"device), got {d}"
        )


#: CUDA: whether the history now recording is perf's (started by :func:`recording`); the
#: recording is one switch for the process, and one perf did not start is never stopped.
_cuda_started_by_perf = False


@contextlib.contextmanager
def recording(device: DeviceLike, max_entries: int = 100_000) -> Iterator[None]:
    """Record the allocation history (with Python stacks) inside the block.

    On CUDA a recording already running (``torch._C._cuda_isHistoryEnabled()``, e.g. the
    user's own) is used as it is, and :func:`stop_recording` leaves it running.
    """
    global _cuda_started_by_perf
    d = _device(device)
    _check(d)
    if d.type == NAME:
        from perf.sim.memory import allocator, capture_frames

        prev = capture_frames(True)
        allocator().record_history(True, max_entries)
        try:
            yield
        finally:
            capture_frames(prev)
        return
    if not torch._C._cuda_isHistoryEnabled():
        torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
        _cuda_started_by_perf = True
    try:
        yield
    finally:
        pass  # the history stays for the snapshot; stop with stop_recording()


def stop_recording(device: DeviceLike) -> None:
    """Drop the recorded history (after taking a snapshot); on CUDA only a recording
    :func:`recording` started."""
    global _cuda_started_by_perf
    d = _device(device)
    _check(d)
    if d.type == NAME:
        from perf.sim.memory import allocator

        allocator().record_history(False)
    elif _cuda_started_by_perf:
        torch.cuda.memory._record_memory_history(enabled=None)
        _cuda_started_by_perf = False


def memory_snapshot(device: DeviceLike) -> dict[str, Any]:
    """``torch.cuda.memory._snapshot()``'s dict for ``device``."""
    d = _device(device)
    _check(d)
    if d.type == NAME:
        from perf.sim.memory import allocator

        return allocator().snapshot()
    return torch.cuda.memory._snapshot(d)


def write_memviz(snapshot: dict[str, Any], path: str | Path) -> list[Path]:
    """Write ``snapshot`` as ``<path>.pickle`` (drag it onto pytorch.org/memory_viz) and
    ``<path>.html`` (``torch.cuda._memory_viz.trace_plot``: the snapshot embedded, the viewer's
    JavaScript loaded from PyTorch's CDN when opened). Returns both paths."""
    from torch.cuda import _memory_viz

    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    pkl = base.with_name(base.name + ".pickle")
    html = base.with_name(base.name + ".html")
    with open(pkl, "wb") as fh:
        pickle.dump(snapshot, fh)
    html.write_text(_memory_viz.trace_plot(snapshot), encoding="utf-8")
    return [pkl, html]
