"""Sim tensors and their host views: the representation the simulated device rests on.

A sim tensor is a plain ``torch.Tensor`` of device ``sim`` whose own storage is empty; the
storage's Python object carries the host ``UntypedStorage`` that holds the data (attribute
``HOST``). Sizes, strides and offset of a sim tensor equal those of its host view, set
through the ``Meta`` kernel of ``set_`` (which checks no bounds). Kernels unwrap arguments to
host views, run the CPU kernel and wrap what comes out (:mod:`perf.sim.kernels`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from perf.sim import ordinals

NAME = "sim"

aten = torch.ops.aten
META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
#: a sparse COO sim tensor's structure (its indices and values, sizes, coalesced flag) is kept
#: by torch's own ``SparseTensorImpl``: the ``SparseMeta`` kernels of the structural ops are the
#: device-generic C++ that ``SparseCPU`` and ``SparseCUDA`` share
#: (``perf.sim.kernels.register_sparse``)
SPARSE_META = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseMeta)
HOST = "_perf_sim_host"  # attribute of a sim storage's Python object: its host storage
PINNED = "_perf_sim_pinned"  # attribute of a host storage's Python object: "pinned"
CPU = torch.device("cpu")
#: Called with each host storage a sim storage takes (the memory model's allocation hook,
#: set by ``perf.sim.memory.install``).
storage_hook: Any = None
#: the C++ path (:mod:`perf.sim.native`) when it is active: sim storages then hold their host
#: storage in C++ (the context of their data pointer), not as a Python attribute
native: Any = None


#: id(host view) -> (host view, sim tensor) of one op's arguments
Seen = dict[int, tuple[torch.Tensor, torch.Tensor]]


#: the devices ``sim:0`` ... ``sim:N-1`` (set at installation, :func:`register_devices`).
#: ``t.device in SIM_DEVICES`` is the fallback's test: ``t.device.type`` builds a string
#: each time, about 0.5 us more, and it runs for every tensor argument of every op.
SIM_DEVICES: frozenset[torch.device] = frozenset()


def register_devices(count: int) -> None:
    """Called by ``simulated_device()`` once ``PrivateUse1`` is named ``sim``."""
    global SIM_DEVICES
    SIM_DEVICES = frozenset(torch.device(NAME, i) for i in range(count))


def is_sim(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device in SIM_DEVICES


#: the keys a backend kernel runs without (below autograd): a host recompute needs them back
_AUTOGRAD_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradCPU) | (
    torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView)
)


@contextlib.contextmanager
def host_recompute(rng_state: torch.Tensor | None = None) -> Iterator[None]:
    """Autograd on host tensors inside a ``sim`` kernel, for a backward that recomputes its
    forward on the host (the cuDNN RNN's, the attention kernels' with dropout), with the CPU
    generator at ``rng_state`` (the state the forward's dropout drew from; restored after).

    Why: a backend kernel runs below autograd's dispatch keys, so ``enable_grad`` alone
    records nothing; and the recompute must draw the forward's dropout masks again."""
    saved = torch.get_rng_state() if rng_state is not None else None
    try:
        if rng_state is not None:
            torch.set_rng_state(rng_state)
        with torch._C._ForceDispatchKeyGuard(
            torch._C._dispatch_tls_local_include_set(),
            torch._C._dispatch_tls_local_exclude_set() - _AUTOGRAD_KEYS,
        ), torch.enable_grad():  # fmt: skip
            yield
    finally:
        if saved is not None:
            torch.set_rng_state(saved)


def host_view(t: torch.Tensor) -> torch.Tensor:
    """The host tensor that holds a sim tensor's data (same sizes, strides and offset)."""
    if native is not None:
        return native.host_view(t)
    host = getattr(t.untyped_storage(), HOST, None)
    if host is None:
        raise RuntimeError(
            f"perf.sim.device: this {NAME} tensor has no host storage (it was made by an "
            "operation the simulated device does not support); please report the operation"
        )
    # Tensor methods, not aten.<op>.<overload>(...): the OpOverload call path costs ~4x more,
    # and this runs for every sim argument of every op (the fallback's hottest line);
    # new_empty of a cached tensor of the dtype skips torch.empty's keyword parsing.
    like = _EMPTY.get(t.dtype)
    if like is None:
        like = _EMPTY.setdefault(t.dtype, torch.empty(0, dtype=t.dtype, device=CPU))
    return like.new_empty(0).set_(host, t.storage_offset(), t.size(), t.stride())


#: dtype -> an empty host tensor of that dtype (host_view's template)
_EMPTY: dict[torch.dtype, torch.Tensor] = {}


def host_of(t: torch.Tensor) -> torch.Tensor:
    """The host tensor a CPU kernel runs on for the sim tensor ``t``: its host view (for a
    sparse tensor :func:`host_sparse`), with ``t``'s lazy conjugate / negative bits, which
    ops that handle them themselves (``mm``, ``dot``, ``copy_``: torch lets them pass the
    ``Conjugate`` / ``Negative`` fallbacks) must see there too."""
    h = host_sparse(t) if t.is_sparse else host_view(t)
    if t.is_conj():
        h = h.conj()
    if t.is_neg():
        h = torch._neg_view(h)
    return h


def storage_of(t: torch.Tensor) -> Any:
    """The storage that holds ``t``'s data: for a sim tensor its host storage (real data
    pointer and size), else ``t.untyped_storage()``. Meters that key by storage use this."""
    if t.device in SIM_DEVICES:
        st = t.untyped_storage()
        host = native.host_storage(st) if native is not None else getattr(st, HOST, None)
        if host is not None:
            return host
    return t.untyped_storage()


#: Whether a sim tensor was made in this process: ``torch.sim.is_initialized()``, which is
#: ``torch.cuda.is_initialized()``'s lazy state (DeviceMesh sets the device from
#: ``LOCAL_RANK`` only while it is False).
initialized = False


def _initialize() -> None:
    global initialized
    initialized = True


def _repoint(outer: torch.Tensor, cpu: torch.Tensor) -> None:
    """Make ``outer`` describe ``cpu``: its host storage and its sizes/strides/offset."""
    global initialized
    initialized = True
    if native is not None:
        native.repoint(outer, cpu)
        return
    st = outer.untyped_storage()
    index = (outer.device.index or 0) if ordinals.count > 1 else 0
    if index and getattr(st, HOST, None) is None:
        st = ordinals.storage_on(index)  # a fresh tensor of sim:i (i > 0)
    elif getattr(st, HOST, None) is not None and getattr(st, HOST)._cdata != (
        cpu.untyped_storage()._cdata
    ):
        if index:
            st = ordinals.storage_on(index)
        else:
            st = torch._C._acc.create_empty_tensor((0,), cpu.dtype).untyped_storage()
    _set_storage(outer, st, cpu.untyped_storage(), cpu, index)


def _set_storage(outer: torch.Tensor, st: Any, host: Any, cpu: torch.Tensor, index: int) -> None:
    """``outer`` (on ``sim:index``) gets storage ``st`` holding ``host``, with ``cpu``'s sizes,
    strides and offset."""
    setattr(st, HOST, host)
    if storage_hook is not None:
        storage_hook(host, index)
    if index:
        ordinals.set_on(outer, st, cpu.storage_offset(), cpu.size(), cpu.stride())
        return
    _SET_META(META, outer, st, cpu.storage_offset(), cpu.size(), cpu.stride())


#: ``aten.set_.source_Storage_storage_offset.redispatch`` less its Python frame
_SET_META = aten.set_.source_Storage_storage_offset._handle.redispatch_boxed


def wrap(cpu: torch.Tensor, index: int = 0) -> torch.Tensor:
    """A new sim tensor on ``sim:index`` sharing the host tensor's data."""
    if cpu.layout is not torch.strided:
        if cpu.is_sparse:
            return wrap_sparse(cpu, index)
        raise NotImplementedError(
            f"perf's simulated device does not simulate {cpu.layout} tensors (sparse COO "
            "tensors run, dense ones too): count this code on CUDA, or keep the tensor in COO "
            f"layout (to_sparse()) on {NAME}"
        )
    if cpu.is_nested:
        raise NotImplementedError(
            "perf's simulated device does not simulate nested tensors (torch.nested; "
            "nn.TransformerEncoder, TransformerEncoderLayer and MultiheadAttention make them in "
            "their inference fast path from a padding mask): count this code on CUDA, or turn "
            "the fast path off on sim (torch.backends.mha.set_fastpath_enabled(False), or "
            "TransformerEncoder(..., enable_nested_tensor=False))"
        )
    if native is not None:
        _initialize()
        return native.wrap(cpu, index)
    if index:
        out = ordinals.empty_on(index, cpu.dtype)
        _repoint(out, cpu)
    else:
        # A new tensor of sim:0 (most ops make one) needs none of _repoint's checks. (0,),
        # then set_ through Meta: that kernel also sizes the sim storage to the host's bytes,
        # as C++ code that checks a storage's bounds needs (an RNN's weights do).
        global initialized
        initialized = True
        out = torch._C._acc.create_empty_tensor((0,), cpu.dtype)
        _set_storage(out, out.untyped_storage(), cpu.untyped_storage(), cpu, 0)
    if cpu.is_conj() or cpu.is_neg():
        # A kernel may return a lazily conjugated view (linalg_lu_solve(..., left=False)
        # returns X.mH() of its work): the sim tensor keeps the bits, as CUDA's result would.
        torch._C._set_conj(out, cpu.is_conj())
        torch._C._set_neg(out, cpu.is_neg())
    return out


def _check_mixed(op: Any, t: torch.Tensor) -> None:
    # CUDA accepts host *scalars* (0-dim) beside device tensors, and host index tensors in
    # indexing; anything else is the classic "forgot to move it" bug, which must fail here too.
    if t.dim() == 0 or op.__name__.split(".")[0] in _HOST_OK_OPS:
        return
    if op.__name__ in _HOST_LENGTHS_OPS and not t.is_floating_point():
        return
    raise RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{NAME}:0 and cpu! (in {op.__name__}; the simulated device fails where CUDA would)"
    )


_HOST_OK_OPS = frozenset(
    ["index", "_index_put_impl_", "index_put_", "index_put", "_unsafe_index", "copy_", "_copy_from"]
)
#: ops whose CUDA kernel takes host length tensors (LossCTC.cpp ctc_loss_tensor: ``.to(kCPU)``
#: of each): CTC's composite calls them under any dispatch mode (perf's counters included)
_HOST_LENGTHS_OPS = frozenset(["_ctc_loss.Tensor", "_ctc_loss_backward.Tensor"])


def unwrap(op: Any, x: Any, seen: Seen) -> Any:
    if isinstance(x, torch.Tensor):
        if x.is_cpu:
            _check_mixed(op, x)
        elif x.device in SIM_DEVICES:
            h = host_of(x)
            seen[id(h)] = (h, x)
            return h
        return x
    if isinstance(x, (list, tuple)) and x and any(isinstance(v, torch.Tensor) for v in x):
        return type(x)(unwrap(op, v, seen) if v is not None else None for v in x)
    if isinstance(x, torch.device) and x.type == NAME:
        return CPU
    return x


def out_index(op: Any, seen: Seen, kwargs: dict[str, Any]) -> int:
    """The device index of an op's new outputs: 0 with one device and no ``device``
    argument, else where its sim arguments (or its ``device`` argument) are."""
    if ordinals.count == 1 and "device" not in kwargs:
        return 0
    return ordinals.op_index(op, [p[1] for p in seen.values()], kwargs.get("device"))


def rewrap(x: Any, seen: Seen, index: int = 0) -> Any:
    """The sim tensors for an op's host outputs: the caller's own where an output is one of
    its arguments' host views, else new ones on ``sim:index``."""
    if isinstance(x, torch.Tensor):
        pair = seen.get(id(x))
        if pair is None:
            if torch.is_inference_mode_enabled() and _views_normal_tensor(x, seen):
                # A view of a normal tensor is normal, also inside inference_mode (autograd
                # shares the base's version counter with it).
                with torch.inference_mode(False):
                    return wrap(x, index)
            return wrap(x, index)
        outer = pair[1]
        if x.is_sparse:
            resync_sparse(outer, x)  # an in-place op on a sparse argument
            return outer
        if not _same_view(outer, x):
            _repoint(outer, x)  # resize_, set_, out= that resized
        return outer
    if isinstance(x, (list, tuple)):
        return type(x)(rewrap(v, seen, index) for v in x)
    return x


NUMBER_TYPES = (bool, int, float, complex)
_TENSOR_PARAMS: dict[Any, tuple[bool, ...]] = {}  # op -> whether each positional wants a Tensor
_CATEGORY = {bool: 0, int: 1, float: 2, complex: 3}
_WIDEST = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


def _category(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    return 2 if dtype.is_floating_point else 1


def rewrap_numbers(op: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Python numbers where the schema wants a Tensor back into 0-dim tensors.

    Boxed kernels hand "wrapped numbers" (the scalar in ``x % 3``) to Python as numbers; the
    out= kernel that structured ops call wants a Tensor. The tensor's dtype promotes as the
    wrapped number would (it only counts by category): beside a tensor of at least its category
    that has dimensions, it keeps the number's full precision (``int64``, ``float64``,
    ``complex128``), as the CPU kernel reads a wrapped number (``deg2rad`` of a ``bfloat16``
    tensor multiplies by pi/180 as a double, not rounded to ``bfloat16`` first).
    """
    wants = _TENSOR_PARAMS.get(op)
    if wants is None:
        wants = tuple(isinstance(a.type, torch._C.TensorType) for a in op._schema.arguments)
        _TENSOR_PARAMS[op] = wants
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    like = next((a for a in tensors if a.dim()), tensors[0] if tensors else None)
    out = list(args)
    for i, a in enumerate(args):
        if type(a) not in NUMBER_TYPES or i >= len(wants) or not wants[i]:
            continue
        if like is not None and _CATEGORY[type(a)] <= _category(like.dtype):
            # a 0-dim tensor beside a tensor with dimensions never decides the result's dtype
            dtype = _WIDEST[type(a)] if like.dim() else like.dtype
        else:
            dtype = {
                bool: torch.bool,
                int: torch.int64,
                float: torch.get_default_dtype(),
                complex: torch.complex64
                if torch.get_default_dtype() == torch.float32
                else torch.complex128,
            }[type(a)]
        out[i] = aten.scalar_tensor.default(a, dtype=dtype, device=CPU)
    return tuple(out)


def _views_normal_tensor(x: torch.Tensor, seen: Seen) -> bool:
    st = x.untyped_storage()._cdata
    return any(
        not outer.is_inference() and h.untyped_storage()._cdata == st for h, outer in seen.values()
    )


# --------------------------------------------------------------------------------------------
# sparse COO tensors: torch's SparseTensorImpl over sim indices and values

_INDICES = aten._indices.default._handle.redispatch_boxed
_VALUES = aten._values.default._handle.redispatch_boxed
_MAKE_SPARSE = aten._sparse_coo_tensor_with_dims_and_tensors.default._handle.redispatch_boxed
_CLEAR_SPARSE = aten.sparse_resize_and_clear_.default._handle.redispatch_boxed
_COPY_SPARSE = aten.copy_sparse_to_sparse_.default._handle.redispatch_boxed
_SET_COALESCED = aten._coalesced_.default._handle.redispatch_boxed


def host_sparse(t: torch.Tensor) -> torch.Tensor:
    """The host sparse tensor over a sparse sim tensor's data: its indices and values are the
    host views of the sim ones (no copy), with the same sizes and coalesced flag."""
    i = host_view(_INDICES(SPARSE_META, t))
    v = host_view(_VALUES(SPARSE_META, t))
    return aten._sparse_coo_tensor_with_dims_and_tensors.default(
        i.size(0),
        v.dim() - 1,
        t.size(),
        i,
        v,
        dtype=t.dtype,
        layout=torch.sparse_coo,
        device=CPU,
        is_coalesced=t.is_coalesced(),
    )


def wrap_sparse(cpu: torch.Tensor, index: int = 0) -> torch.Tensor:
    """A new sparse sim tensor on ``sim:index`` over the host sparse tensor's indices and
    values (wrapped, not copied)."""
    if ordinals.count > 1 and index != ordinals.current():
        with ordinals.made_on(index):  # the SparseTensorImpl's first indices: the current one
            return wrap_sparse(cpu, index)
    return _MAKE_SPARSE(
        SPARSE_META,
        cpu.sparse_dim(),
        cpu.dense_dim(),
        cpu.size(),
        wrap(cpu._indices(), index),
        wrap(cpu._values(), index),
        dtype=cpu.dtype,
        layout=torch.sparse_coo,
        device=torch.device(NAME, index),
        is_coalesced=cpu.is_coalesced(),
    )


def resync_sparse(outer: torch.Tensor, cpu: torch.Tensor) -> None:
    """After an in-place op ran on ``host_sparse(outer)``, make ``outer`` describe ``cpu``.

    Values changed in place are already shared; an op that gave the host tensor new indices
    or values (``add_`` of another sparse tensor, ``zero_``) or new sizes is copied in, device
    to device (no sync, as a CUDA kernel writing new indices would not)."""
    oi, ov = _INDICES(SPARSE_META, outer), _VALUES(SPARSE_META, outer)
    ci, cv = cpu._indices(), cpu._values()
    same = (
        outer.size() == cpu.size()
        and outer.sparse_dim() == cpu.sparse_dim()
        and _same_view(oi, ci)
        and _same_view(ov, cv)
    )
    if not same:
        _CLEAR_SPARSE(SPARSE_META, outer, cpu.size(), cpu.sparse_dim(), cpu.dense_dim())
        index = (outer.device.index or 0) if ordinals.count > 1 else 0
        _COPY_SPARSE(SPARSE_META, outer, wrap_sparse(cpu, index), False)
    if outer.is_coalesced() != cpu.is_coalesced():
        _SET_COALESCED(SPARSE_META, outer, cpu.is_coalesced())


def _same_view(sim: torch.Tensor, host: torch.Tensor) -> bool:
    """Whether the sim tensor describes ``host``: its host storage, sizes, strides, offset."""
    if native is not None:
        return native.same_view(sim, host)
    st = getattr(sim.untyped_storage(), HOST, None)
    return (
        st is not None
        and st._cdata == host.untyped_storage()._cdata
        and sim.size() == host.size()
        and sim.stride() == host.stride()
        and sim.storage_offset() == host.storage_offset()
    )
