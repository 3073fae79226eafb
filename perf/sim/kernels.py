"""The simulated device's kernels: one Python fallback for every ``PrivateUse1`` op (the CPU
kernel on host views), the copies that cross host and device (where syncs and transfers are
observed), convolution, pinned host memory, and the fast path for structured ops.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from perf.sim import ordinals, tensors
from perf.sim.cuda_only import NOT_ON_SIM as _NOT_ON_SIM
from perf.sim.cuda_ops import CUDA_DTYPES as _CUDA_DTYPES
from perf.sim.cuda_ops import KERNELS as _CUDA_KERNELS
from perf.sim.errors import on_sim
from perf.sim.kernel_syncs import KERNEL_RULES as _KERNEL_SYNCS
from perf.sim.kernel_syncs import SPARSE_ONLY_RULES
from perf.sim.native import PYTHON_KEY
from perf.sim.paths import register_paths
from perf.sim.tensors import (
    CPU,
    META,
    NAME,
    NUMBER_TYPES,
    PINNED,
    SPARSE_META,
    Seen,
    aten,
    host_of,
    host_view,
    is_sim,
    out_index,
    rewrap,
    rewrap_numbers,
    unwrap,
    wrap,
)

#: Called as ``listener(name)`` for every sync on the simulated device: the device-level view,
#: like CUDA's sync debug mode, which also sees syncs inside code that disables Python modes
#: (printing a tensor does).
sync_listeners: list[Any] = []
#: Called as ``listener(name, tensors, world_size)`` for each collective ``sim``'s process
#: group runs (:mod:`perf.sim.distributed`): a Python process group dispatches no ``c10d``
#: op, so the GPU time model hears of them here.
collective_listeners: list[Any] = []
#: op -> ``hook(op, args)`` called after the op ran (the memory model's BLAS workspaces);
#: change it with :func:`set_after_op`
after_op: dict[Any, Any] = {}
#: id(op) -> (op, its special kernel, CUDA's in-kernel sync rule, its after-op hook): looked
#: up once per op, since an ``OpOverload`` hashes in Python (three lookups cost about 1 us)
_facts: dict[int, tuple[Any, Any, Any, Any]] = {}


def set_after_op(hooks: dict[Any, Any]) -> None:
    """Replace the after-op hooks (the memory model connects and disconnects its own)."""
    after_op.clear()
    after_op.update(hooks)
    _facts.clear()


def _facts_of(op: Any) -> tuple[Any, Any, Any, Any]:
    facts = (op, _SPECIAL.get(op), _KERNEL_SYNCS.get(op), after_op.get(op))
    _facts[id(op)] = facts  # holds op: its id stays its own
    return facts


def notify(name: str) -> None:
    for listener in list(sync_listeners):
        listener(name)


def fallback_kernel(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Every op on a sim tensor: run the CPU kernel on host views, wrap what comes out."""
    facts = _facts.get(id(op)) or _facts_of(op)
    special = facts[1]
    if special is not None:
        return special(*args, **kwargs)
    if sync_listeners:
        rule = facts[2]
        if rule is not None:  # the syncs CUDA's kernel makes inside this op
            for _ in range(rule[1](args, kwargs, is_sim)):
                notify(rule[0])
    seen: Seen = {}
    for a in args:
        if type(a) in NUMBER_TYPES:
            args = rewrap_numbers(op, args)
            break
    cargs = [unwrap(op, a, seen) for a in args]
    if kwargs:
        ckw = {k: unwrap(op, v, seen) for k, v in kwargs.items()}
        if ckw.get("pin_memory"):
            ckw["pin_memory"] = False
    else:
        ckw = kwargs
    try:
        out = op._op(*cargs, **ckw)  # the C++ op itself: OpOverload.__call__ adds a frame
    except NotImplementedError as e:
        out = _cuda_dtype_kernel(op, e, cargs, ckw)
    except Exception as e:
        raise _named(op, e) from e
    if ordinals.count == 1 and "device" not in kwargs:  # one device: skip the index search
        result = rewrap(out, seen)
    else:
        result = rewrap(out, seen, out_index(op, seen, kwargs))
    after = facts[3]
    if after is not None:
        after(op, args)
    return result


def _cuda_dtype_kernel(
    op: Any, err: NotImplementedError, cargs: list[Any], ckw: dict[str, Any]
) -> Any:
    """Where the CPU kernel lacks the input's dtype: CUDA's math for it
    (:data:`perf.sim.cuda_ops.CUDA_DTYPES`), else the error saying ``sim`` cannot run it."""
    name = op._schema.name[len("aten::") :] + (
        f".{op._overloadname}" if op._overloadname != "default" else ""
    )
    dtypes, host = _CUDA_DTYPES.get(name, ((), None))
    if host is not None and isinstance(cargs[0], torch.Tensor) and cargs[0].dtype in dtypes:
        try:
            return host(*cargs, **ckw)
        except Exception as e:
            raise _named(op, e) from e
    why = _NOT_ON_SIM.get(name)
    raise NotImplementedError(
        f"perf's simulated device runs every op with its CPU kernel, and {op.__name__} has "
        f"none (it exists for CUDA{': ' + why if why else ''}): the simulated device cannot "
        f"run this code. ({err})"
    ) from None


def _named(op: Any, err: Exception) -> BaseException:
    """``err`` saying it happened on sim, in ``op`` (:mod:`perf.sim.errors`)."""
    new = on_sim(op, err)
    if new is err:
        raise err
    return new


def _notify_copy(src_sim: bool, dst_sim: bool, non_blocking: bool, numel: int) -> None:
    # A copy of no elements returns before copy_stub (Copy.cpp copy_impl: ``if
    # (iter.numel() == 0) return self;``): no cudaMemcpy, so no sync.
    if sync_listeners and not non_blocking and src_sim != dst_sim and numel:
        notify("d2h_copy" if src_sim else "h2d_copy")


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    _notify_copy(is_sim(src), is_sim(dst), non_blocking, dst.numel())
    s = host_of(src) if is_sim(src) else src
    d = host_of(dst) if is_sim(dst) else dst
    aten.copy_.default(d, s)  # the CPU's copy_ resolves conjugate and negative views
    return dst


def efficient_zero_tensor(
    size: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> torch.Tensor:
    """``_efficientzerotensor`` on ``sim``: a tensor of zeros.

    Why: some backward formulas return one (``sgn`` of a real tensor); CUDA makes a
    ``ZeroTensor`` that owns no memory, which a ``PrivateUse1`` backend cannot make from
    Python, and the CPU's one, wrapped, had no data for the host view to read (a segmentation
    fault on first use). So ``sim`` allocates the zeros (CUDA allocates nothing here)."""
    index = 0 if device is None or ordinals.count == 1 else ordinals.index_of(device)
    return wrap(aten.zeros.default(size, dtype=dtype, device=CPU), index)


def register_math_bits(lib: Any) -> None:
    """Copies of a conjugate or negative view (``x.conj()`` of a complex tensor, inside
    ``torch.fft.hfft``) go to ``sim``'s ``_copy_from`` as they are.

    Why: CUDA's ``copy_`` resolves the bits itself, and torch lets ``copy_`` and ``clone`` pass
    the ``Conjugate`` / ``Negative`` fallbacks (``ConjugateFallback.cpp``,
    ``NegateFallback.cpp``); a ``PrivateUse1`` copy ends in ``_copy_from``, which those
    fallbacks resolved by a ``clone`` that copies through ``_copy_from`` again: a recursion
    that crashed the process (a segmentation fault)."""
    for key in ("Conjugate", "Negative"):
        for op in ("_copy_from", "_copy_from_and_resize"):
            lib.impl(op, torch.library.fallthrough_kernel, key)


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.size() != src.size():
        aten.resize_.default(dst, src.size())
    return _copy_from(src, dst)


def to_copy_kernel(
    self: torch.Tensor,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    non_blocking: bool = False,
    memory_format: Any = None,
) -> torch.Tensor:
    # Replaces the composite kernel, which asks the (absent) PrivateUse1 pinned allocator for
    # the destination of a non-blocking device-to-host copy, as CUDA's does.
    to_host = device is not None and torch.device(device).type == "cpu"
    _notify_copy(is_sim(self), not to_host, non_blocking, self.numel())
    index = 0
    if not to_host and (ordinals.count > 1 or device is not None):
        index = (self.device.index or 0) if device is None else ordinals.index_of(device)
    src = host_view(self) if is_sim(self) else self
    out = aten._to_copy.default(
        src, dtype=dtype, layout=layout, device=CPU, memory_format=memory_format
    )
    if to_host:
        if pin_memory or non_blocking:
            setattr(out.untyped_storage(), PINNED, True)
        return out
    return wrap(out, index)


def conv(
    x: Any,
    w: Any,
    b: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
) -> torch.Tensor:
    # Non-CPU/CUDA backends get convolution_overrideable; run the CPU convolution.
    seen: Seen = {}
    args = [unwrap(aten.convolution.default, a, seen) for a in (x, w, b)]
    index = _index(aten.convolution.default, seen)
    try:
        out = aten.convolution.default(
            *args, stride, padding, dilation, transposed, output_padding, groups
        )
    except Exception as e:
        raise _named(aten.convolution.default, e) from e
    return wrap(out, index)


def conv_backward(
    grad: Any,
    x: Any,
    w: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    mask: Any,
) -> Any:
    seen: Seen = {}
    g, xh, wh = (unwrap(aten.convolution.default, a, seen) for a in (grad, x, w))
    index = _index(aten.convolution_backward.default, seen)
    bias_sizes = [wh.size(1) * groups if transposed else wh.size(0)]
    try:
        outs = aten.convolution_backward.default(
            g,
            xh,
            wh,
            bias_sizes,
            stride,
            padding,
            dilation,
            transposed,
            output_padding,
            groups,
            mask,
        )
    except Exception as e:
        raise _named(aten.convolution_backward.default, e) from e
    return tuple(None if o is None else wrap(o, index) for o in outs)


def _index(op: Any, seen: Seen) -> int:
    return out_index(op, seen, {})


_SPECIAL: dict[Any, Any] = {
    aten._copy_from.default: _copy_from,
    aten._copy_from_and_resize.default: _copy_from_and_resize,
}


# --------------------------------------------------------------------------------------------
# pinned host memory


def cpu_is_pinned(self: torch.Tensor, device: Any = None) -> bool:
    return bool(getattr(self.untyped_storage(), PINNED, False))


def cpu_pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    if device is not None and torch.device(device).type not in (NAME, "cpu"):
        raise RuntimeError(
            f"pin_memory(device={device!r}) in a process where perf's simulated device is "
            f"installed: only {NAME!r} pinned memory exists here; run the {device} code in "
            "another process"
        )
    out = aten.empty_strided.default(self.size(), self.stride(), dtype=self.dtype, device=CPU)
    aten.copy_.default(out, self)
    setattr(out.untyped_storage(), PINNED, True)
    return out


def sim_is_pinned(self: torch.Tensor, device: Any = None) -> bool:
    return False


#: View ops whose CPU kernel is also their Meta kernel (``native_functions.yaml``: ``CPU, CUDA,
#: Meta: view``; ``as_strided``'s Meta kernel is its symbolic twin): device-generic C++ that
#: gives the input's storage new sizes, strides and offset. They are the views that reach
#: ``PrivateUse1`` (the others are composite: ``t``, ``transpose``, ``expand``, ``select`` ...
#: end in ``as_strided``).
META_VIEWS = (
    aten.as_strided.default,
    aten.view.default,
    aten._reshape_alias.default,
    aten.unfold.default,
    aten.view_as_real.default,
    aten.view_as_complex.default,
)


def register_views(lib: Any) -> None:
    """Run :data:`META_VIEWS` through their Meta kernel on the sim tensor itself.

    Why: through the fallback a view cost a host view, the CPU kernel, a new sim tensor and an
    allocator-model call (about 25 us, 20x the CPU's ``x.t()``); this way about 5 us. The view
    also shares its base's sim storage, as a view on CUDA shares its base's storage (through
    the fallback it got a new sim storage holding the same host storage)."""
    # with the C++ path its kernel runs them, and hands errors to this one (python_key())
    for op in META_VIEWS:
        lib.impl(op, _view_kernel(op), python_key())


def _view_kernel(op: Any) -> Any:
    redispatch = op._handle.redispatch_boxed

    def kernel(*args: Any, **kwargs: Any) -> Any:
        try:
            return redispatch(META, *args, **kwargs)
        except Exception as e:  # "view size is not compatible": say where, and what to do
            raise _named(op, e) from e

    return kernel


def register_structured(lib: Any) -> None:
    """Run structured ops' functional forms directly. Their default kernel for other backends
    allocates the output (one fallback call) and then calls the ``out=`` form (another); going
    straight to the CPU kernel halves the simulation's cost of most pointwise ops."""
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::") or name in _OWN_KERNELS:
            continue
        if name[len("aten::") :] in _CUDA_KERNELS:
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(
            name, "CompositeExplicitAutogradNonFunctional"
        ) and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"):
            packet, _, overload = name[len("aten::") :].partition(".")
            op = getattr(getattr(aten, packet), overload or "default")
            if tensors.native is not None:
                # The C++ kernel takes PrivateUse1 (register_native); its way to Python is a
                # redispatch to PrivateUse2, where the composite kernel would otherwise win
                # over the Python fallback.
                _NATIVE_STRUCTURED.append(name)
            lib.impl(op, functools.partial(fallback_kernel, op), python_key())
    register_paths(lib, fallback_kernel)  # CUDA's branches where torch branches by device


def python_key() -> str:
    """The dispatch key of ``sim``'s Python kernels that the C++ path (:mod:`perf.sim.native`)
    also takes: ``PrivateUse2`` with it (its redispatch reaches them there), else
    ``PrivateUse1``."""
    return PYTHON_KEY if tensors.native is not None else "PrivateUse1"


#: structured ops whose ``PrivateUse1`` kernel is the C++ path's (:func:`register_native`)
_NATIVE_STRUCTURED: list[str] = []


def register_native() -> None:
    """With the C++ path (:mod:`perf.sim.native`): its kernel for the structured ops that have
    no ``PrivateUse1`` kernel of ``sim``'s own, and the ops it must leave to Python."""
    nat = tensors.native
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    names = [n[len("aten::") :] for n in _NATIVE_STRUCTURED if not has(n, "PrivateUse1")]
    # copies between sim tensors, and _to_copy on the device (its Python kernel, for copies
    # across host and device, sits at PrivateUse2: see device.py)
    views = [f"view:{_full_name(op)[len('aten::') :]}" for op in META_VIEWS]
    nat.register_ops([*names, *views, "_copy_from", "_to_copy"])
    set_native_python_ops()


def _full_name(op: Any) -> str:
    schema = op._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def set_native_python_ops(extra: Any = ()) -> None:
    """Tell the C++ path which ops go to the Python fallback: those with a special kernel, a
    sync inside CUDA's kernel, or (``extra``) an after-op hook still to run."""
    nat = tensors.native
    if nat is None:
        return
    dense_ok = {op for op, (_, rule) in _KERNEL_SYNCS.items() if rule in SPARSE_ONLY_RULES}
    # _copy_from: its C++ kernel takes sim-to-sim copies and hands the rest to Python itself
    ops = ({*_SPECIAL, *_KERNEL_SYNCS} - dense_ok - {aten._copy_from.default}) | {*extra}
    nat.set_python_ops(sorted(_full_name(op) for op in ops))


#: ops with a kernel of their own here (not the generic fallback)
_OWN_KERNELS = frozenset(
    [
        "aten::_to_copy",
        "aten::is_pinned",
        "aten::convolution_overrideable",
        "aten::convolution_backward_overrideable",
    ]
)


# --------------------------------------------------------------------------------------------
# sparse COO tensors

#: Structural ops of sparse tensors: their ``SparseMeta`` kernel is the device-generic C++ that
#: ``SparseCPU`` and ``SparseCUDA`` share (``SparseTensor.cpp``: sizes, flags, and the indices
#: and values tensors a ``SparseTensorImpl`` holds), so it runs on the sim tensor itself.
SPARSE_STRUCTURE = (
    "_indices",
    "_values",
    "indices",
    "values",
    "_nnz",
    "sparse_dim",
    "dense_dim",
    "_dimV",
    "is_coalesced",
    "_coalesced_",
    "sparse_resize_",
    "sparse_resize_and_clear_",
    "_sparse_coo_tensor_with_dims",
    "_sparse_coo_tensor_with_dims_and_tensors",
    "copy_sparse_to_sparse_",
    "empty.memory_format",
    "zero_",
)


def register_sparse(fb: Any, lib: Any) -> None:
    """Sparse COO tensors on ``sim`` (``SparsePrivateUse1``), as on CUDA.

    Why: graph networks keep the adjacency matrix sparse on the GPU (``adj.to_sparse()
    .to(device)``, ``torch.sparse.mm``); without this ``sim`` failed on the first sparse op.
    The structure runs through :data:`SPARSE_STRUCTURE`; every op with a ``SparseCPU`` kernel
    runs that kernel on :func:`perf.sim.tensors.host_sparse` views through the fallback
    (registered per op where a composite kernel meant for dense backends would otherwise take
    it: ``mm``, ``add``); the rest, composite for sparse tensors too (``_to_copy``, ``t``,
    ``coalesce``), runs as on CUDA, op by op."""
    fb.fallback(fallback_kernel, "SparsePrivateUse1")
    fb.fallback(_compressed_sparse, "SparseCsrPrivateUse1")
    own = set()
    for name in SPARSE_STRUCTURE:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet), overload or "default")
        lib.impl(op, _redispatch(op, SPARSE_META), "SparsePrivateUse1")
        own.add(f"aten::{name}")
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::") or name in own:
            continue
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        if has(name, "SparseCPU") and (
            has(name, "CompositeExplicitAutograd")
            or has(name, "CompositeExplicitAutogradNonFunctional")
        ):
            packet, _, overload = name[len("aten::") :].partition(".")
            op = getattr(getattr(aten, packet), overload or "default")
            lib.impl(op, functools.partial(fallback_kernel, op), "SparsePrivateUse1")


def _compressed_sparse(op: Any, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(
        f"perf's simulated device runs {op.__name__} on a sparse compressed tensor (CSR, CSC, "
        "BSR or BSC), a layout it does not simulate (sparse COO tensors run, dense ones "
        "too): count this code on CUDA, or keep the tensor in COO layout (to_sparse()) on "
        f"{NAME}"
    )


def _redispatch(op: Any, keys: Any) -> Any:
    redispatch = op._handle.redispatch_boxed

    def kernel(*args: Any, **kwargs: Any) -> Any:
        try:
            if ordinals.count == 1:
                return redispatch(keys, *args, **kwargs)
            # The device guard a backend kernel's wrapper sets (the Meta one sets none): the
            # new SparseTensorImpl's first indices are made on the current device.
            sims = [a for a in (*args, *kwargs.values()) if is_sim(a)]
            with ordinals.made_on(ordinals.op_index(op, sims, kwargs.get("device"))):
                return redispatch(keys, *args, **kwargs)
        except Exception as e:
            raise _named(op, e) from e

    return kernel
