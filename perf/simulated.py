"""A simulated accelerator: a device of its own type whose tensors live in host memory.

Why: on a CPU-only box nothing tells a host tensor from a would-be device tensor, so a sync
counter either counts host work as syncs (clipping, samplers, host loss buffers: 10x-100x too
many on real code) or counts nothing. ``simulated_device()`` installs a real torch device,
``sim``, so training code written for a GPU (``model.to(dev)``, ``x.to(dev, non_blocking=True)``,
``torch.randn(..., device=dev)``, ``x.pin_memory()``, ``loss.item()``, ``torch.autocast(dev.type)``,
``torch.amp.GradScaler(dev.type)``) runs unchanged, computes with the CPU kernels, and every
tensor knows whether it lives on the device or on the host. ``perf.count_syncs`` and
``perf.count_transfers`` then count on ``sim`` what the same code causes on ``cuda:0``.

How (what it relies on):

- PyTorch's Python backend for the ``PrivateUse1`` dispatch key
  (``torch.utils.backend_registration._setup_privateuseone_for_python_backend``, the
  ``torch._C._acc`` hooks and ``torch._C._acc.create_empty_tensor``; see PyTorch's
  ``test/test_privateuseone_python_backend.py``). These are experimental PyTorch APIs: tested on
  torch 2.13.0; where they are missing ``simulated_device()`` raises and says so.
- Sim tensors are plain ``torch.Tensor`` objects (so optimizers pick ``foreach`` by default as
  on CUDA, and ``nn.Parameter`` stays ``Parameter``). Their own storage is empty; the storage's
  Python object carries the host ``UntypedStorage`` that holds the data. Sizes, strides and
  offset of a sim tensor equal those of its host view, set through the ``Meta`` kernel of
  ``set_`` (which checks no bounds).
- One Python fallback kernel for ``PrivateUse1`` runs every op on host views and wraps the
  outputs; in-place and ``out=`` results are the caller's own tensors, views share host storage.
- ``pin_memory()`` / ``is_pinned()`` of host tensors are re-implemented for the ``CPU`` key: a
  pinned tensor is a host copy whose storage is marked pinned (there is no page-locking).
- Autocast on ``sim`` uses CUDA's cast policy (lists below, from ``autocast_mode.cpp``).
- ``Module.to`` / ``Module.cpu`` swap parameters (``torch.__future__``'s swap mode) for moves to
  or from ``sim`` only, so ``module.to(sim)`` keeps the Parameter objects (and tied weights) as
  ``module.to("cuda")`` does.

What it does not model: time (every op costs what the CPU kernel costs), the caching
allocator (no memory statistics), streams and events (all work is synchronous), random
numbers (sim ops draw from the CPU generator), autocast's weight-cast cache, kernels that
exist only on CUDA (fused optimizers, flash attention), and more than one device.
Use it in a process without another accelerator: once installed, ``sim`` is the process's
current accelerator and ``PrivateUse1`` cannot be renamed again.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch

NAME = "sim"

aten = torch.ops.aten
_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_HOST = "_perf_sim_host"  # attribute of a sim storage's Python object: its host storage
_PINNED = "_perf_sim_pinned"  # attribute of a host storage's Python object: "pinned"
_CPU = torch.device("cpu")
_lock = threading.Lock()
_libs: list[Any] = []
_device: torch.device | None = None
#: Why the installed device cannot be used (set once, by ``_check_autograd``).
_unusable: str | None = None


class SimulatedDeviceError(RuntimeError):
    """The simulated device cannot be installed in this process."""


# --------------------------------------------------------------------------------------------
# host view <-> sim tensor


#: id(host view) -> (host view, sim tensor) of one op's arguments
_Seen = dict[int, tuple[torch.Tensor, torch.Tensor]]


def _is_sim(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == NAME


def host_view(t: torch.Tensor) -> torch.Tensor:
    """The host tensor that holds a sim tensor's data (same sizes, strides and offset)."""
    host = getattr(t.untyped_storage(), _HOST, None)
    if host is None:
        raise RuntimeError(
            f"perf.simulated: this {NAME} tensor has no host storage (it was made by an "
            "operation the simulated device does not support); please report the operation"
        )
    out = aten.empty.memory_format([0], dtype=t.dtype, device=_CPU)
    return aten.set_.source_Storage_storage_offset(
        out, host, t.storage_offset(), t.size(), t.stride()
    )


def storage_of(t: torch.Tensor) -> Any:
    """The storage that holds ``t``'s data: for a sim tensor its host storage (real data
    pointer and size), else ``t.untyped_storage()``. Meters that key by storage use this."""
    if t.device.type == NAME:
        host = getattr(t.untyped_storage(), _HOST, None)
        if host is not None:
            return host
    return t.untyped_storage()


def _repoint(outer: torch.Tensor, cpu: torch.Tensor) -> None:
    """Make ``outer`` describe ``cpu``: its host storage and its sizes/strides/offset."""
    st = outer.untyped_storage()
    if getattr(st, _HOST, None) is not None and getattr(st, _HOST)._cdata != (
        cpu.untyped_storage()._cdata
    ):
        st = torch._C._acc.create_empty_tensor((0,), cpu.dtype).untyped_storage()
    setattr(st, _HOST, cpu.untyped_storage())
    aten.set_.source_Storage_storage_offset.redispatch(
        _META, outer, st, cpu.storage_offset(), cpu.size(), cpu.stride()
    )


def _wrap(cpu: torch.Tensor) -> torch.Tensor:
    """A new sim tensor sharing the host tensor's data."""
    out = torch._C._acc.create_empty_tensor((0,), cpu.dtype)
    _repoint(out, cpu)
    return out


def _check_mixed(op: Any, t: torch.Tensor) -> None:
    # CUDA accepts host *scalars* (0-dim) beside device tensors, and host index tensors in
    # indexing; anything else is the classic "forgot to move it" bug, which must fail here too.
    if t.dim() == 0 or op.__name__.split(".")[0] in _HOST_OK_OPS:
        return
    raise RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{NAME}:0 and cpu! (in {op.__name__}; the simulated device fails where CUDA would)"
    )


_HOST_OK_OPS = frozenset(
    ["index", "_index_put_impl_", "index_put_", "index_put", "_unsafe_index", "copy_", "_copy_from"]
)


def _unwrap(op: Any, x: Any, seen: _Seen) -> Any:
    if isinstance(x, torch.Tensor):
        if x.device.type == NAME:
            h = host_view(x)
            seen[id(h)] = (h, x)
            return h
        if x.device.type == "cpu":
            _check_mixed(op, x)
        return x
    if isinstance(x, (list, tuple)) and x and any(isinstance(v, torch.Tensor) for v in x):
        return type(x)(_unwrap(op, v, seen) if v is not None else None for v in x)
    if isinstance(x, torch.device) and x.type == NAME:
        return _CPU
    return x


def _rewrap(x: Any, seen: _Seen) -> Any:
    if isinstance(x, torch.Tensor):
        pair = seen.get(id(x))
        if pair is None:
            if torch.is_inference_mode_enabled() and _views_normal_tensor(x, seen):
                # A view of a normal tensor is normal, also inside inference_mode (autograd
                # shares the base's version counter with it).
                with torch.inference_mode(False):
                    return _wrap(x)
            return _wrap(x)
        outer = pair[1]
        if (
            outer.size() != x.size()
            or outer.stride() != x.stride()
            or outer.storage_offset() != x.storage_offset()
            or getattr(outer.untyped_storage(), _HOST)._cdata != x.untyped_storage()._cdata
        ):
            _repoint(outer, x)  # resize_, set_, out= that resized
        return outer
    if isinstance(x, (list, tuple)):
        return type(x)(_rewrap(v, seen) for v in x)
    return x


#: Called as ``listener(name)`` for every sync on the simulated device: the device-level view,
#: like CUDA's sync debug mode, which also sees syncs inside code that disables Python modes
#: (printing a tensor does).
sync_listeners: list[Any] = []

_SYNC_OPS: dict[Any, str] = {
    aten._local_scalar_dense.default: "item",
    aten.nonzero.default: "nonzero",
    aten.nonzero.out: "nonzero",
    aten.masked_select.default: "masked_select",
    aten.masked_select.out: "masked_select",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique_consecutive",
    aten.unique_dim_consecutive.default: "unique_consecutive",
    aten.equal.default: "equal",
}


def _sync_name(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    name = _SYNC_OPS.get(op)
    if name is not None:
        return name
    if op is aten.index.Tensor:
        idx = args[1] if len(args) > 1 else kwargs.get("indices", [])
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx):
            return "bool_mask_index"
    elif op is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        return "repeat_interleave"
    return None


def _notify(name: str) -> None:
    for listener in list(sync_listeners):
        listener(name)


_NUMBER_TYPES = (bool, int, float, complex)
_TENSOR_PARAMS: dict[Any, tuple[bool, ...]] = {}  # op -> whether each positional wants a Tensor
_CATEGORY = {bool: 0, int: 1, float: 2, complex: 3}


def _category(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    return 2 if dtype.is_floating_point else 1


def _rewrap_numbers(op: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Python numbers where the schema wants a Tensor back into 0-dim tensors.

    Boxed kernels hand "wrapped numbers" (the scalar in ``x % 3``) to Python as numbers; the
    out= kernel that structured ops call wants a Tensor. The tensor gets the dtype the wrapped
    number would promote to beside the first tensor argument (it only counts by category).
    """
    wants = _TENSOR_PARAMS.get(op)
    if wants is None:
        wants = tuple(isinstance(a.type, torch._C.TensorType) for a in op._schema.arguments)
        _TENSOR_PARAMS[op] = wants
    like = next((a for a in args if isinstance(a, torch.Tensor)), None)
    out = list(args)
    for i, a in enumerate(args):
        if type(a) not in _NUMBER_TYPES or i >= len(wants) or not wants[i]:
            continue
        if like is not None and _CATEGORY[type(a)] <= _category(like.dtype):
            dtype = like.dtype
        else:
            dtype = {
                bool: torch.bool,
                int: torch.int64,
                float: torch.get_default_dtype(),
                complex: torch.complex64
                if torch.get_default_dtype() == torch.float32
                else torch.complex128,
            }[type(a)]
        out[i] = aten.scalar_tensor.default(a, dtype=dtype, device=_CPU)
    return tuple(out)


def _views_normal_tensor(x: torch.Tensor, seen: _Seen) -> bool:
    st = x.untyped_storage()._cdata
    return any(
        not outer.is_inference() and h.untyped_storage()._cdata == st for h, outer in seen.values()
    )


def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Every op on a sim tensor: run the CPU kernel on host views, wrap what comes out."""
    special = _SPECIAL.get(op)
    if special is not None:
        return special(*args, **kwargs)
    if sync_listeners:
        name = _sync_name(op, args, kwargs)
        if name is not None:
            _notify(name)
    seen: _Seen = {}
    if any(type(a) in _NUMBER_TYPES for a in args):
        args = _rewrap_numbers(op, args)
    cargs = [_unwrap(op, a, seen) for a in args]
    ckw = {k: _unwrap(op, v, seen) for k, v in kwargs.items()}
    if ckw.get("pin_memory"):
        ckw["pin_memory"] = False
    try:
        out = op(*cargs, **ckw)
    except NotImplementedError as e:
        raise NotImplementedError(
            f"perf's simulated device runs every op with its CPU kernel, and {op.__name__} has "
            f"none (PyTorch picks it only for non-CPU devices; it exists for CUDA): the "
            f"simulated device cannot run this code. ({e})"
        ) from None
    return _rewrap(out, seen)


def _notify_copy(src_sim: bool, dst_sim: bool, non_blocking: bool) -> None:
    if sync_listeners and not non_blocking and src_sim != dst_sim:
        _notify("d2h_copy" if src_sim else "h2d_copy")


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    _notify_copy(_is_sim(src), _is_sim(dst), non_blocking)
    s = host_view(src) if _is_sim(src) else src
    d = host_view(dst) if _is_sim(dst) else dst
    aten.copy_.default(d, s)
    return dst


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.size() != src.size():
        aten.resize_.default(dst, src.size())
    return _copy_from(src, dst)


def _to_copy(
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
    _notify_copy(_is_sim(self), not to_host, non_blocking)
    src = host_view(self) if _is_sim(self) else self
    out = aten._to_copy.default(
        src, dtype=dtype, layout=layout, device=_CPU, memory_format=memory_format
    )
    if to_host:
        if pin_memory or non_blocking:
            setattr(out.untyped_storage(), _PINNED, True)
        return out
    return _wrap(out)


def _conv(
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
    seen: _Seen = {}
    args = [_unwrap(aten.convolution.default, a, seen) for a in (x, w, b)]
    return _wrap(
        aten.convolution.default(
            *args, stride, padding, dilation, transposed, output_padding, groups
        )
    )


def _conv_backward(
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
    seen: _Seen = {}
    g, xh, wh = (_unwrap(aten.convolution.default, a, seen) for a in (grad, x, w))
    bias_sizes = [wh.size(1) * groups if transposed else wh.size(0)]
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
    return tuple(None if o is None else _wrap(o) for o in outs)


_SPECIAL: dict[Any, Any] = {
    aten._copy_from.default: _copy_from,
    aten._copy_from_and_resize.default: _copy_from_and_resize,
}


# --------------------------------------------------------------------------------------------
# pinned host memory


def _cpu_is_pinned(self: torch.Tensor, device: Any = None) -> bool:
    return bool(getattr(self.untyped_storage(), _PINNED, False))


def _cpu_pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    if device is not None and torch.device(device).type not in (NAME, "cpu"):
        raise RuntimeError(
            f"pin_memory(device={device!r}) in a process where perf's simulated device is "
            f"installed: only {NAME!r} pinned memory exists here; run the {device} code in "
            "another process"
        )
    out = aten.empty_strided.default(self.size(), self.stride(), dtype=self.dtype, device=_CPU)
    aten.copy_.default(out, self)
    setattr(out.untyped_storage(), _PINNED, True)
    return out


def _sim_is_pinned(self: torch.Tensor, device: Any = None) -> bool:
    return False


# --------------------------------------------------------------------------------------------
# autocast: CUDA's policy (aten/src/ATen/autocast_mode.cpp, torch 2.x)


def _names(text: str) -> list[str]:
    return text.split()


_LOWER = _names("""_convolution _convolution.deprecated conv1d conv2d conv3d conv_tbc
conv_transpose1d conv_transpose2d.input conv_transpose3d.input convolution prelu addmm addmv
addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot
_thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
_scaled_dot_product_flash_attention scaled_dot_product_attention""")
_FP32 = _names("""acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan
pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm group_norm
frobenius_norm.dim nuclear_norm nuclear_norm.dim cosine_similarity poisson_nll_loss
cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss
huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss
triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm
logsumexp upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d
_upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d
upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d
_upsample_bicubic2d_aa norm.Scalar norm.ScalarOpt_dim norm.names_ScalarOpt_dim""")
_FP32_SET_OPT_DTYPE = _names("""prod prod.dim_int prod.dim_Dimname softmax.int softmax.Dimname
log_softmax.int log_softmax.Dimname cumprod cumprod.dimname cumsum cumsum.dimname
linalg_vector_norm linalg_matrix_norm linalg_matrix_norm.str_ord sum sum.dim_IntList
sum.dim_DimnameList""")
_PROMOTE = _names("""addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot
scatter_add""")
_BANNED = ["binary_cross_entropy"]


def _eligible(x: Any) -> bool:
    return (
        isinstance(x, torch.Tensor)
        and x.device.type == NAME
        and x.is_floating_point()
        and x.dtype != torch.float64
    )


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if _eligible(x) and x.dtype != dtype:
        return aten._to_copy.default(x, dtype=dtype)
    if isinstance(x, (list, tuple)) and any(_eligible(v) for v in x):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _autocast_kernel(op: Any, policy: str) -> Any:
    key = torch._C.DispatchKey.AutocastPrivateUse1  # type: ignore[attr-defined]  # no stub
    after = torch._C._dispatch_keyset_full_after(key)
    schema_args = op._schema.arguments

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        ks = keyset & after
        if policy == "banned":
            raise RuntimeError(
                f"{op.__name__} is unsafe to autocast (as on CUDA): use "
                "binary_cross_entropy_with_logits or BCEWithLogitsLoss"
            )
        if policy == "lower":
            dt = torch.get_autocast_dtype(NAME)
        elif policy == "fp32":
            dt = torch.float32
        elif policy == "promote":
            dt = torch.get_autocast_dtype(NAME)
            for a in (*args, *kwargs.values()):
                for v in a if isinstance(a, (list, tuple)) else (a,):
                    if _eligible(v) and v.dtype == torch.float32:
                        dt = torch.float32
        else:  # fp32_set_opt_dtype: an explicit dtype wins; else float32 when eligible
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is None or not _eligible(first):
                return op.redispatch(ks, *args, **kwargs)
            for i, a in enumerate(schema_args):
                if a.name == "dtype":
                    if i < len(args):
                        if args[i] is None:
                            args = (*args[:i], torch.float32, *args[i + 1 :])
                    elif kwargs.get("dtype") is None:
                        kwargs["dtype"] = torch.float32
            return op.redispatch(ks, *args, **kwargs)
        args = tuple(_cast(a, dt) for a in args)
        kwargs = {k: _cast(v, dt) for k, v in kwargs.items()}
        return op.redispatch(ks, *args, **kwargs)

    return kernel


def _register_structured(lib: Any) -> None:
    """Run structured ops' functional forms directly. Their default kernel for other backends
    allocates the output (one fallback call) and then calls the ``out=`` form (another); going
    straight to the CPU kernel halves the simulation's cost of most pointwise ops."""
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::") or name in _OWN_KERNELS:
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(
            name, "CompositeExplicitAutogradNonFunctional"
        ) and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"):
            packet, _, overload = name[len("aten::") :].partition(".")
            op = getattr(getattr(aten, packet), overload or "default")
            lib.impl(op, functools.partial(_fallback, op), "PrivateUse1")


#: ops with a kernel of their own here (not the generic fallback)
_OWN_KERNELS = frozenset(
    [
        "aten::_to_copy",
        "aten::is_pinned",
        "aten::convolution_overrideable",
        "aten::convolution_backward_overrideable",
    ]
)


def _register_autocast(lib: Any) -> None:
    for policy, names in (
        ("lower", _LOWER),
        ("fp32", _FP32),
        ("set_opt_dtype", _FP32_SET_OPT_DTYPE),
        ("promote", _PROMOTE),
        ("banned", _BANNED),
    ):
        for name in names:
            packet, _, overload = name.partition(".")
            try:
                op = getattr(getattr(aten, packet), overload or "default")
            except AttributeError:
                continue  # not in this torch version
            lib.impl(op, _autocast_kernel(op, policy), "AutocastPrivateUse1", with_keyset=True)


# --------------------------------------------------------------------------------------------
# the backend module (torch.sim) and installation


class _SimModule:
    """``torch.sim``: what torch asks of a backend module (one device, always ready)."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def set_device(device: Any) -> None:
        pass

    @staticmethod
    def synchronize(device: Any = None) -> None:
        pass  # all simulated work is synchronous

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed(seed: int) -> None:
        pass  # sim ops draw from the CPU generator

    manual_seed_all = manual_seed

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    @staticmethod
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return True


def _keep_parameters_on_move() -> None:
    """``module.to(cuda)`` keeps each Parameter object (``param.data = moved``); for PrivateUse1
    devices PyTorch makes new ones, which unties weights tied before the move (nanoGPT's
    wte / lm_head) and leaves optimizers made before it holding stale parameters. For moves to
    or from ``sim`` only, ``Module.to`` / ``Module.cpu`` swap instead (PyTorch's
    ``torch.__future__.set_swap_module_params_on_conversion``), which keeps them."""
    module = torch.nn.Module
    plain_to, plain_cpu = module.to, module.cpu

    def involves_sim(m: torch.nn.Module, target: Any) -> bool:
        tensors = (*m.parameters(), *m.buffers())
        if any(weakref.getweakrefcount(t) for t in tensors):
            return False  # swapping refuses weakly referenced tensors: PyTorch's default path
        if target is not None and torch.device(target).type == NAME:
            return True
        return any(t.device.type == NAME for t in tensors)

    def swapping(call: Any, m: torch.nn.Module, target: Any, *args: Any, **kwargs: Any) -> Any:
        fut = torch.__future__
        if fut.get_swap_module_params_on_conversion() or not involves_sim(m, target):
            return call(m, *args, **kwargs)
        fut.set_swap_module_params_on_conversion(True)
        try:
            return call(m, *args, **kwargs)
        finally:
            fut.set_swap_module_params_on_conversion(False)

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        target = torch._C._nn._parse_to(*args, **kwargs)[0]
        return swapping(plain_to, self, target, *args, **kwargs)

    def cpu(self: torch.nn.Module) -> Any:
        return swapping(plain_cpu, self, None)

    to.__doc__, cpu.__doc__ = plain_to.__doc__, plain_cpu.__doc__
    module.to, module.cpu = to, cpu  # type: ignore[method-assign]


def unavailable_reason() -> str | None:
    """Why ``simulated_device()`` would fail in this process, or None."""
    if _device is not None:
        return None
    missing = _requirements_missing()
    if missing is not None:
        return f"torch {torch.__version__} lacks {missing}"
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", NAME):
        return f"the PrivateUse1 backend slot already belongs to {current!r}"
    return None


def _requirements_missing() -> str | None:
    acc = getattr(torch._C, "_acc", None)
    if acc is None or not hasattr(acc, "create_empty_tensor"):
        return "torch._C._acc.create_empty_tensor (the Python PrivateUse1 backend hooks)"
    try:
        from torch.utils.backend_registration import (  # noqa: F401
            _setup_privateuseone_for_python_backend,
        )
    except ImportError:
        return "torch.utils.backend_registration._setup_privateuseone_for_python_backend"
    if not hasattr(torch.library.Library, "fallback"):
        return "torch.library.Library.fallback"
    return None


def simulated_device(*, allow_with_accelerator: bool = False) -> torch.device:
    """The simulated accelerator ``sim:0``, installed into this process on first call.

    Raises ``SimulatedDeviceError`` naming the reason where it cannot work: this torch lacks the
    Python backend hooks, ``PrivateUse1`` already belongs to another backend, or the process
    has a real accelerator (``sim`` would become its current accelerator and take over
    ``pin_memory()``; pass ``allow_with_accelerator=True`` to install it anyway, untested).
    """
    global _device
    with _lock:
        if _unusable is not None:
            raise SimulatedDeviceError(_unusable)
        if _device is not None:
            return _device
        if torch.cuda.is_available() and not allow_with_accelerator:
            raise SimulatedDeviceError(
                "this process has CUDA: count syncs on cuda directly; the simulated device is "
                "for CPU-only boxes (to compare both, run the simulated side in another "
                "process, as tests/benchmarks/test_sim_parity.py does)"
            )
        missing = _requirements_missing()
        if missing is not None:
            raise SimulatedDeviceError(
                f"perf's simulated device needs {missing}, which torch {torch.__version__} "
                "does not have (tested: torch 2.13.0); count syncs on a real device instead"
            )
        current = torch._C._get_privateuse1_backend_name()
        if current != "privateuseone" and current != NAME:
            raise SimulatedDeviceError(
                f"perf's simulated device needs the PrivateUse1 backend slot, but this process "
                f"already registered backend {current!r} there; use the simulated device in a "
                "process without it"
            )
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        if current != NAME:
            _setup_privateuseone_for_python_backend(NAME, backend_module=_SimModule())
        fb = torch.library.Library("_", "IMPL")
        fb.fallback(_fallback, "PrivateUse1")
        # Ops without an autocast rule pass through, as for AutocastCUDA.
        fb.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("is_pinned", _cpu_is_pinned, "CPU")
        lib.impl("_pin_memory", _cpu_pin_memory, "CPU")
        lib.impl("is_pinned", _sim_is_pinned, "PrivateUse1")
        lib.impl("_to_copy", _to_copy, "PrivateUse1")
        lib.impl("convolution_overrideable", _conv, "PrivateUse1")
        lib.impl("convolution_backward_overrideable", _conv_backward, "PrivateUse1")
        _register_autocast(lib)
        _register_structured(lib)
        _libs.extend([fb, lib])
        _keep_parameters_on_move()
        _device = torch.device(NAME, 0)
        _check_autograd(_device)
        return _device


def _check_autograd(device: torch.device) -> None:
    """One tiny backward on the new device. The autograd engine sizes its per-device queues
    once, at the first backward of the process: a device installed after that cannot run
    backward at all (an internal assert in torch), so say so here, once, clearly."""
    global _unusable
    x = torch.ones(1, device=device, requires_grad=True)
    try:
        (x * 2).sum().backward()
    except RuntimeError as e:
        if "device_ready_queues_" not in str(e):
            raise
        _unusable = (
            "the simulated device was installed after this process's first backward pass, and "
            "autograd fixes its devices at that moment: call perf.simulated_device() before "
            "any backward (e.g. at import time of your conftest.py); the pytest plugin does "
            "this itself for --perf-devices"
        )
        raise SimulatedDeviceError(_unusable) from None
