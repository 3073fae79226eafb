"""Exact counters: host-device syncs, dispatched ops / kernel launches, transfers, FLOPs.

Counts are the backbone of the gate: the same code on the same torch version gives the same
count on every run and every machine, so a count gates with zero noise even on a CPU-only box.

Two interception layers are needed because neither sees everything:

- a ``TorchFunctionMode`` sees Python-level tensor methods (``.item()``, ``float(t)``,
  ``.tolist()``, ``.cpu()``, ``.numpy()``, formatting), some of which dispatch *no* aten op
  on a CPU tensor;
- a ``TorchDispatchMode`` sees aten ops whose output size depends on data (``nonzero``,
  ``masked_select``, ``unique``, boolean-mask indexing, ...) and cross-device copies.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from perf.timing import DeviceLike

aten = torch.ops.aten

# --------------------------------------------------------------------------------------------
# syncs


@dataclass(frozen=True)
class SyncCount:
    """Host-device synchronisations counted in a block; ``by_op`` says which call caused each."""

    count: int
    by_op: dict[str, int]
    #: Optimizer-internal reads of CPU ``step`` tensors seen and (correctly) not counted.
    ignored_optimizer_steps: int = 0


#: Tensor methods that copy device data to the host and block until it is there.
_FUNC_SYNCS: dict[Any, str] = {
    torch.Tensor.item: "item",
    torch.Tensor.__float__: "float",
    torch.Tensor.__int__: "int",
    torch.Tensor.__bool__: "bool",
    torch.Tensor.__index__: "index",
    torch.Tensor.__format__: "format",
    torch.Tensor.__repr__: "format",
    torch.Tensor.__str__: "format",
    torch.Tensor.tolist: "tolist",
    torch.Tensor.cpu: "cpu",
    torch.Tensor.numpy: "numpy",
    torch.Tensor.__array__: "numpy",
    torch.Tensor.__complex__: "complex",
}

#: aten ops that read device data on the host (data-dependent output shapes or a scalar).
_DISPATCH_SYNCS: dict[Any, str] = {
    aten._local_scalar_dense.default: "item",
    aten.nonzero.default: "nonzero",
    aten.nonzero.out: "nonzero",
    aten.nonzero_static.default: "",  # static size: no sync; listed to document the choice
    aten.masked_select.default: "masked_select",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique_consecutive",
    aten.unique_dim_consecutive.default: "unique_consecutive",
    aten.equal.default: "equal",
    aten.is_nonzero.default: "bool",
}

_FUNC_WATCHED = frozenset([*_FUNC_SYNCS, torch.Tensor.to, torch.Tensor.copy_])
_DISPATCH_WATCHED = frozenset(
    [
        *_DISPATCH_SYNCS,
        aten.index.Tensor,
        aten.repeat_interleave.Tensor,
        aten._to_copy.default,
        aten.copy_.default,
    ]
)


def _tensor_device(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> torch.device | None:
    for a in (*args, *(kwargs or {}).values()):
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    return b.device
    return None


class SyncCounter:
    """Counts syncs. ``cpu_is_device``: CPU tensors stand in for accelerator tensors."""

    def __init__(self, cpu_is_device: bool) -> None:
        self.cpu_is_device = cpu_is_device
        self.by_op: Counter[str] = Counter()
        self._suppress = 0  # >0 while inside a counted Python-level call
        self._in_step = 0  # >0 inside optimizer.step()
        self._step_pending: list[tuple[int, str]] = []  # (id(tensor), op) seen inside step
        self._ignored = 0

    def _on_device(self, dev: torch.device | None) -> bool:
        if dev is None:
            return False
        if dev.type == "meta":
            return False
        return self.cpu_is_device or dev.type != "cpu"

    def hit(self, op: str, tensor: torch.Tensor | None = None) -> None:
        if self._in_step and tensor is not None and op == "item":
            self._step_pending.append((id(tensor), op))
            return
        self.by_op[op] += 1

    # optimizer hooks: Adam/AdamW (foreach, for-loop) read their CPU `step` tensors with
    # .item(); on CUDA those are host reads of host memory, not device syncs. We hold back
    # .item() calls made inside step() and, once it returns, drop those whose tensor is a
    # `step` entry of the optimizer's state. Real syncs inside step() still count.
    def _pre_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._in_step += 1

    def _post_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._in_step -= 1
        if self._in_step:
            return
        step_ids = {
            id(st["step"])
            for st in opt.state.values()
            if isinstance(st, dict) and isinstance(st.get("step"), torch.Tensor)
        }
        for tid, op in self._step_pending:
            if tid in step_ids:
                self._ignored += 1
            else:
                self.by_op[op] += 1
        self._step_pending.clear()

    def result(self) -> SyncCount:
        by_op = {k: v for k, v in sorted(self.by_op.items()) if v}
        return SyncCount(sum(by_op.values()), by_op, self._ignored)


class _SyncFunctionMode(TorchFunctionMode):
    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.c = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _FUNC_WATCHED:  # fast path: almost every call
            return func(*args, **kwargs)
        c = self.c
        if c._suppress:
            return func(*args, **kwargs)
        op = _FUNC_SYNCS.get(func)
        if op is None:
            op = _to_host_copy(func, args, kwargs, c)
        t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if op is None or t is None or not c._on_device(t.device):
            return func(*args, **kwargs)
        c.hit(op, t)
        c._suppress += 1
        try:
            return func(*args, **kwargs)
        finally:
            c._suppress -= 1


def _to_host_copy(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], c: SyncCounter
) -> str | None:
    """``t.to("cpu")`` / ``cpu_t.copy_(dev_t)``: a device-to-host copy is a sync."""
    if func is torch.Tensor.to:
        target = kwargs.get("device")
        for a in args[1:]:
            if isinstance(a, (str, torch.device)):
                target = a
            elif isinstance(a, torch.Tensor):
                target = a.device
        if target is not None and torch.device(target).type == "cpu":
            # A non-blocking copy to the host does not wait (the caller must sync later).
            return None if kwargs.get("non_blocking") else "to_cpu"
        return None
    dst, src = args[0], args[1] if len(args) > 1 else kwargs.get("src")
    if (
        isinstance(src, torch.Tensor)
        and isinstance(dst, torch.Tensor)
        and dst.device.type == "cpu"
        and c._on_device(src.device)
        and (src.device.type != "cpu")
    ):
        return "copy_to_cpu"
    return None


class _SyncDispatchMode(TorchDispatchMode):
    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.c = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        c = self.c
        if func not in _DISPATCH_WATCHED or c._suppress:  # fast path: almost every op
            return func(*args, **kwargs)
        op = _DISPATCH_SYNCS.get(func)
        dev = _tensor_device(args, kwargs)
        if func is aten.index.Tensor:
            idx = args[1] if len(args) > 1 else []
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx):
                op = "bool_mask_index"
        elif func is aten.repeat_interleave.Tensor:
            if kwargs.get("output_size") is None:
                op = "repeat_interleave"
        elif func in (aten._to_copy.default, aten.copy_.default):
            op, dev = _blocking_h2d(func, args, kwargs)
        if op and c._on_device(dev):
            c.hit(op, args[0] if args and isinstance(args[0], torch.Tensor) else None)
        return func(*args, **kwargs)


def _blocking_h2d(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str | None, torch.device | None]:
    """A host-to-device copy from pageable memory blocks the host until the copy is done."""
    if func is aten._to_copy.default:
        src, dst_dev = args[0], kwargs.get("device")
        non_blocking = kwargs.get("non_blocking", False)
    else:
        dst, src = args[0], args[1]
        dst_dev = dst.device
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    if dst_dev is None or src.device.type != "cpu":
        return None, None
    dst_dev = torch.device(dst_dev)
    if dst_dev.type in ("cpu", "meta"):
        return None, None
    if non_blocking and src.is_pinned():
        return None, None
    return ("h2d_pageable" if not src.is_pinned() else "h2d_blocking"), dst_dev


@contextlib.contextmanager
def count_syncs(device: DeviceLike = None) -> Iterator[_SyncResultProxy]:
    """Count host-device synchronisations inside the block.

    With ``device`` None or a CPU device, CPU tensors stand in for accelerator tensors, so a
    CPU-only run gives the count the same code would have on a GPU. With a CUDA device only
    operations on non-CPU tensors count (host reads of host tensors are free). Adam's reads of
    its CPU ``step`` tensors inside ``optimizer.step()`` are not syncs and are not counted.
    """
    cpu_is_device = device is None or torch.device(device).type == "cpu"
    counter = SyncCounter(cpu_is_device)
    proxy = _SyncResultProxy(counter)
    h1 = register_optimizer_step_pre_hook(counter._pre_step)
    h2 = register_optimizer_step_post_hook(counter._post_step)
    try:
        with _SyncFunctionMode(counter), _SyncDispatchMode(counter):
            yield proxy
    finally:
        h1.remove()
        h2.remove()
        proxy._final = counter.result()


class _Live:
    """Base of the objects a ``with`` block yields: live while inside, frozen after."""

    _final: Any = None

    def result(self) -> Any:
        """The frozen result (available after the block ends)."""
        if self._final is None:
            raise RuntimeError("the result is available once the with-block has ended")
        return self._final

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._snapshot(), name)

    def _snapshot(self) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return repr(self._snapshot())


class _SyncResultProxy(_Live):
    def __init__(self, counter: SyncCounter) -> None:
        self._counter = counter

    def _snapshot(self) -> SyncCount:
        return self._final if self._final is not None else self._counter.result()


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


# --------------------------------------------------------------------------------------------
# transfers


@dataclass(frozen=True)
class TransferCount:
    """Copies between host and device memory seen in the block."""

    h2d_copies: int
    h2d_bytes: int
    d2h_copies: int
    d2h_bytes: int
    pinned_h2d_copies: int
    pageable_h2d_copies: int
    non_blocking_h2d_copies: int


class _TransferMode(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.c: Counter[str] = Counter()

    def _note(self, src: torch.Tensor, dst_dev: torch.device, non_blocking: bool) -> None:
        s, d = src.device.type, dst_dev.type
        if s == d:
            return
        nbytes = src.numel() * src.element_size()
        if s == "cpu":
            self.c["h2d_copies"] += 1
            self.c["h2d_bytes"] += nbytes
            pinned = src.is_pinned()
            self.c["pinned_h2d_copies" if pinned else "pageable_h2d_copies"] += 1
            if non_blocking:
                self.c["non_blocking_h2d_copies"] += 1
        elif d == "cpu":
            self.c["d2h_copies"] += 1
            self.c["d2h_bytes"] += nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._to_copy.default and kwargs.get("device") is not None:
            self._note(args[0], torch.device(kwargs["device"]), bool(kwargs.get("non_blocking")))
        elif func is aten.copy_.default:
            nb = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            self._note(args[1], args[0].device, bool(nb))
        return func(*args, **kwargs)

    def result(self) -> TransferCount:
        return TransferCount(**{k: int(self.c[k]) for k in TransferCount.__dataclass_fields__})


class _TransferProxy(_Live):
    def __init__(self, mode: _TransferMode) -> None:
        self._mode = mode

    def _snapshot(self) -> TransferCount:
        return self._final if self._final is not None else self._mode.result()


@contextlib.contextmanager
def count_transfers() -> Iterator[_TransferProxy]:
    """Count host-to-device and device-to-host copies and bytes (pinned vs pageable).

    Any non-CPU device counts as the device side, ``meta`` included, which lets a CPU-only
    run check *how often* a loop moves data (the bytes are the tensor's size either way).
    """
    mode = _TransferMode()
    proxy = _TransferProxy(mode)
    try:
        with mode:
            yield proxy
    finally:
        proxy._final = mode.result()


# --------------------------------------------------------------------------------------------
# FLOPs


@dataclass(frozen=True)
class FlopCount:
    """FLOPs by ``torch.utils.flop_counter`` (matmuls, convolutions, attention; 2 per MAC)."""

    total: int
    by_op: dict[str, int]


class _FlopMode(TorchDispatchMode):
    """FlopCounterMode's own formulas (``flop_registry``) without its module tracker.

    FlopCounterMode also tracks the module hierarchy and tries to decompose every op without a
    formula; on a launch-bound loop that makes it 5x slower than the loop itself (measured:
    benchmarks/counter_overhead.py). Totals are identical on MLP, CNN (fp32 and autocast) and
    attention training steps (tests/harness/test_counters.py checks this).
    """

    def __init__(self) -> None:
        super().__init__()
        from torch.utils.flop_counter import flop_registry

        self.registry = flop_registry
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self.registry.get(func._overloadpacket)
        if formula is not None:
            self.by_op[func._overloadpacket.__name__] += int(formula(*args, **kwargs, out_val=out))
        return out

    def get_total_flops(self) -> int:
        return sum(self.by_op.values())

    def get_flop_counts(self) -> dict[str, dict[str, int]]:
        return {"Global": dict(self.by_op)}


class _FlopProxy(_Live):
    def __init__(self, mode: Any) -> None:
        self._mode = mode

    def _snapshot(self) -> FlopCount:
        if self._final is not None:
            return self._final
        counts = self._mode.get_flop_counts().get("Global", {})
        by = {str(getattr(k, "__name__", k)): int(v) for k, v in counts.items()}
        return FlopCount(int(self._mode.get_total_flops()), dict(sorted(by.items())))


@contextlib.contextmanager
def count_flops(decompose: bool = False) -> Iterator[_FlopProxy]:
    """FLOPs of the block, forward and backward, by ``torch.utils.flop_counter``'s formulas.

    ``decompose=True`` runs the full ``FlopCounterMode`` (quiet), which also decomposes ops
    that have no formula (custom ops) at several times the cost.
    """
    mode: Any
    if decompose:
        from torch.utils.flop_counter import FlopCounterMode

        mode = FlopCounterMode(display=False)
    else:
        mode = _FlopMode()
    proxy = _FlopProxy(mode)
    with mode:
        yield proxy
    proxy._final = proxy._snapshot()
