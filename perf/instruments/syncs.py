"""Host-device synchronisations (``perf.count_syncs``).

A sync is what ``torch.cuda.set_sync_debug_mode("warn")`` flags on CUDA: a host read of device
memory (``.item()``, ``float``/``int``/``bool``/format of a device tensor, ``.tolist()``,
``.cpu()``), every blocking copy between host and device (``non_blocking=False``, both
directions; ``torch.tensor(data, device=dev)`` and an index from a Python list are one each,
seen on CUDA as ``lift_fresh`` of the copied tensor), ``Stream.synchronize()``, and the reads
CUDA kernels make inside an op (``nonzero``, boolean-mask indexing and assignment,
``repeat_interleave``, ``equal``, ``bincount`` ...), as often as the kernel makes them. A
``TorchDispatchMode`` sees the op but not the kernel's inner reads, so it counts them by the
rules of :mod:`perf.sim.kernel_syncs`, the table the simulated device uses too; host tensors
never count. A ``TorchFunctionMode`` names the Python-level call that caused each (``format``
for ``f"{loss:.3f}"``) and sees ``torch.tensor(data, device=dev)``, whose copy is dispatched
below Python modes. On a CPU-only box the device is ``perf.simulated_device()``, which gives the
counts of ``cuda:0`` (docs/sim.md, "Syncs, case by case").
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.overrides import TorchFunctionMode

from perf.instruments.live import Live
from perf.instruments.modes import (
    FUNCTION_MODES,
    CountingDispatchMode,
    decomposed,
    run_frames_eagerly,
)
from perf.instruments.sites import user_site as _user_site
from perf.instruments.timing import DeviceLike
from perf.sim.kernel_syncs import MODE_RULES, cuda_stream_syncs, host_scalar_setitem
from perf.sim.kernels import sync_listeners
from perf.sim.tensors import NAME as SIM_NAME

aten = torch.ops.aten

# --------------------------------------------------------------------------------------------
# syncs


@dataclass(frozen=True)
class SyncCount:
    """Host-device synchronisations counted in a block.

    ``by_op`` says which call caused each; ``by_site`` where: the first frame outside torch and
    perf, ``"path.py:88"`` (relative to the working directory where it is inside it), with that
    frame's function in ``site_function`` and its source line in ``site_code``.
    """

    count: int
    by_op: dict[str, int]
    by_site: dict[str, int] = field(default_factory=dict)
    site_function: dict[str, str] = field(default_factory=dict)
    site_code: dict[str, str] = field(default_factory=dict)
    #: Stand-in mode only: optimizer reads of CPU ``step`` tensors seen and not counted.
    ignored_optimizer_steps: int = 0

    @property
    def sites(self) -> dict[str, dict[str, Any]]:
        """JSON-ready sites for a metric's extra data, which the gate uses to name new sites:
        ``perf_metrics.record("syncs", s.count, "syncs", sync_sites=s.sites)``."""
        fn, code = self.site_function, self.site_code
        return {
            k: {"n": n, "function": fn.get(k, ""), "code": code.get(k, "")}
            for k, n in self.by_site.items()
        }


#: Python-level calls that read a tensor on the host; a sync inside one is named after it.
_FUNC_LABELS: dict[Any, str] = {
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
#: Factories that copy host data to ``device=`` below the Python dispatch modes.
FACTORIES: dict[Any, str] = {torch.tensor: "torch.tensor", torch.as_tensor: "torch.as_tensor"}

# The ops whose CUDA kernel syncs, and how often, are one shared table (perf.sim.kernel_syncs).
# Not syncs, by design: nonzero_static (static size), repeat_interleave with output_size,
# non_blocking copies (CUDA's sync debug mode does not flag them, pinned or not).

_FUNC_WATCHED = frozenset([*_FUNC_LABELS, *FACTORIES, torch.Tensor.to])
_DISPATCH_WATCHED = frozenset(
    [*MODE_RULES, aten._to_copy.default, aten.copy_.default, aten.lift_fresh.default]
)


def _first_tensor(
    args: tuple[Any, ...], kwargs: dict[str, Any] | None, keep: Any = None
) -> torch.Tensor | None:
    """The first tensor argument (for which ``keep(tensor)`` holds, if given)."""
    for a in (*args, *(kwargs or {}).values()):
        for b in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(b, torch.Tensor) and (keep is None or keep(b)):
                return b
    return None


class SyncCounter:
    """The tally behind ``count_syncs``; see there for what counts."""

    def __init__(self, device_type: str | None, host_as_device: bool) -> None:
        self.device_type = device_type
        self.host_as_device = host_as_device
        self.by_op: Counter[str] = Counter()
        self.by_site: Counter[str] = Counter()
        self.site_info: dict[str, tuple[str, str]] = {}  # site -> (function, source line)
        self.label: str | None = None  # the Python-level call being run, if any
        self.op_label: str | None = None  # the sync-causing aten op being run, if any
        #: device types whose backend reports its own syncs (the simulated device)
        self.backend_types: frozenset[str] = frozenset()
        self._suppress = 0  # stand-in mode: >0 inside a counted Python-level call
        self._in_step = 0  # stand-in mode: >0 inside optimizer.step()
        self._step_pending: list[tuple[int, str, str]] = []
        self._ignored = 0

    def on_device(self, dev: torch.device | None) -> bool:
        if dev is None or dev.type == "meta":
            return False
        if dev.type == "cpu":
            return self.host_as_device
        return self.device_type is None or dev.type == self.device_type

    def backend_hit(self, name: str) -> None:
        """A sync reported by the simulated device itself (seen even where modes are off)."""
        if self.device_type in (None, SIM_NAME):
            self.hit(self.label or self.op_label or name)

    def hit(self, op: str, tensor: torch.Tensor | None = None) -> None:
        site, function, code = _user_site()
        self.site_info.setdefault(site, (function, code))
        if self._in_step and tensor is not None and op == "item":
            self._step_pending.append((id(tensor), op, site))
            return
        self._add(op, site)

    def _add(self, op: str, site: str) -> None:
        self.by_op[op] += 1
        self.by_site[site] += 1

    # Stand-in mode only (host_as_device): Adam/AdamW read their CPU `step` tensors with
    # .item() inside step(); those reads are held back and dropped once step() returns.
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
        for tid, op, site in self._step_pending:
            if tid in step_ids:
                self._ignored += 1
            else:
                self._add(op, site)
        self._step_pending.clear()

    def result(self) -> SyncCount:
        by_op = {k: v for k, v in sorted(self.by_op.items()) if v}
        by_site = {k: v for k, v in sorted(self.by_site.items()) if v}
        return SyncCount(
            sum(by_op.values()),
            by_op,
            by_site,
            {k: self.site_info[k][0] for k in by_site},
            {k: self.site_info[k][1] for k in by_site},
            self._ignored,
        )


def _to_target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    target = kwargs.get("device")
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            target = a
        elif isinstance(a, torch.Tensor):
            target = a.device
    return None if target is None else torch.device(target)


class _SyncFunctionMode(TorchFunctionMode):
    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.c = counter

    def __enter__(self) -> Any:
        # At run time, between the graphs of compiled code, Dynamo's eval-frame callback is on:
        # this method's frame (and perf's code it calls) would be compiled as a frame of the
        # program. Marked, as the dispatch modes' frames are (perf.instruments.modes); Dynamo
        # still inlines it while it traces code compiled inside the block.
        run_frames_eagerly(type(self).__torch_function__.__code__)  # each time: a reset forgets
        return super().__enter__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__setitem__:  # looked up each time: sim patches it
            return _setitem(func, args, kwargs)
        if func not in _FUNC_WATCHED:  # fast path: almost every call
            return func(*args, **kwargs)
        c = self.c
        if c.label is not None or c._suppress:  # inside a labelled call: the outer one names it
            return func(*args, **kwargs)
        if func in FACTORIES:
            dev = kwargs.get("device")
            data = args[0] if args else kwargs.get("data")
            if dev is not None and not isinstance(data, torch.Tensor):
                # host data -> device, blocking: the simulated device reports its own copy,
                # the dispatch mode sees it on CUDA (lift_fresh, or numpy data's _to_copy);
                # either way it is named after this call
                c.label = FACTORIES[func]
                try:
                    return func(*args, **kwargs)
                finally:
                    c.label = None
            return func(*args, **kwargs)
        t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if func is torch.Tensor.to:
            target = _to_target(args, kwargs)
            label = "to_cpu" if target is not None and target.type == "cpu" else None
        else:
            label = _FUNC_LABELS[func]
        if label is None or t is None or not c.on_device(t.device):
            return func(*args, **kwargs)
        if c.host_as_device:
            # Stand-in mode: the call itself is the sync (on CPU tensors .cpu(), .tolist(),
            # .numpy() dispatch nothing), counted once whatever it does inside.
            if func is torch.Tensor.to and kwargs.get("non_blocking"):
                return func(*args, **kwargs)
            c.hit(label, t)
            c._suppress += 1
            try:
                return func(*args, **kwargs)
            finally:
                c._suppress -= 1
        c.label = label
        before = sum(c.by_op.values())
        try:
            return func(*args, **kwargs)
        finally:
            c.label = None
            if (
                label == "format"
                and sum(c.by_op.values()) == before
                and t.device.type not in c.backend_types
            ):
                # Printing a tensor reads it with Python dispatch modes off: on CUDA count the
                # one read we know of (a lower bound); the simulated device sees them all.
                c.hit(label, t)


#: TorchDynamo guards on it: perf.instruments.compiles sets apart the recompiles it causes
FUNCTION_MODES.append(_SyncFunctionMode)


class _SyncDispatchMode(CountingDispatchMode):
    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.c = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = decomposed(self, func, args, kwargs)  # to() / item() under inference_mode
        if out is not NotImplemented:
            return out
        c = self.c
        if func not in _DISPATCH_WATCHED or c._suppress:  # fast path: almost every op
            return func(*args, **kwargs)
        if func is aten.lift_fresh.default:
            # Python data made into a device tensor (torch.tensor(list, device=dev),
            # x.new_tensor(list), an index from a list or range: x[[0, 1]]): tensor_new.cpp
            # internal_new_from_data copied it from the host with non_blocking=False, below the
            # Python modes; lift_fresh of the result is what this mode sees (no copy: empty).
            t = args[0]
            if (
                not c.host_as_device
                and not t.is_cpu
                and t.device.type not in c.backend_types
                and c.on_device(t.device)
                and t.numel()
            ):
                c.hit(c.label or "h2d_copy", t)
            return func(*args, **kwargs)
        rule = MODE_RULES.get(func)
        if rule is not None:  # an op whose CUDA kernel syncs inside (shared with sim);
            # any device operand makes it a device op (linspace(cpu_start, cuda_end))
            op, t = rule[0], _first_tensor(args, kwargs, lambda x: c.on_device(x.device))
        else:
            op, t = _blocking_copy(func, args, kwargs, c)
        if not op or t is None or not c.on_device(t.device):
            return func(*args, **kwargs)
        if t.device.type in c.backend_types:  # the device reports it; name it after this op
            c.op_label = op
            try:
                return func(*args, **kwargs)
            finally:
                c.op_label = None
        if rule is not None:
            n = rule[1](args, kwargs, lambda x: c.on_device(x.device))
        elif args[0].is_sparse:  # a sparse tensor's _to_copy: its indices, then its values
            n = sum(1 for p in (args[0]._indices(), args[0]._values()) if p.numel())
        else:
            n = 1
        for _ in range(n):
            c.hit(c.label or op, t)
        return func(*args, **kwargs)


def _setitem(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``x[i] = 0.0``: CUDA makes the Python number a host scalar (see kernel_syncs)."""
    if len(args) > 2 and isinstance(args[2], (bool, int, float, complex)):
        host_scalar_setitem[0] += 1
        try:
            return func(*args, **kwargs)
        finally:
            host_scalar_setitem[0] -= 1
    return func(*args, **kwargs)


def _blocking_copy(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], c: SyncCounter
) -> tuple[str | None, torch.Tensor | None]:
    """A copy between host and device with ``non_blocking=False`` waits for the device.

    Returns the sync's name and the device-side tensor (the source for a device-to-host copy;
    for host-to-device, a stand-in carrying the target device)."""
    if c.host_as_device:
        return None, None  # no host side exists in stand-in mode
    if func is aten._to_copy.default:
        src, dst_dev = args[0], kwargs.get("device")
        non_blocking = kwargs.get("non_blocking", False)
        if dst_dev is None:
            return None, None
        dst_dev = torch.device(dst_dev)
    else:
        dst, src = args[0], args[1]
        dst_dev = dst.device
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    n = (src if func is aten._to_copy.default else dst).numel()  # Copy.cpp: 0 returns early
    if non_blocking or src.device.type == dst_dev.type or n == 0:
        return None, None
    if dst_dev.type == "cpu":
        return "d2h_copy", src
    if src.device.type == "cpu":
        # no device tensor exists yet: a stand-in that carries the target device for on_device
        return "h2d_copy", SimpleNamespace(device=dst_dev)  # type: ignore[return-value]
    return None, None  # device to device


@contextlib.contextmanager
def count_syncs(
    device: DeviceLike = None, *, host_as_device: bool = False
) -> Iterator[_SyncResultProxy]:
    """Count host-device synchronisations inside the block (see the module docstring).

    ``device`` limits the count to one device type (``"cuda"``, ``perf.simulated_device()``);
    None counts every accelerator. Host tensors never count: on a CPU-only box, run the code on
    ``perf.simulated_device()``. ``host_as_device=True`` is the old stand-in mode, in which CPU
    tensors count as device tensors: it overcounts real code 10x-100x (gradient clipping,
    samplers, host-side batch building and loss buffers are counted) and is kept only for
    toy loops that hold everything in CPU tensors.
    """
    dev_type = None if device is None else torch.device(device).type
    if dev_type == "cpu" and not host_as_device:
        raise ValueError(
            "count_syncs('cpu'): the CPU is the host, there are no host-device syncs on it; "
            "run the code on perf.simulated_device() (or cuda) and count there, or pass "
            "host_as_device=True for the stand-in mode that overcounts real code"
        )
    counter = SyncCounter(None if dev_type == "cpu" else dev_type, host_as_device)
    proxy = _SyncResultProxy(counter)
    hooks = []
    listeners = sync_listeners
    if host_as_device:
        hooks = [
            register_optimizer_step_pre_hook(counter._pre_step),
            register_optimizer_step_post_hook(counter._post_step),
        ]
    else:
        counter.backend_types = frozenset([SIM_NAME])
        listeners.append(counter.backend_hit)
    # The simulated device reports its own syncs: without another accelerator in the process
    # (or a filter naming one), the per-op dispatch mode has nothing to add and is skipped.
    others = (
        host_as_device
        or dev_type not in (None, SIM_NAME)
        or (dev_type is None and torch.cuda.is_available())
    )
    dispatch_mode: Any = _SyncDispatchMode(counter) if others else contextlib.nullcontext()
    cuda = dev_type in (None, "cuda") and not host_as_device and torch.cuda.is_available()
    streams: Any = cuda_stream_syncs(counter.hit) if cuda else contextlib.nullcontext()
    try:
        with _SyncFunctionMode(counter), dispatch_mode, streams:
            yield proxy
    finally:
        for h in hooks:
            h.remove()
        if counter.backend_hit in listeners:
            listeners.remove(counter.backend_hit)
        proxy._final = counter.result()


@contextlib.contextmanager
def dispatch_side(device: str | torch.device) -> Iterator[SyncCounter]:
    """``count_syncs``' CUDA side, run on another device's tensors: its function and dispatch
    modes and the kernel rules, with no device reporting its own syncs.

    Why: what counts on ``cuda:0`` can then be checked on ``sim`` tensors, which have a host
    side (host operands, copies, ``torch.tensor(..., device=dev)``), against what ``sim``'s
    device counts (``tests/harness/test_sim_sync_cases.py``,
    ``benchmarks/sync_rules_xcheck.py``). The counter's ``by_op`` holds the counts."""
    counter = SyncCounter(torch.device(device).type, False)
    with _SyncFunctionMode(counter), _SyncDispatchMode(counter):
        yield counter


class _SyncResultProxy(Live):
    def __init__(self, counter: SyncCounter) -> None:
        self._counter = counter

    def _snapshot(self) -> SyncCount:
        return self._final if self._final is not None else self._counter.result()
