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
import warnings
from collections.abc import Iterator
from types import FrameType
from typing import Any, NamedTuple

import torch

from perf.instruments.gpu_targets import DEFAULT_TARGET, GpuTarget, get_target
from perf.instruments.gpu_timeline import GpuTime, OpEvent, simulate
from perf.instruments.launches import COPY_OPS, NO_LAUNCH_OPS, sim_op_launches
from perf.instruments.live import Live
from perf.instruments.modes import (
    CountingDispatchMode,
    autograd_decomposes,
    decomposed,
    device_test,
    flat_tensors,
    run_decomposition,
)
from perf.instruments.sites import SKIP_DIRS, frame_site
from perf.instruments.timing import DeviceLike
from perf.sim import tensors as simulated
from perf.sim.kernel_syncs import MODE_RULES, cuda_stream_syncs
from perf.sim.kernels import collective_listeners, sync_listeners

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
_COPY, _ITEM, _LIFT, _DETACH = 1, 2, 3, 4  # _OpFacts.special
_AD_INPLACE_OR_VIEW = torch._C.DispatchKey.ADInplaceOrView
_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded


def mode_made(func: Any) -> bool:
    """Whether this ``detach`` reaching a dispatch mode is one the mode itself caused.

    Why: while a mode is on, torch sends it a ``detach`` wherever a tensor is shallow-copied
    (``TensorImpl::shallow_copy_and_detach``: each output autograd saves for backward,
    ``.data``); without a mode nothing is dispatched there. Such a call comes from autograd's
    own code, outside its kernels, so the ``ADInplaceOrView`` key is not excluded; a
    ``detach`` the program dispatches reaches the mode from below that key's kernel (or
    under ``inference_mode``), where it is. (Under ``inference_mode`` a ``.data`` is taken
    for the program's.)"""
    return func is aten.detach.default and not _excluded(_AD_INPLACE_OR_VIEW)


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

    def take(self) -> None:
        """Bring :attr:`events` up to date (the dispatch mode appends as it goes)."""

    def sync(self, name: str) -> None:
        """A sync (from the simulated device or a CUDA stream): drains the queue."""
        self._add(OpEvent("sync", name, self._site()))

    def collective(self, name: str, tensors: list[torch.Tensor], world_size: int) -> None:
        """A collective of ``sim``'s process group (perf.sim.distributed), which is Python and
        dispatches no op: an all-reduce is modelled (ring), as ``c10d``'s op is on CUDA."""
        if not name.startswith("allreduce"):
            return
        nbytes = sum(t.numel() * t.element_size() for t in tensors if self._on(t))
        if nbytes:
            ev = OpEvent("collective", name, self._site(), nbytes=nbytes, world_size=world_size)
            self._add(ev)

    def _add(self, ev: OpEvent) -> None:
        if _COMPILES.depth:  # Dynamo compiling: not a step of the program
            return
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
        self._hop_facts(func)
        ev = self._event(func, args, kwargs, out)
        if ev is not None:
            self.events.append(ev)
        if self._held:  # the syncs inside it, after it (not after the next op)
            self.events.extend(self._held)
            self._held.clear()
        return out

    def _hop_facts(self, func: Any) -> None:
        """A higher-order operator's facts: one kernel, with torch's formula's FLOPs."""
        if id(func) not in self._ops:
            formula = self.flops.get(func)
            self._ops[id(func)] = _OpFacts(func, func.name(), True, formula, 0, None, False, False)

    def _op(self, func: Any) -> _OpFacts:
        """The op's facts, once per op (keyed by ``id``: an ``OpOverload`` hashes in Python)."""
        name = str(func.overloadpacket.__name__)
        is_view = bool(getattr(func, "is_view", False))
        computes = not (is_view or name in NO_LAUNCH_OPS)
        formula = self.flops.get(func._overloadpacket) or self._custom_formula(func._overloadpacket)
        special = _COPY if func in _COPIES else _ITEM if func is _ITEM_OP else 0
        if func is aten.lift_fresh.default:
            special = _LIFT
        elif func is aten.detach.default:
            special = _DETACH
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
        elif special == _DETACH and mode_made(func):
            return None  # not the program's: no CUDA run dispatches it
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


_RUN, _EVENT, _FAST = 2, 1, 0  # the recorder's routes (perf/sim/native/sim_native.cpp)


class _Tables:
    """What the recorder's C++ caches refer to by index, kept from block to block (so that a
    block pays no set-up per op): each op's route and name, each file's user test, each
    source line's site. Reset with the C++ caches when what an op's route depends on changes
    (the sim devices, the FLOPs formulas)."""

    def __init__(self) -> None:
        self.key: Any = None
        self.names: list[str] = []
        self.sites: list[str] = []
        self.site_info: list[tuple[str, str]] = []
        self.site_ids: dict[str, int] = {}
        self.by_line: dict[tuple[str, int], str] = {}
        self.users: dict[str, bool] = {}
        self.facts: GpuModelMode | None = None

    def current(self) -> bool:
        """Whether the C++ caches made for these tables still hold (else: both reset)."""
        from torch.utils.flop_counter import flop_registry

        from perf.instruments.flops import CUSTOM_OP_FORMULAS

        key = (simulated.SIM_DEVICES, tuple(flop_registry), tuple(CUSTOM_OP_FORMULAS))
        if key == self.key and self.facts is not None:
            return True
        self.__init__()  # type: ignore[misc]
        self.key = key
        self.facts = GpuModelMode(simulated.NAME)
        return False

    def classify(self, name: str, overload: str) -> tuple[int, bool, bool, int, Any]:
        ns, _, op = name.partition("::")
        func = getattr(getattr(getattr(torch.ops, ns), op), overload or "default")
        assert self.facts is not None
        info = self.facts._ops.get(id(func)) or self.facts._op(func)
        self.names.append(info.name)
        index = len(self.names) - 1
        if autograd_decomposes(func):
            return _RUN, False, False, index, func
        formula = info.formula
        shaped = formula is not None and getattr(formula, "__wrapped__", None) is not None
        special = info.special not in (0, _DETACH)  # the recorder sees no mode's detach
        if (special or info.copy_op or info.allreduce or info.rule is not None
                or (formula is not None and not shaped)):  # fmt: skip
            return _EVENT, info.computes, False, index, func
        return _FAST, info.computes, shaped, index, func

    def user_file(self, path: str) -> bool:
        mine = self.users.get(path)
        if mine is None:
            mine = self.users[path] = _users_file(path)
        return mine

    def site_id(self, path: str, line: int, code_name: str) -> int:
        site = self.by_line.get((path, line))
        info: tuple[str, str] = ("", "")
        if site is None:  # as GpuModelMode._site: the first code name seen on the line
            site, fn, code = frame_site(path, line, code_name)
            self.by_line[(path, line)] = site
            info = (fn, code)
        index = self.site_ids.get(site)
        if index is None:
            index = self.site_ids[site] = len(self.sites)
            self.sites.append(site)
            self.site_info.append(info)
        return index


_TABLES = _Tables()


def _py_event(func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> Any:
    assert _active is not None
    return _active.py_event(func, args, kwargs, out)


class NativeGpuModel(GpuModelMode):
    """The same events from ``sim``'s C++ recorder (:mod:`perf.sim.native`), not a dispatch
    mode.

    Why: a Python dispatch mode's floor, the call into Python and back per op, cost more than
    ``sim``'s whole op on its C++ path (benchmarks/model_overhead.py). The recorder sees each
    op where this mode would, runs it, and logs a row (op, site, dtype, FLOPs, bytes) for the
    common kernel or host op; the rest comes back here, to :meth:`GpuModelMode._event`:
    copies, scalar reads, collectives, sparse tensors, decompositions, and a FLOPs formula's
    first call with each set of shapes (cached in C++ after). Rows become the same
    :class:`OpEvent` s the mode makes (tests/harness/test_gpu_model_recorder.py)."""

    def __init__(self, native: Any) -> None:
        super().__init__(simulated.NAME)
        self._native = native
        self._labels: dict[tuple[int, Any], tuple[str, str]] = {}
        self._made: dict[tuple[Any, ...], OpEvent] = {}

    def start(self) -> None:
        """Start the recorder (its caches kept where :data:`_TABLES` still hold)."""
        t = _TABLES
        keep = t.current()
        # a composite op the mode would decompose runs as it does, the recorder on for its parts
        callbacks = (t.classify, _py_event, run_decomposition, t.site_id, t.user_file)
        self._native.rec_start(callbacks, keep)

    def py_event(
        self, func: Any, args: Any, kwargs: dict[str, Any], out: Any
    ) -> tuple[OpEvent | None, list[OpEvent]]:
        """The op's event, and the events :meth:`_event` held for after the op's syncs."""
        ev = self._event(func, args, kwargs, out)
        after = self._held[:]
        self._held.clear()
        if self.pending:
            self._native.rec_pending(True)
        return ev, after

    def _add(self, ev: OpEvent) -> None:
        if not _COMPILES.depth:  # Dynamo compiling: not a step of the program
            self._native.rec_event(ev)

    def hop(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """A higher-order operator, as the mode's ``__torch_dispatch__`` takes it
        (:func:`perf.instruments.modes._higher_order`): ``torch.cond``'s taken branch is
        recorded op by op, any other is one kernel (:meth:`GpuModelMode.higher_order`)."""
        native = self._native
        if func.name() == "cond" and len(args) == 4 and not kwargs:
            pred, true_fn, false_fn, operands = args
            return (true_fn if pred else false_fn)(*operands)
        native.rec_depth(1)
        try:
            out = native.rec_unseen(func, tuple(args), kwargs)
        finally:
            native.rec_depth(-1)
        self._hop_facts(func)
        ev = native.rec_unseen(self._event, (func, args, kwargs, out), {})
        native.rec_done([] if ev is None else [ev])
        return out

    def take(self) -> None:
        """Move the recorder's rows so far into :attr:`events`, as events."""
        t = _TABLES
        names, sites, labels, tf32 = t.names, t.sites, self._labels, self.tf32
        append = self.events.append
        made = self._made
        for row in self._native.rec_take():
            if type(row) is not tuple:
                append(row)
                continue
            ev = made.get(row)  # a loop's rows repeat: one immutable event each
            if ev is not None:
                append(ev)
                continue
            kind, op, site_id, dtype, flops, nbytes = row
            name = names[op]
            site = "<unknown>"
            if site_id >= 0:
                site = sites[site_id]
                self.site_info.setdefault(site, t.site_info[site_id])
            if kind == 2:
                ev = OpEvent("host", name, site)
            else:
                lp = labels.get((op, dtype))
                if lp is None:
                    label = _DTYPE.get(dtype, str(dtype).replace("torch.", "")) if dtype else ""
                    lp = labels[(op, dtype)] = (label, peak_for(name, dtype, tf32))
                ev = _make_event(("kernel", name, site, lp[0], flops, nbytes, lp[1], "", False,
                                  False, 1, (), (), None))  # fmt: skip
            made[row] = ev
            append(ev)


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
        self._mode.take()
        return simulate(self._mode.events, self._target, self._mode.site_info)

    @property
    def events(self) -> tuple[OpEvent, ...]:
        """The model's input: the block's op events, in program order."""
        if self._final is None:
            self._mode.take()
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
    native = _recorder(dev_type)
    if native is not None:
        yield from _recorded(native, tgt)
        return
    mode = GpuModelMode(dev_type)
    proxy = GpuTimeProxy(mode, tgt)
    hears: Any = contextlib.nullcontext()
    if dev_type == simulated.NAME:
        _COMPILES.hook()
        hears = _sim_listeners(mode)
    elif torch.cuda.is_available():
        hears = cuda_stream_syncs(mode.sync)
    try:
        with hears, mode:
            yield proxy
    finally:
        proxy._final = simulate(mode.events, tgt, mode.site_info)


_unavailable: str | None = None  # why the recorder cannot register ("": it can; None: not tried)


def _recorder(dev_type: str) -> Any:
    """``sim``'s C++ module where its recorder serves this block: on ``sim``, with its C++
    path on, not inside another recorded block, and unless ``PERF_GPU_MODEL_RECORDER=0``.
    Where its dispatch key is taken (a later torch's), the dispatch mode, with a warning."""
    global _unavailable
    if dev_type != simulated.NAME or _active is not None:  # one recorder: inside it, a mode
        return None
    if os.environ.get("PERF_GPU_MODEL_RECORDER", "1") == "0":
        return None
    from perf.sim import native

    mod = native.module()
    if mod is None:
        return None
    if _unavailable is None:
        try:
            mod.rec_register()
            _unavailable = ""
        except RuntimeError as e:
            _unavailable = str(e)
            warnings.warn(
                f"perf.model_gpu_time: sim's C++ op recorder is unavailable ({e}); modelling "
                "with a dispatch mode, as on cuda (slower). PERF_GPU_MODEL_RECORDER=0 says so "
                "without this warning",
                RuntimeWarning,
                stacklevel=4,
            )
    return None if _unavailable else mod


#: the recorder's dispatch key (C++ ``DispatchKey::Fake``, just below ``Python``), which torch's
#: Python enum does not name
_RECORDER_KEY = torch._C.DispatchKey(torch._C.DispatchKey.Python.value - 1)
_active: NativeGpuModel | None = None


def _hop_kernel(func: Any) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        mode = _active
        if mode is None:  # not recording: as if the key were not there
            from perf.sim import native

            return native.module().rec_unseen(func, tuple(args), kwargs)
        return mode.hop(func, args, kwargs)

    return kernel


def _hop_kernels() -> None:
    """Each higher-order operator's kernel at the recorder's key: torch dispatches one from
    the highest key in the thread's set, and has none there."""
    from torch._ops import _higher_order_ops

    for hop in list(_higher_order_ops.values()):
        if _RECORDER_KEY not in hop.py_kernels:
            hop.py_impl(_RECORDER_KEY)(_hop_kernel(hop))


class _CompileWatch:
    """The recorder paused while TorchDynamo compiles, as Dynamo takes dispatch modes off the
    stack then (``_disable_current_modes``): a compile inside the block (a recompile) clones
    parameters and lifts constants on the device, which no step of the program runs. Paused,
    not its key taken out: Dynamo's guards read the thread's keys, and code compiled without
    it would compile again at every call inside the block.

    The syncs ``sim`` reports while Dynamo compiles (a constant copied to the device) are
    dropped too, under the dispatch mode as under the recorder. Hooked on Dynamo's compile
    callbacks once Dynamo is imported (perf never imports it)."""

    def __init__(self) -> None:
        self.depth = 0  # Dynamo's frame compiles under way
        self.paused: Any = None  # the recorder paused by the outermost one: its native module
        self.saved = False

    def hook(self) -> None:
        """On Dynamo's callbacks, again after ``torch._dynamo.reset()`` (which clears them)."""
        if "torch._dynamo" not in sys.modules:
            return
        from perf.instruments.compiles import dynamo_callbacks

        callbacks = dynamo_callbacks()
        if callbacks is not None and self.start not in getattr(callbacks, "start_callbacks", ()):
            callbacks.register_start_callback(self.start)
            callbacks.register_end_callback(self.end)

    def start(self, args: Any) -> None:
        if not self.depth and _active is not None:
            self.paused = _active._native
            self.saved = self.paused.rec_pause(True)
        self.depth += 1

    def end(self, args: Any) -> None:
        if self.depth:
            self.depth -= 1
            if not self.depth:
                self.resume()

    def resume(self) -> None:
        if self.paused is not None:
            self.paused.rec_pause(self.saved)
            self.paused = None


_COMPILES = _CompileWatch()


def _recorded(native: Any, tgt: GpuTarget) -> Iterator[GpuTimeProxy]:
    global _active
    mode = NativeGpuModel(native)
    proxy = GpuTimeProxy(mode, tgt)
    _hop_kernels()
    _COMPILES.hook()
    mode.start()
    _active = mode
    previous = native.rec_include(True)
    try:
        with _sim_listeners(mode):
            yield proxy
    finally:
        _active = None
        _COMPILES.resume()  # (the block ended inside a compile)
        native.rec_include(previous)
        native.rec_stop()
        mode.take()
        proxy._final = simulate(mode.events, tgt, mode.site_info)


@contextlib.contextmanager
def _sim_listeners(mode: GpuModelMode) -> Iterator[None]:
    """``mode`` hears of ``sim``'s syncs and collectives, which no dispatched op shows it."""
    sync_listeners.append(mode.sync)
    collective_listeners.append(mode.collective)
    try:
        yield
    finally:
        sync_listeners.remove(mode.sync)
        collective_listeners.remove(mode.collective)
