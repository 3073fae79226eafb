"""Dispatched aten ops and, on CUDA, kernel launches (``perf.count_ops``)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from perf.instruments.live import _Live
from perf.instruments.timing import DeviceLike

aten = torch.ops.aten

# --------------------------------------------------------------------------------------------
# ops and kernel launches


@dataclass(frozen=True)
class OpCount:
    """Dispatched aten ops (a launch proxy, exact on CPU) and, on CUDA, kernels launched."""

    count: int
    by_op: dict[str, int]
    kernel_launches: int | None = None
    kernels_by_name: dict[str, int] = field(default_factory=dict)


class _OpDispatchMode(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.by_op[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


class _OpsProxy(_Live):
    def __init__(self, mode: _OpDispatchMode) -> None:
        self._mode = mode

    def _snapshot(self) -> OpCount:
        if self._final is not None:
            return self._final
        by = dict(sorted(self._mode.by_op.items()))
        return OpCount(sum(by.values()), by)


def kernel_devices(
    device: DeviceLike | Sequence[DeviceLike],
    kernels: bool | None,
    *,
    cuda_available: bool,
    current_cuda: int = 0,
) -> tuple[int, ...]:
    """The CUDA device indices whose kernels ``count_ops`` counts (empty: none, no profiler).

    Kernels are counted only when the block measures a CUDA device: a CPU (or meta, or
    simulated) device launches no CUDA kernel, so starting the CUDA profiler there would only
    cost time and report a meaningless 0. ``kernels=None`` decides from ``device``;
    ``kernels=False`` never counts; ``kernels=True`` insists and raises ``ValueError`` when no
    CUDA device is measured. ``cuda`` without an index is the current CUDA device. Pure: the
    caller passes what torch reports, so the decision is testable without a GPU.
    """
    if device is None:
        devs: list[torch.device] = []
    elif isinstance(device, (str, torch.device)):
        devs = [torch.device(device)]
    else:
        devs = [torch.device(d) for d in device if d is not None]
    cuda = [d for d in devs if d.type == "cuda"]
    if kernels is False:
        return ()
    if not cuda:
        if kernels:
            named = ", ".join(str(d) for d in devs) or "none"
            raise ValueError(
                f"count_ops(kernels=True) needs a CUDA device to measure (devices given: "
                f"{named}); pass device='cuda:N' (or a list of them)"
            )
        return ()
    if not cuda_available:
        raise ValueError(
            f"count_ops(device={', '.join(str(d) for d in cuda)}): CUDA is not available "
            f"(torch {torch.__version__}); measure a device that exists, e.g. device='cpu'"
        )
    out: list[int] = []
    for d in cuda:
        i = current_cuda if d.index is None else d.index
        if i not in out:
            out.append(i)
    return tuple(out)


@contextlib.contextmanager
def count_ops(
    device: DeviceLike | Sequence[DeviceLike] = None, *, kernels: bool | None = None
) -> Iterator[_OpsProxy]:
    """Count aten ops dispatched in the block; when ``device`` is a CUDA device (or a list
    holding some), also count the kernels launched on those devices with the profiler.

    Every measured CUDA device is synchronised before and after the block, so kernels still
    queued when it ends are counted and earlier work is not. ``kernels=False`` skips the
    profiler; ``kernels=True`` demands it (see :func:`kernel_devices`). The kernel count is
    exact for eager code; the profiler adds its own cost, so don't time a block while
    counting.
    """
    mode = _OpDispatchMode()
    proxy = _OpsProxy(mode)
    cuda_ok = torch.cuda.is_available()
    indices = kernel_devices(
        device,
        kernels,
        cuda_available=cuda_ok,
        current_cuda=torch.cuda.current_device() if cuda_ok else 0,
    )
    prof_cm: Any = contextlib.nullcontext()
    if indices:
        from torch.profiler import ProfilerActivity, profile

        for i in indices:
            torch.cuda.synchronize(i)
        prof_cm = profile(activities=[ProfilerActivity.CUDA])
    with prof_cm as prof:
        try:
            with mode:
                yield proxy
        finally:
            for i in indices:
                torch.cuda.synchronize(i)
    by = dict(sorted(mode.by_op.items()))
    launches: int | None = None
    names: dict[str, int] = {}
    if indices and prof is not None:
        c: Counter[str] = Counter()
        for ev in prof.events():
            if _is_kernel(ev) and getattr(ev, "device_index", None) in indices:
                c[ev.name] += 1
        launches, names = sum(c.values()), dict(c.most_common())
    proxy._final = OpCount(sum(by.values()), by, launches, names)


def _is_kernel(ev: Any) -> bool:
    from torch.autograd import DeviceType

    return getattr(ev, "device_type", None) == DeviceType.CUDA and not ev.name.startswith(
        ("Memcpy", "Memset")
    )
