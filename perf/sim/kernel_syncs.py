"""Syncs that CUDA kernels make inside an op: one list for ``cuda:0`` and ``sim`` alike.

Why one list: a ``TorchDispatchMode`` sees an op, not the ``.item()`` / ``nonzero`` / blocking
copy its CUDA kernel makes inside (the mode is off while the op runs), and ``sim`` runs the CPU
kernel on host views, where those reads are host reads. Both sides therefore count a CUDA
kernel's inner syncs by rule, from the op and its arguments: :func:`kernel_syncs`.

Each rule cites the CUDA source it follows (read at pytorch main as mirrored in
``cyyever/pytorch`` and ``pytorch/pytorch``, the commits named in ``docs/sim.md``; torch
2.13.0 itself is ``cf30153c``). A sync is what ``torch.cuda.set_sync_debug_mode("warn")``
flags: ``c10::cuda::memcpy_and_sync`` and ``stream_synchronize`` (``c10/cuda/CUDAFunctions.h``)
call ``warn_or_error_on_sync``; ``.item()`` is ``_local_scalar_dense_cuda`` ->
``memcpy_and_sync``; a blocking host-device copy is ``copy_kernel_cuda`` -> ``memcpy_and_sync``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

aten = torch.ops.aten

#: ``is_dev(t)``: whether a tensor lives on the accelerator being counted
IsDev = Callable[[torch.Tensor], bool]
#: ``rule(args, kwargs, is_dev) -> syncs``
Rule = Callable[[tuple[Any, ...], dict[str, Any], IsDev], int]

#: >0 while ``Tensor.__setitem__`` runs with a Python number as the value: CUDA makes that
#: value a CPU scalar (``python_variable_indexing.cpp`` ``THPVariable_setitem``:
#: ``else if (self_device.is_cuda()) value = valueToTensor(..., at::Device(kCPU))``), every
#: other device a device scalar; sim counts as CUDA, so it treats that scalar as a host one.
host_scalar_setitem = [0]


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _one(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    return 1


def _equal(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # cuda/Equal.cpp cuda_equal: sizes differ -> false, numel 0 -> true, the alias fast path
    # (same storage, offset, dtype, strides, layout, neg/conj bits) -> true; only then
    # ``at::cuda::eq(self, src).all().item()``.
    a, b = args[0], args[1]
    if a.size() != b.size() or a.numel() == 0:
        return 0
    # is_alias_of: the same storage (sim's views wrap the same host storage in a new one)
    same = torch._C._is_alias_of(a, b) or (  # type: ignore[attr-defined]
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )
    alias = (
        same
        and a.storage_offset() == b.storage_offset()
        and a.dtype == b.dtype
        and a.stride() == b.stride()
        and a.layout == b.layout
        and a.is_neg() == b.is_neg()
        and a.is_conj() == b.is_conj()
    )
    return 0 if alias else 1


def _unique(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # cuda/UniqueCub.cu unique_cuda_template: no elements -> early return; else compute_unique's
    # ``num_out = length.item<int64_t>()`` (bool input: ``memcpy_and_sync`` of the true count)
    return 1 if args[0].numel() else 0


def _unique_dim(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # cuda/Unique.cu unique_dim_cuda_template: an empty dim returns early; else
    # ``thrust::unique(...) - data`` reads the count on the host. Thrust synchronizes the stream
    # itself, not through c10's warn_or_error_on_sync: the debug mode does not flag it; perf
    # counts it, as the host read of a data-dependent size that it is (docs/sim.md).
    x, dim = args[0], _arg(args, kwargs, 1, "dim", 0)
    return 1 if x.size(dim) else 0


def _unique_consecutive(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # Unique.cu unique_consecutive_cuda: without dim the cub path (as _unique2), else unique_dim's
    dim = _arg(args, kwargs, 3, "dim", None)
    if dim is None:
        return _unique(args, kwargs, is_dev)
    return _unique_dim((args[0], dim), {}, is_dev)


def _repeat_interleave(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # Repeat.h repeat_interleave_common: empty repeats return early; without output_size
    # ``cumsum[-1].item<int64_t>()`` and ``(repeats >= 0).all().item<uint8_t>()``: two.
    if args[0].numel() == 0 or _arg(args, kwargs, 1, "output_size", None) is not None:
        return 0
    return 2


def _bincount(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # cuda/SummaryOps.cu _bincount_cuda_template: an empty 1-d input returns zeros; else
    # ``*self_min.cpu()...`` (a blocking copy; skipped for uint8) and ``self_max.item()``.
    x = args[0]
    if x.dim() == 1 and x.numel() == 0:
        return 0
    return 1 if x.dtype == torch.uint8 else 2


def _histc(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # cuda/SummaryOps.cu _histc_cuda_template: ``if (min == max && self.numel() > 0)`` reads
    # ``min_tensor.item()`` and ``max_tensor.item()``; an explicit range reads nothing.
    lo, hi = _arg(args, kwargs, 2, "min", 0), _arg(args, kwargs, 3, "max", 0)
    return 2 if lo == hi and args[0].numel() > 0 else 0


def _multinomial(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # Distributions.cpp multinomial_out (CPU and CUDA share it): an empty result returns; the
    # fast path ``if (!with_replacement || n_sample == 1)`` checks its input. torch 2.13 (and
    # 2.11, measured: CUDA's debug mode saw no sync on an H200) checks with
    # ``at::_assert_async`` (a device-side assert: no sync); torches before pytorch#134818
    # read ``is_valid.item()`` and ``zero_prob_condition .item()``: two syncs. With
    # replacement the CUDA kernel (cuda/MultinomialKernel.cu) asserts on the device instead.
    x, n = args[0], _arg(args, kwargs, 1, "num_samples", 1)
    replacement = _arg(args, kwargs, 2, "replacement", False)
    if x.numel() == 0 or (x.dim() == 2 and x.size(0) == 0):
        return 0
    if replacement and n != 1:
        return 0
    return 0 if multinomial_asserts_async() else 2


_ASSERTS_ASYNC: list[bool] = []


def multinomial_asserts_async() -> bool:
    """Whether this torch's ``multinomial`` checks its input with ``_assert_async`` (no sync
    on CUDA) rather than two ``.item()`` reads. The release that changed it is not recorded
    here, so it is read off this torch, once: a CPU ``multinomial`` (with a generator of its
    own) under the autograd profiler, which lists the ops it calls inside. Inside another
    profiler (which one cannot nest) it answers for torch 2.11 and later, as measured,
    without caching the guess."""
    if _ASSERTS_ASYNC:
        return _ASSERTS_ASYNC[0]
    from torch.autograd import profiler
    from torch.utils._python_dispatch import _disable_current_modes

    if torch.autograd._profiler_enabled():
        return tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 11)
    with _disable_current_modes(), profiler.profile(use_kineto=False) as prof:
        # a generator of its own: the probe runs inside the user's program (the first
        # multinomial it counts) and must not advance its random stream
        torch.multinomial(torch.ones(2), 1, generator=torch.Generator())
    _ASSERTS_ASYNC.append(any(e.name == "aten::_assert_async" for e in prof.function_events))
    return _ASSERTS_ASYNC[0]


def _check_errors(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # BatchLinearAlgebra.cpp: the ``*_ex`` kernels call ``at::_linalg_check_errors`` when
    # ``check_errors``, which reads ``infos.any().item<bool>()`` (one sync when all is well).
    return 1 if kwargs.get("check_errors", False) else 0


def _tensor_ends(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    ends = (_arg(args, kwargs, 0, "start", None), _arg(args, kwargs, 1, "end", None))
    return sum(isinstance(t, torch.Tensor) and is_dev(t) for t in ends)


def _is_mask(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _index(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # index.Tensor's meta function -> TensorAdvancedIndexingUtils.h make_info ->
    # IndexingUtils.h expandTensors(..., ensure_same_device=true): a device mask is
    # ``index.nonzero()`` (cuda/Nonzero.cu: memcpy_and_sync of the count); a host mask is
    # nonzero on the host, moved pinned and non_blocking; a host integer index is
    # ``index.to(self.device())``: a blocking copy.
    idx = _arg(args, kwargs, 1, "indices", [])
    n = 0
    for i in idx:
        if isinstance(i, torch.Tensor):
            if is_dev(i):
                n += _is_mask(i)
            elif not _is_mask(i):
                n += 1
    return n


def _index_put(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # TensorAdvancedIndexing.cpp _index_put_impl_ (index_put_, index_put, _unsafe_index_put
    # all end there):
    #   not accumulate and canDispatchToMaskedFill (one device mask, a one-element host value)
    #     -> ``masked_fill_(mask, value.item())``: a host read, no sync;
    #   a 0-dim value on another device -> ``value.to(self.device())``: a blocking copy;
    #   accumulate (or deterministic with value.numel() > 1) -> cuda/Indexing.cu
    #     index_put_with_sort_kernel -> makeLinearIndex -> expandTensors (no ensure_same_device):
    #     a device mask is one nonzero; a host index is ``.to(device)`` per index column,
    #     blocking; device integer indices are range-checked with _assert_async (no sync);
    #   else make_info, as for index.Tensor.
    idx = list(_arg(args, kwargs, 1, "indices", []))
    value = _arg(args, kwargs, 2, "values", None)
    accumulate = bool(_arg(args, kwargs, 3, "accumulate", False))
    host_value = isinstance(value, torch.Tensor) and (
        not is_dev(value) or (host_scalar_setitem[0] > 0 and value.dim() == 0)
    )
    given = [i for i in idx if isinstance(i, torch.Tensor)]
    if (
        not accumulate
        and host_value
        and value.numel() == 1
        and len(given) == 1
        and _is_mask(given[0])
        and is_dev(given[0])
    ):
        return 0
    n = 1 if host_value and value.dim() == 0 else 0
    det = torch.are_deterministic_algorithms_enabled() and value.numel() > 1
    if not (accumulate or det):
        return n + _index(args, kwargs, is_dev)
    for i in given:
        if is_dev(i):
            n += _is_mask(i)
        else:
            n += max(i.dim(), 1) if _is_mask(i) else 1
    return n


def _uncoalesced(t: Any, is_dev: IsDev) -> bool:
    # cuda/SparseCUDATensor.cu _coalesce_sparse_cuda: fewer than 2 entries are cloned and marked
    # coalesced; otherwise the new nnz is read back after thrust::unique_by_key ("this forces
    # device-host synchronization!"). coalesce() itself returns early for a coalesced tensor.
    return (
        isinstance(t, torch.Tensor)
        and t.is_sparse
        and is_dev(t)
        and not t.is_coalesced()
        and t._nnz() >= 2
    )


def _coalesce(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    return int(_uncoalesced(args[0], is_dev))


def _sparse_mm(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # mm / addmm of a sparse COO matrix (SparseCUDA: _sparse_mm -> _sparse_addmm ->
    # cuda/SparseCUDATensorMath.cu s_addmm_out_sparse_dense_cuda: ``sparse_.coalesce()``, then
    # cuSPARSE without host reads). The backward of mm(sparse, dense) multiplies by
    # ``sparse.t()``, which sparse_transpose_ marks uncoalesced: one read per backward.
    sparse = args[1] if len(args) > 2 else args[0]  # addmm(self, mat1, mat2) / mm(self, mat2)
    return int(_uncoalesced(sparse, is_dev))


def _to_sparse(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # TensorConversions.cpp dense_to_sparse: ``self.nonzero()``, one read of the count
    t = args[0]
    return int(isinstance(t, torch.Tensor) and not t.is_sparse and is_dev(t))


def _sparse_index_select(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # cuda/Indexing.cu index_select_sparse_cuda: along a sparse dimension, ``res_len =
    # intrsc_counts_nneg_index.sum().item<int64_t>()`` ("Unavoidable sync"); a dense dimension
    # is values.index_select, no read
    t, dim, index = args[0], _arg(args, kwargs, 1, "dim", 0), _arg(args, kwargs, 2, "index", None)
    if not (isinstance(t, torch.Tensor) and t.is_sparse and is_dev(t)):
        return 0
    dim = dim + t.dim() if dim < 0 else dim
    return int(dim < t.sparse_dim() and index is not None and index.numel() > 0)


def _nested_from_mask(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # nested/NestedTensorTransformerFunctions.cpp NestedTensor_nested_tensor_from_mask (CPU
    # and CUDA): ``if (mask_check) TORCH_CHECK(sizes.equal(nums), ...)`` (cuda_equal: one
    # read), then the sizes ``.to(kCPU)`` (one blocking copy) for ``_nested_from_padded``
    # (nn.TransformerEncoder's inference fast path, with a padding mask)
    t, mask = args[0], _arg(args, kwargs, 1, "mask", None)
    if not (isinstance(mask, torch.Tensor) and is_dev(mask)) or t.size(0) == 0:
        return 0
    return 1 + bool(_arg(args, kwargs, 2, "mask_check", True))


def _nested_left_aligned(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # the same file, NestedTensor_nested_tensor_from_mask_left_aligned: ``return
    # sizes.equal(nums)``, a bool on the host (cuda_equal: one read)
    mask = _arg(args, kwargs, 1, "mask", None)
    return int(isinstance(mask, torch.Tensor) and is_dev(mask) and mask.numel() > 0)


#: the compute capability ``sim`` stands for where CUDA code branches on it: an H100 (sm90),
#: here and for the memory model's defaults (:mod:`perf.sim.memory`)
SIM_CAPABILITY = (9, 0)


def _capability(t: torch.Tensor) -> tuple[int, int]:
    if t.is_cuda:
        return torch.cuda.get_device_capability(t.device)
    return SIM_CAPABILITY


def _grouped_mm(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    # cuda/GroupedBlas.cpp _grouped_mm_cuda: bf16 operands and output on sm90 / sm100
    # (``_scaled_mm_allowed_device(true, true)``: major 9 or 10) take the CUTLASS kernel, "fast
    # path, no d2h sync needed"; everything else runs GroupedMMUtils.h _grouped_mm_fallback,
    # whose 2d-3d, 3d-2d and 2d-2d cases read ``offs.value().cpu()`` (one blocking copy) to
    # loop over the groups; 3d-3d is one bmm. (ROCm's composable-kernel path is not modelled.)
    a, b = args[0], args[1]
    offs = _arg(args, kwargs, 2, "offs", None)
    out_dtype = _arg(args, kwargs, 4, "out_dtype", None)
    if offs is None or offs.numel() == 0 or not is_dev(a) or (a.dim() == 3 and b.dim() == 3):
        return 0
    bf16 = a.dtype == b.dtype == torch.bfloat16 and out_dtype in (None, torch.bfloat16)
    return 0 if bf16 and _capability(a)[0] in (9, 10) else 1


def _ctc(first: int) -> Rule:
    """The rule of ``_ctc_loss`` (``first=0``: log_probs first) or ``_ctc_loss_backward``
    (``first=1``: after grad), either overload."""

    def rule(args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
        # cuda/LossCTC.cu ctc_loss_gpu_template / ctc_loss_backward_gpu_template (the CUDA
        # kernels of _ctc_loss and _ctc_loss_backward): ``at::tensor(target_lengths,
        # targets.options()...)`` and ``at::tensor(input_lengths, ...)`` (a host tensor, then
        # ``.to(device)``) and ``tg_batch_offsets.cuda()``: three blocking host-to-device
        # copies (copy_kernel_cuda -> memcpy_and_sync; none for an empty batch). LossCTC.cpp
        # ctc_loss_tensor / ctc_loss_backward_tensor (``CPU, CUDA:`` of the .Tensor overloads)
        # first copy each length tensor ``.to(Device(at::kCPU), at::kLong)``: one blocking
        # copy more for each on the device.
        lp = _arg(args, kwargs, first, "log_probs", None)
        if not (isinstance(lp, torch.Tensor) and is_dev(lp)) or lp.dim() != 3 or not lp.size(1):
            return 0
        lengths = (
            _arg(args, kwargs, first + 2, "input_lengths", None),
            _arg(args, kwargs, first + 3, "target_lengths", None),
        )
        return 3 + sum(isinstance(t, torch.Tensor) and is_dev(t) and t.numel() > 0 for t in lengths)

    return rule


def _ops(*names: str) -> list[Any]:
    out = []
    for name in names:
        packet, _, overload = name.partition(".")
        p = getattr(aten, packet, None)
        if p is not None and hasattr(p, overload or "default"):
            out.append(getattr(p, overload or "default"))
    return out


#: op name (``native_functions.yaml``) -> (sync label, rule)
BY_NAME: dict[str, tuple[str, Rule]] = {
    # cuda/CUDAScalar.cu _local_scalar_dense_cuda: memcpy_and_sync of one element
    "_local_scalar_dense": ("item", _one),
    # cuda/Nonzero.cu nonzero_cuda_out_impl: ``at::cuda::memcpy_and_sync`` of the count
    "nonzero": ("nonzero", _one),
    "nonzero.out": ("nonzero", _one),
    # cuda/IndexKernel.cpp masked_select_out_cuda_impl: ``index_out(result, self, {mask})``:
    # one nonzero
    "masked_select": ("masked_select", _one),
    "masked_select.out": ("masked_select", _one),
    "_unique": ("unique", _unique),
    "_unique2": ("unique", _unique),
    "unique_dim": ("unique", _unique_dim),
    "unique_consecutive": ("unique_consecutive", _unique_consecutive),
    "unique_dim_consecutive": ("unique_consecutive", _unique_dim),
    "equal": ("equal", _equal),
    "repeat_interleave.Tensor": ("repeat_interleave", _repeat_interleave),
    "bincount": ("bincount", _bincount),
    "histc": ("histc", _histc),
    "histc.out": ("histc", _histc),
    "_grouped_mm": ("grouped_mm", _grouped_mm),
    "_nested_tensor_from_mask": ("nested_from_mask", _nested_from_mask),
    "_nested_tensor_from_mask_left_aligned": ("nested_from_mask", _nested_left_aligned),
    "multinomial": ("multinomial", _multinomial),
    "multinomial.out": ("multinomial", _multinomial),
    "index.Tensor": ("bool_mask_index", _index),
    "index.Tensor_out": ("bool_mask_index", _index),
    "_coalesce": ("coalesce", _coalesce),
    "mm": ("sparse_mm", _sparse_mm),
    "addmm": ("sparse_mm", _sparse_mm),
    "_to_sparse": ("to_sparse", _to_sparse),
    "_to_sparse.sparse_dim": ("to_sparse", _to_sparse),
    "index_select": ("sparse_index_select", _sparse_index_select),
    "_index_put_impl_": ("index_put", _index_put),
    "index_put_": ("index_put", _index_put),
    "index_put": ("index_put", _index_put),
    "_unsafe_index_put": ("index_put", _index_put),
    "_ctc_loss": ("ctc_loss", _ctc(0)),
    "_ctc_loss.Tensor": ("ctc_loss", _ctc(0)),
    "_ctc_loss_backward": ("ctc_loss", _ctc(1)),
    "_ctc_loss_backward.Tensor": ("ctc_loss", _ctc(1)),
    **{
        f"{op}{suffix}": ("linalg_check_errors", _check_errors)
        for op, suffix in [
            ("linalg_cholesky_ex", ""),
            ("linalg_cholesky_ex", ".L"),
            ("linalg_inv_ex", ""),
            ("linalg_inv_ex", ".inverse"),
            ("linalg_lu_factor_ex", ""),
            ("linalg_lu_factor_ex", ".out"),
            ("linalg_ldl_factor_ex", ""),
            ("linalg_ldl_factor_ex", ".out"),
            ("_linalg_solve_ex", ""),
            ("_linalg_solve_ex", ".result"),
        ]
    },
    # native_functions.yaml gives CPU and CUDA one function each (``CPU, CUDA:
    # _linalg_eigh_out``, ``_linalg_svd_out``, ``cholesky``, ``cholesky_inverse``), which calls
    # ``at::_linalg_check_errors`` once after the device stub, whatever the arguments (the
    # inventory test observes the calls on CPU)
    **dict.fromkeys(
        [
            "_linalg_eigh",
            "_linalg_eigh.eigenvalues",
            "_linalg_svd",
            "_linalg_svd.U",
            "cholesky",
            "cholesky.out",
            "cholesky_inverse",
            "cholesky_inverse.out",
        ],
        ("linalg_check_errors", _one),
    ),
}

#: CompositeExplicitAutograd ops that sync in their own body: a dispatch mode on CUDA sees only
#: the op; on sim their inner ``.item()`` reaches the device and is counted there, so the label
#: is "item" on both sides.
COMPOSITE: dict[str, tuple[str, Rule]] = {
    # BatchLinearAlgebra.cpp _linalg_check_errors: ``infos.any().item<bool>()``
    "_linalg_check_errors": ("item", _one),
    # TensorCompare.cpp is_nonzero: ``self.item()``; allclose: ``isclose(...).all().item()``
    "is_nonzero": ("item", _one),
    "allclose": ("item", _one),
    # TensorFactories.cpp linspace / logspace with tensor ends: ``start.item()``, ``end.item()``
    **{
        f"{fn}.{ov}{out}": ("item", _tensor_ends)
        for fn in ("linspace", "logspace")
        for ov in ("Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor")
        for out in ("", "_out")
    },
    # LinearAlgebra.cpp linalg_pinv: one _linalg_eigh (hermitian) or _linalg_svd inside
    "linalg_pinv.atol_rtol_tensor": ("linalg_check_errors", _one),
    "linalg_pinv.atol_rtol_tensor_out": ("linalg_check_errors", _one),
}

#: ops tagged ``dynamic_output_shape`` / ``data_dependent_output`` or with ``check_errors``
#: whose CUDA kernel is not in :data:`BY_NAME`, and why (the inventory test checks this).
NOT_MODELLED: dict[str, str] = {
    "linalg_lstsq.out": "the CUDA lstsq driver's host reads are not derived here",
    "linalg_lstsq": "composite: runs linalg_lstsq.out",
    "linalg_eig": "CUDA computes eig on the host (MAGMA geev) with copies both ways; not derived",
    "linalg_eig.out": "as linalg_eig",
    "_cholesky_solve_helper": "a CUDA-specific kernel (cuSOLVER / MAGMA); not derived",
    "cholesky_solve": "composite: runs _cholesky_solve_helper",
    "cholesky_solve.out": "composite: runs _cholesky_solve_helper",
}
#: tagged ops that sync through ops both sides see (composite implicit), or never on CUDA
NO_KERNEL_SYNC: dict[str, str] = {
    "item": "composite: _local_scalar_dense",
    "one_hot": "composite: max().item() when num_classes=-1, seen as item",
    "argwhere": "composite: nonzero",
    "_lu_with_info": "composite: linalg_lu_factor_ex",
    "linalg_solve_ex": "composite: _linalg_solve_ex",
    "linalg_solve_ex.out": "composite: _linalg_solve_ex",
}


def _by_op(table: dict[str, tuple[str, Rule]]) -> dict[Any, tuple[str, Rule]]:
    return {op: table[name] for name in table for op in _ops(name)}


#: aten overload -> (label, rule), for the device fallback (sim) ...
KERNEL_RULES: dict[Any, tuple[str, Rule]] = _by_op(BY_NAME)
#: rules that count only when an argument is sparse: ``sim``'s C++ path, which hands every
#: sparse argument to Python, may run the dense calls of these ops itself (``perf.sim.native``)
SPARSE_ONLY_RULES: frozenset[Any] = frozenset([_sparse_mm, _sparse_index_select])
#: ... and for a dispatch mode over CUDA tensors, which also sees the composite ones
MODE_RULES: dict[Any, tuple[str, Rule]] = {**KERNEL_RULES, **_by_op(COMPOSITE)}


def kernel_syncs(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], is_dev: IsDev) -> int:
    """Syncs CUDA makes inside ``op`` for these arguments (0 for ops without a rule)."""
    entry = MODE_RULES.get(op)
    return 0 if entry is None else entry[1](args, kwargs, is_dev)


@contextlib.contextmanager
def cuda_stream_syncs(hit: Callable[[str], None]) -> Iterator[None]:
    """Count ``torch.cuda.Stream.synchronize()`` on CUDA while the block runs.

    ``CUDAStream::synchronize`` -> ``c10::cuda::stream_synchronize`` (``CUDAFunctions.h``)
    calls ``warn_or_error_on_sync``: the sync debug mode flags it, and it is no aten op, so no
    dispatch mode sees it. ``torch.cuda.synchronize()`` (``device_synchronize``) and
    ``Event.synchronize()`` (``CUDAEvent.h``: ``cudaEventSynchronize``) are not flagged and
    not counted. A generic ``torch.Stream`` is a C type that cannot be wrapped: not counted.
    """
    cls = torch.cuda.Stream
    plain = cls.__dict__["synchronize"]

    def synchronize(self: Any) -> None:
        hit("stream_synchronize")
        return plain(self)

    cls.synchronize = synchronize  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.synchronize = plain  # type: ignore[method-assign]
