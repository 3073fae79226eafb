"""Modelled GPU time of a block on a named GPU (``perf.model_gpu_time``).

Why: a CPU-only CI box counts exactly what the code asks of the device on ``sim`` (ops,
bytes, FLOPs, syncs, copies) but cannot say what that costs on the GPU the team trains on. A
dispatch mode turns the op stream into :class:`~perf.instruments.gpu_timeline.OpEvent` s
(kernels with their FLOPs by ``torch.utils.flop_counter``'s formulas and the bytes of their
inputs and outputs, copies, syncs) and :func:`~perf.instruments.gpu_timeline.simulate` runs
the two-timeline model over them. The result is deterministic (same code and torch version:
same figures), so it gates like a count. Every figure is *modelled*, not measured
(docs/gpu-model.md).

Which ops launch a kernel is :func:`perf.instruments.launches.sim_op_launches`, the launch
model ``count_ops`` uses on ``sim``. Syncs on ``sim`` come from the device itself (the ones
``count_syncs`` counts); on ``cuda`` from the op stream (host reads, blocking copies, the
kernels that sync inside by :mod:`perf.sim.kernel_syncs`) and ``Stream.synchronize``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any, NamedTuple

import torch

from perf.instruments.gpu_targets import DEFAULT_TARGET, GpuTarget, get_target
from perf.instruments.gpu_timeline import GpuTime, OpEvent, simulate
from perf.instruments.launches import COPY_OPS, NO_LAUNCH_OPS, sim_op_launches
from perf.instruments.live import Live
from perf.instruments.modes import CountingDispatchMode, decomposed, device_test, flat_tensors
from perf.instruments.sites import SKIP_DIRS, frame_site
from perf.instruments.timing import DeviceLike
from perf.sim import tensors as simulated
from perf.sim.kernel_syncs import MODE_RULES, cuda_stream_syncs
from perf.sim.kernels import sync_listeners

aten = torch.ops.aten

#: Ops that run on tensor cores when their dtype has them (matmuls, convolutions, attention,
#: cuDNN's RNNs).
TENSOR_CORE_OPS = frozenset({
    "mm", "addmm", "addmm_", "bmm", "baddbmm", "baddbmm_", "addbmm", "matmul", "linear",
    "convolution",
    "convolution_backward", "_convolution", "cudnn_convolution",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
    "_flash_attention_backward", "_efficient_attention_forward", "_efficient_attention_backward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward", "_grouped_mm", "_cudnn_rnn",
    "_cudnn_rnn_backward", "_linear_cross_entropy_batch_chunked",
    "_linear_cross_entropy_batch_chunked_no_reduction", "_varlen_attn", "_varlen_attn_out",
    "_varlen_attn_backward", "flex_attention", "flex_attention_backward",
})  # fmt: skip
_DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
          torch.float64: "fp64"}  # fmt: skip
_COPIES = (aten._to_copy.default, aten.copy_.default)
_ITEM_OP = aten._local_scalar_dense.default
_COPY, _ITEM, _LIFT = 1, 2, 3  # _OpFacts.special


class _OpFacts(NamedTuple):
    """What the model needs to know about an op, found once per op."""

    func: Any  # held, so that its id stays its own
    name: str
    computes: bool  # launches a kernel (not a view, not in NO_LAUNCH_OPS)
    formula: Any  # torch.utils.flop_counter's, or None
    special: int  # _COPY, _ITEM, _LIFT or 0
    rule: Any  # kernel_syncs.MODE_RULES' rule off sim, else None
    copy_op: bool  # in launches.COPY_OPS
    allreduce: bool


_TENSOR_CORE_DTYPES = {torch.bfloat16, torch.float16}
_make_event = OpEvent._make


#: the ops cuDNN runs: their fp32 precision is ``torch.backends.cudnn``'s, not the matmuls'
_CUDNN_CONV_OPS = frozenset(
    {"convolution", "convolution_backward", "_convolution", "cudnn_convolution"}
)
_CUDNN_RNN_OPS = frozenset({"_cudnn_rnn", "_cudnn_rnn_backward"})


def tf32_ops() -> frozenset[str]:
    """The matmul-class ops that run fp32 on TF32 tensor cores now (the current API, never
    ``allow_tf32``): matmuls where ``torch.backends.cuda.matmul.fp32_precision`` is ``"tf32"``
    (not by default), cuDNN's convolutions and RNNs where ``torch.backends.cudnn.conv`` /
    ``.rnn``'s is (by default: cuDNN has always allowed TF32)."""
    on: set[str] = set()
    if str(torch.backends.cuda.matmul.fp32_precision) == "tf32":
        on |= TENSOR_CORE_OPS - _CUDNN_CONV_OPS - _CUDNN_RNN_OPS
    cudnn: Any = torch.backends.cudnn
    for part, ops in (("conv", _CUDNN_CONV_OPS), ("rnn", _CUDNN_RNN_OPS)):
        precision = getattr(getattr(cudnn, part, None), "fp32_precision", None)
        if precision is None:  # a torch before the fp32_precision API
            precision = "tf32" if cudnn.allow_tf32 else "ieee"
        if str(precision) == "tf32":
            on |= ops
    return frozenset(on)


def peak_for(op: str, dtype: torch.dtype | None, tf32: frozenset[str]) -> str:
    """The peak a kernel runs at: a tensor-core dtype for matmul-class ops in bf16 / fp16 (and
    fp32 where ``tf32`` holds the op), ``"fp32"`` (CUDA cores) for everything else."""
    if dtype is torch.float32 and op in tf32:
        return "tf32"
    if op not in TENSOR_CORE_OPS or dtype not in _TENSOR_CORE_DTYPES:
        return "fp32"
    return _DTYPE[dtype]


def _key(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


def _shapes(x: Any) -> Any:
    """``torch.utils.flop_counter.shape_wrapper``'s mapping (tensor -> its shape), without the
    general pytree walk that costs more than the formula."""
    if isinstance(x, torch.Tensor):
        return x.shape
    if isinstance(x, (list, tuple)):
        return type(x)(_shapes(a) for a in x) if type(x) in (list, tuple) else x
    if isinstance(x, dict):
        return {k: _shapes(v) for k, v in x.items()}
    return x


def _shape_key(x: Any) -> Any:
    """A hashable key that determines :func:`_shapes` of ``x`` exactly (types included: a
    formula could tell a list from a tuple), made in one walk; ``TypeError`` where that is
    not sure (an object whose hash is its id)."""
    if isinstance(x, torch.Tensor):
        return (torch.Size, tuple(x.shape))  # _shapes gives its torch.Size
    t = type(x)
    if t is list or t is tuple:
        return (t, tuple([_shape_key(a) for a in x]))
    if t is dict:
        return (t, tuple([(k, _shape_key(v)) for k, v in x.items()]))
    if t is torch.Size:
        return (t, tuple(x))
    if t in _PLAIN:
        return (t, x)
    raise TypeError(t)


def _plain_key(func_id: int, args: Any, out: Any) -> tuple[Any, ...] | None:
    """The FLOPs cache key of the common call (tensors and plain scalars in, one tensor out,
    no keyword arguments) in one flat pass, not :func:`_shape_key`'s nested one: each
    tensor's ``torch.Size`` (all ints), each scalar as ``(type, value)`` (never equal to a
    size); None otherwise. One op's positions have one schema, and the length tells the
    argument counts apart."""
    if type(out) is not torch.Tensor:
        return None
    key: list[Any] = [func_id]
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append(a.shape)
        elif type(a) in _PLAIN:
            key.append((type(a), a))
        else:
            return None
    key.append(out.shape)
    return tuple(key)


_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                    torch.memory_format})  # fmt: skip


def _users_file(path: str) -> bool:
    """The rule of :func:`perf.instruments.sites.user_site`: not torch's, perf's, torch.fx's
    generated code or Inductor's cached wrappers."""
    return not (
        path.startswith(SKIP_DIRS)
        or path.startswith("<eval_with_key>")
        or (os.sep + "torchinductor_" in path)
    )


class GpuModelMode(CountingDispatchMode):
    """Turns the dispatched ops on ``device_type`` into model events (see module docstring).

    Per op it does what ``count_ops`` on sim and ``count_flops`` do, on one pass over the
    arguments, with the op's facts and each source line's site cached: the model must cost
    little next to the simulated run it rides on (benchmarks/model_overhead.py).
    """

    def __init__(self, device_type: str) -> None:
        super().__init__()
        from perf.instruments.flops import custom_op_formula, flop_formulas

        self.device_type = device_type
        #: whether a tensor is on the modelled device
        self._on = device_test(device_type)
        self.flops = flop_formulas()
        self._custom_formula = custom_op_formula  # a custom op's, when it first runs
        self.events: list[OpEvent] = []
        self.site_info: dict[str, tuple[str, str]] = {}
        self.pending: set[int] = set()  # buffers an async copy fills
        self.tf32 = tf32_ops()
        self._depth = 0
        self._held: list[OpEvent] = []
        self._ops: dict[int, _OpFacts] = {}  # id(func) -> its facts
        #: (id(func), its arguments' shapes) -> FLOPs: a formula is a function of the shapes,
        #: and some are slow (addmm's calls mm's through torch's pytree shape wrapper)
        self._flops: dict[tuple[int, Any], int] = {}
        self._users: dict[str, bool] = {}  # file -> is it the user's
        self._sites: dict[tuple[str, int], str] = {}

    def _site(self) -> str:
        f: FrameType | None = sys._getframe(2)
        users = self._users
        while f is not None:
            path = f.f_code.co_filename
            mine = users.get(path)
            if mine is None:
                mine = users[path] = _users_file(path)
            if mine:
                break
            f = f.f_back
        if f is None:
            return "<unknown>"
        key = (f.f_code.co_filename, f.f_lineno)
        site = self._sites.get(key)
        if site is None:
            site, fn, code = frame_site(key[0], key[1], f.f_code.co_name)
            self._sites[key] = site
            self.site_info.setdefault(site, (fn, code))
        return site

    def sync(self, name: str) -> None:
        """A sync (from the simulated device or a CUDA stream): drains the queue."""
        ev = OpEvent("sync", name, self._site())
        if self._depth:
            self._held.append(ev)  # inside an op: after the op's own event
        else:
            self.events.append(ev)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = decomposed(self, func, args, kwargs)  # linear, to() under inference_mode
        if out is not NotImplemented:
            return out
        self._depth += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self._depth -= 1
        ev = self._event(func, args, kwargs, out)
        if ev is not None:
            self.events.append(ev)
        if self._held:
            self.events.extend(self._held)
            self._held.clear()
        return out

    def higher_order(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """One kernel (FlexAttention: CUDA's fused one), with torch's formula's FLOPs."""
        self._depth += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self._depth -= 1
        if id(func) not in self._ops:
            formula = self.flops.get(func)
            self._ops[id(func)] = _OpFacts(func, func.name(), True, formula, 0, None, False, False)
        ev = self._event(func, args, kwargs, out)
        if ev is not None:
            self.events.append(ev)
        return out

    def _op(self, func: Any) -> _OpFacts:
        """The op's facts, once per op (keyed by ``id``: an ``OpOverload`` hashes in Python)."""
        name = str(func.overloadpacket.__name__)
        is_view = bool(getattr(func, "is_view", False))
        computes = not (is_view or name in NO_LAUNCH_OPS)
        formula = self.flops.get(func._overloadpacket) or self._custom_formula(func._overloadpacket)
        special = _COPY if func in _COPIES else _ITEM if func is _ITEM_OP else 0
        if func is aten.lift_fresh.default:
            special = _LIFT
        rule = MODE_RULES.get(func) if self.device_type != simulated.NAME else None
        allreduce = func.namespace == "c10d" and name.startswith("allreduce")
        info = self._ops[id(func)] = _OpFacts(
            func, name, computes, formula, special, rule, name in COPY_OPS, allreduce
        )
        return info

    def _event(self, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> OpEvent | None:
        info = self._ops.get(id(func))
        if info is None:
            info = self._op(func)
        name, computes, special, rule = info.name, info.computes, info.special, info.rule
        on = self._on
        if special == _COPY:
            ev = self._copy(func, name, args, kwargs, out)
            if ev is not None:
                return ev
        elif special == _LIFT:
            # Python data made into a device tensor (torch.tensor(list, device=dev), an index
            # from a list): tensor_new.cpp internal_new_from_data copied it from pageable host
            # memory, blocking, below this mode; lift_fresh of the result is what it sees
            t = args[0]
            if not on(t) or not t.numel():
                return None
            return OpEvent(
                "copy",
                name,
                self._site(),
                dtype=_DTYPE.get(t.dtype, ""),
                nbytes=t.numel() * t.element_size(),
                direction="h2d",
            )
        elif special == _ITEM and on(args[0]):
            # .item(): a device-to-host copy of one element, then the host reads it
            return OpEvent(
                "copy", name, self._site(), nbytes=args[0].element_size(), direction="d2h"
            )
        elif rule is not None:
            n = rule[1](args, kwargs, on)
            self._held.extend(OpEvent("sync", rule[0], self._site()) for _ in range(n))
        ins = flat_tensors(args, [])
        if kwargs:
            flat_tensors(kwargs, ins)
        outs = flat_tensors(out, [])
        on_device = False
        for t in ins:
            if on(t):
                on_device = True
                break
        else:
            for t in outs:
                if on(t):
                    on_device = True
                    break
            else:
                dev = kwargs.get("device")
                on_device = dev is not None and torch.device(dev).type == self.device_type
        if not on_device:
            return None
        if computes and info.copy_op:
            # the launch model's rule (sim_op_launches): a memcpy launches no kernel
            computes = sim_op_launches(name, False, args, kwargs, out, self.device_type)
        if not computes:
            return OpEvent("host", name, self._site())
        if info.allreduce:
            return self._allreduce(name, ins)
        return self._kernel(func, name, info.formula, args, kwargs, out, ins, outs)

    def _kernel(
        self,
        func: Any,
        name: str,
        formula: Any,
        args: Any,
        kwargs: dict[str, Any],
        out: Any,
        ins: list[torch.Tensor],
        outs: list[torch.Tensor],
    ) -> OpEvent:
        # each tensor once (an in-place op's output is its input), in order: inputs first
        tensors = {id(t): t for t in (*ins, *outs)}.values()
        try:
            nbytes = sum([t.nbytes for t in tensors])  # nbytes: numel() x element_size()
        except RuntimeError:  # a sparse tensor has no nbytes: its indices' and values'
            nbytes = sum([_nbytes(t) for t in tensors])
        dtype: torch.dtype | None = None
        for t in tensors:
            if t.is_floating_point():
                dtype = t.dtype
                break
        reads: list[int] = []
        pending = self.pending
        if pending:
            on = self._on
            reads = [k for t in tensors if on(t) and (k := _key(t)) in pending]
        flops = 0
        if formula is not None:
            raw = getattr(formula, "__wrapped__", None)  # the formula on shapes (shape_wrapper)
            if raw is not None:
                key: Any = None if kwargs else _plain_key(id(func), args, out)
                if key is None:
                    try:
                        key = (id(func), _shape_key(args), _shape_key(out), _shape_key(kwargs))
                    except TypeError:
                        key = None
                cached = self._flops.get(key) if key is not None else None
                if cached is None:
                    cached = int(raw(*_shapes(args), out_shape=_shapes(out), **_shapes(kwargs)))
                    if key is not None:
                        self._flops[key] = cached
                flops = cached
            else:
                flops = int(formula(*args, **kwargs, out_val=out))
        label = _DTYPE.get(dtype, str(dtype).replace("torch.", "")) if dtype else ""
        peak = peak_for(name, dtype, self.tf32)
        # every field in order (kind, name, site, dtype, flops, nbytes, peak, direction,
        # pinned, non_blocking, world_size, kernels, reads, writes): _make skips the keyword
        # parsing of the generated __new__
        return _make_event(
            ("kernel", name, self._site(), label, flops, nbytes, peak, "", False, False, 1, (),
             tuple(reads), None)
        )  # fmt: skip

    def _copy(
        self, func: Any, name: str, args: Any, kwargs: dict[str, Any], out: Any
    ) -> OpEvent | None:
        if func is aten._to_copy.default:
            src, dst = args[0], out
            non_blocking = bool(kwargs.get("non_blocking", False))
            if src.is_sparse and dst.is_sparse:
                # a sparse tensor's copy is its indices' copy, then its values'
                parts = ((src._indices(), dst._indices()), (src._values(), dst._values()))
                evs = [e for a, b in parts if (e := self._copy(func, name, (a,), kwargs, b))]
                self._held.extend(evs[1:])
                return evs[0] if evs else None
        else:
            dst, src = args[0], args[1]
            non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        s, d = src.device.type, dst.device.type
        if s == d or self.device_type not in (s, d) or not dst.numel():
            return None
        if s == "cpu":
            direction, host_side = "h2d", src
        elif d == "cpu":
            direction, host_side = "d2h", dst
        else:
            return None
        pinned = bool(host_side.is_pinned())
        ev = OpEvent(
            "copy",
            name,
            self._site(),
            dtype=_DTYPE.get(dst.dtype, ""),
            nbytes=dst.numel() * dst.element_size(),
            direction=direction,  # type: ignore[arg-type]
            pinned=pinned,
            non_blocking=non_blocking,
        )
        if direction == "h2d" and pinned and non_blocking:
            k = _key(dst)
            self.pending.add(k)
            ev = ev._replace(writes=k)
        return ev

    def _allreduce(self, name: str, ins: list[torch.Tensor]) -> OpEvent:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        nbytes = sum(t.numel() * t.element_size() for t in ins if self._on(t))
        return OpEvent("collective", name, self._site(), nbytes=nbytes, world_size=world)


def _nbytes(t: torch.Tensor) -> int:
    """The bytes a kernel moves for ``t``: a sparse COO tensor's are its indices and values."""
    if t.is_sparse:
        return t._indices().nbytes + t._values().nbytes
    return t.nbytes


class GpuTimeProxy(Live):
    """What ``with perf.model_gpu_time(...) as t`` yields: live inside the block (attributes
    model the events so far), frozen after (``t.result()``)."""

    _final: GpuTime | None

    def __init__(self, mode: GpuModelMode, target: GpuTarget) -> None:
        self._mode = mode
        self._target = target
        self._final = None

    def _snapshot(self) -> GpuTime:
        if self._final is not None:
            return self._final
        return simulate(self._mode.events, self._target, self._mode.site_info)

    @property
    def events(self) -> tuple[OpEvent, ...]:
        """The model's input: the block's op events, in program order."""
        return tuple(self._mode.events)


def _device_type(device: DeviceLike) -> str:
    if device is None:
        raise ValueError(
            "model_gpu_time needs the device the code runs on: perf.simulated_device() on a "
            "CPU-only box, or 'cuda:N'"
        )
    dev = torch.device(device)
    if dev.type not in (simulated.NAME, "cuda"):
        raise ValueError(
            f"model_gpu_time({str(dev)!r}): the model reads a device's op stream; run the code "
            "on perf.simulated_device() (CPU-only boxes) or on 'cuda:N'"
        )
    return dev.type


@contextlib.contextmanager
def model_gpu_time(
    device: DeviceLike, target: str | GpuTarget = DEFAULT_TARGET
) -> Iterator[GpuTimeProxy]:
    """Model the block's time on ``target`` (a name of :data:`~perf.instruments.gpu_targets.
    TARGETS` or a :class:`~perf.instruments.gpu_targets.GpuTarget`) from the ops it runs on
    ``device`` (``perf.simulated_device()`` or ``cuda:N``). ``t.result()`` (and ``t.total_s``
    ... after the block) is a frozen :class:`~perf.instruments.gpu_timeline.GpuTime`; every
    figure is modelled. Unknown targets raise ``ValueError`` listing the known ones."""
    tgt = get_target(target)
    dev_type = _device_type(device)
    mode = GpuModelMode(dev_type)
    proxy = GpuTimeProxy(mode, tgt)
    listeners = sync_listeners
    streams: Any = contextlib.nullcontext()
    if dev_type == simulated.NAME:
        listeners.append(mode.sync)
    elif torch.cuda.is_available():
        streams = cuda_stream_syncs(mode.sync)
    try:
        with streams, mode:
            yield proxy
    finally:
        if mode.sync in listeners:
            listeners.remove(mode.sync)
        proxy._final = simulate(mode.events, tgt, mode.site_info)
