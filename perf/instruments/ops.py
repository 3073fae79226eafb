"""Dispatched aten ops, kernels and host launches (``perf.count_ops``).

What the launch fields mean on each device (rules in :mod:`perf.instruments.launches`):

- ``cuda:N``: ``kernels`` are the kernels the device ran (CUPTI kernel records),
  ``host_launches`` the launch API calls the host made (``cudaLaunchKernel*``,
  ``cuLaunchKernel*``, ``cudaGraphLaunch``: a graph replay is one launch), both from the
  profiler and filtered by device index.
- ``sim``: ``host_launches`` is the model of CUDA (one launch per dispatched op that computes
  on the device); ``kernels`` is None (nothing records kernels there).
- ``cpu`` (or no device): both None. The CPU launches nothing; ``count`` is its op count.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from perf.instruments.launches import LaunchCount, classify_profiler_events, sim_op_launches
from perf.instruments.live import Live
from perf.instruments.modes import CountingDispatchMode, decomposed
from perf.instruments.timing import DeviceLike
from perf.sim.tensors import NAME as SIM

aten = torch.ops.aten

# --------------------------------------------------------------------------------------------
# ops and kernel launches


@dataclass(frozen=True)
class OpCount:
    """Dispatched aten ops, and where a device is measured, kernels and host launches.

    ``kernels``: kernels the measured CUDA devices ran (None off CUDA). ``host_launches``:
    launch calls the host made for them (CUDA: launch API calls, a graph replay is one; sim:
    the model, one per computing op; None on the CPU). ``launches_by_name``: per launch API
    on CUDA, per aten op on sim. ``unattributed_launches``: CUDA launch calls matching no
    device record (not in ``host_launches``).
    """

    count: int
    by_op: dict[str, int]
    kernels: int | None = None
    kernels_by_name: dict[str, int] = field(default_factory=dict)
    host_launches: int | None = None
    launches_by_name: dict[str, int] = field(default_factory=dict)
    unattributed_launches: int = 0


class _OpDispatchMode(CountingDispatchMode):
    def __init__(self, sim_type: str | None = None) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()
        self.sim_type = sim_type
        self.sim_launches: Counter[str] = Counter()
        #: id(op) -> (op, its name, is it a view): an ``OpOverload`` hashes in Python
        self._ops: dict[int, tuple[Any, str, bool]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = decomposed(self, func, args, kwargs or {})  # an op seen whole: its parts
        if out is not NotImplemented:
            return out
        facts = self._ops.get(id(func))
        if facts is None:
            name = str(func.overloadpacket.__name__)
            facts = self._ops[id(func)] = (func, name, bool(getattr(func, "is_view", False)))
        name = facts[1]
        self.by_op[name] += 1
        out = func(*args, **(kwargs or {}))
        if self.sim_type is not None and sim_op_launches(
            name, facts[2], args, kwargs, out, self.sim_type
        ):
            self.sim_launches[name] += 1
        return out

    def higher_order(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """One op (FlexAttention's fused kernel on CUDA when compiled; eager, its parts run
        below this mode)."""
        name = func.name()
        self.by_op[name] += 1
        out = func(*args, **kwargs)
        if self.sim_type is not None and sim_op_launches(
            name, False, args, kwargs, out, self.sim_type
        ):
            self.sim_launches[name] += 1
        return out


class _OpsProxy(Live):
    def __init__(self, mode: _OpDispatchMode) -> None:
        self._mode = mode

    def _snapshot(self) -> OpCount:
        if self._final is not None:
            return self._final
        return _result(self._mode, None)


def _result(mode: _OpDispatchMode, cuda: LaunchCount | None) -> OpCount:
    by = dict(sorted(mode.by_op.items()))
    sim = mode.sim_type is not None
    if cuda is None and not sim:
        return OpCount(sum(by.values()), by)
    host = (cuda.host_launches if cuda else 0) + sum(mode.sim_launches.values())
    names = Counter(cuda.launches_by_api if cuda else {}) + mode.sim_launches
    return OpCount(
        sum(by.values()),
        by,
        kernels=cuda.kernels if cuda else None,
        kernels_by_name=cuda.kernels_by_name if cuda else {},
        host_launches=host,
        launches_by_name=dict(names.most_common()),
        unattributed_launches=cuda.unattributed_launches if cuda else 0,
    )


def measures_sim(device: DeviceLike | Sequence[DeviceLike]) -> bool:
    """Whether ``device`` (or the list) names perf's simulated device."""
    if device is None:
        return False
    devs = [device] if isinstance(device, (str, torch.device)) else list(device)
    return any(d is not None and torch.device(d).type == SIM for d in devs)


def kernel_devices(
    device: DeviceLike | Sequence[DeviceLike],
    kernels: bool | None,
    *,
    cuda_available: bool,
    current_cuda: int | Callable[[], int] = 0,
) -> tuple[int, ...]:
    """The CUDA device indices whose kernels ``count_ops`` counts (empty: none, no profiler).

    Kernels are counted only when the block measures a CUDA device: a CPU (or meta, or
    simulated) device launches no CUDA kernel, so starting the CUDA profiler there would only
    cost time and report a meaningless 0. ``kernels=None`` decides from ``device``;
    ``kernels=False`` never counts; ``kernels=True`` insists and raises ``ValueError`` when no
    CUDA device is measured. ``cuda`` without an index is the current CUDA device,
    ``current_cuda`` (or what it returns, called only then). Pure: the caller passes what torch
    reports, so the decision is testable without a GPU.
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
        if d.index is not None:
            i = d.index
        else:
            i = current_cuda() if callable(current_cuda) else current_cuda
        if i not in out:
            out.append(i)
    return tuple(out)


@contextlib.contextmanager
def count_ops(
    device: DeviceLike | Sequence[DeviceLike] = None, *, kernels: bool | None = None
) -> Iterator[_OpsProxy]:
    """Count aten ops dispatched in the block; when ``device`` is a CUDA device (or a list
    holding some), also count the kernels those devices ran and the host's launch calls
    with the profiler; on ``sim``, the modelled launches (see :class:`OpCount`).

    Every measured CUDA device is synchronised before and after the block, so kernels still
    queued when it ends are counted and earlier work is not. ``kernels=False`` skips the
    profiler; ``kernels=True`` demands it (see :func:`kernel_devices`). Nested
    ``torch.profiler`` sessions fail, so counting CUDA kernels inside a running profiler
    raises ``RuntimeError`` before the block. The counts are exact for eager code; the
    profiler adds its own cost, so don't time a block while counting.
    """
    cuda_ok = torch.cuda.is_available()
    # The current device is asked for only where the block names a bare "cuda": asking
    # initialises CUDA (a context on the GPU), which counting CPU or `sim` work must not do.
    indices = kernel_devices(
        device, kernels, cuda_available=cuda_ok, current_cuda=torch.cuda.current_device
    )
    mode = _OpDispatchMode(SIM if measures_sim(device) and kernels is not False else None)
    proxy = _OpsProxy(mode)
    prof_cm: Any = contextlib.nullcontext()
    if indices:
        if torch.autograd._profiler_enabled():
            raise RuntimeError(
                "count_ops cannot count CUDA kernels inside a running torch.profiler session "
                "(nested profilers fail); count outside it, or pass kernels=False"
            )
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
    cuda = classify_profiler_events(prof.events(), indices) if indices and prof else None
    proxy._final = _result(mode, cuda)
