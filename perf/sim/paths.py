"""CUDA's code paths on ``sim``: where torch branches on the device type, ``sim`` takes CUDA's
branch, not the one PyTorch takes for ``PrivateUse1`` (or the CPU).

Why: the simulated device is a ``PrivateUse1`` backend, and torch's composite operators and
Python modules sometimes choose by device type. Where the ``PrivateUse1`` branch differs from
CUDA's, code that runs on ``cuda:0`` failed on ``sim`` (``group_norm`` on a channels-last
input) or ran other operators than on CUDA (other op and sync counts). Each branch found is
in :data:`BRANCHES`, with what ``sim`` does; ``tests/harness/test_sim_paths.py`` tests each.

The branches where torch already treats ``PrivateUse1`` as CUDA (no code here; tested):
foreach optimizers as the default and ``fused=True`` (``torch/utils/_foreach_utils.py``
``_get_foreach_kernels_supported_devices`` / ``_get_fused_kernels_supported_devices`` list the
``PrivateUse1`` name beside ``cuda``), ``capturable`` optimizers (``torch/optim/optimizer.py``),
the fused RNN cells (``RNN.cpp``: ``is_cuda() || is_xpu() || is_privateuseone()``, kernels in
:mod:`perf.sim.cuda_ops`), ``pin_memory`` and DataLoader pinning (:mod:`perf.sim.kernels`),
autocast's cast lists (:mod:`perf.sim.autocast`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import textwrap
from typing import Any

import torch

from perf.sim.kernel_syncs import SIM_CAPABILITY
from perf.sim.tensors import NAME, aten, is_sim

__all__ = [
    "AUTOGRAD_KERNELS",
    "BRANCHES",
    "PLAIN_TYPES",
    "PYTHON_BRANCHES",
    "eager_plain",
    "follow_python_branches",
    "patch_setitem",
    "register_paths",
    "run_composite",
]

#: each device-type branch of torch that ``sim`` follows as CUDA: (where, what sim does)
BRANCHES: dict[str, tuple[str, str]] = {
    "group_norm memory format": (
        "aten/src/ATen/native/group_norm.cpp group_norm: channels-last input stays channels-last "
        "on CPU and PrivateUse1, input.contiguous() otherwise (CUDA)",
        "input.contiguous(), then native_group_norm's own kernel: output contiguous, as on CUDA",
    ),
    "composite-explicit kernels": (
        "native_functions.yaml: native_group_norm, native_layer_norm, addr, _stack, any/all.dims "
        "and linalg__powsum have CPU and CUDA kernels and a CompositeExplicitAutograd one that "
        "other backends run (math_group_norm: input.view(1, N*G, -1), several ops, no kernel); "
        "_grouped_mm has a CUDA kernel and a composite one (GroupedMMUtils.h "
        "_grouped_mm_fallback: offs.cpu(), one mm per group) that CPU and PrivateUse1 run",
        "the CPU kernel on host views: one kernel per op, as CUDA runs its own; _grouped_mm's "
        "read of offs is CUDA's rule (perf.sim.kernel_syncs: none on sm90 in bf16)",
    ),
    "compiled strides": (
        "torch/_meta_registrations.py: Inductor plans strides with the meta kernels, which give "
        "convolution channels-last only for device 'cuda' (contiguous for sim); the CPU kernel "
        "sim runs returns channels-last when the input or the weight is",
        "perf.sim.compile: the first call of each graph checks every op's output against the "
        "planned strides and copies where they differ; the graph keeps that copy",
    ),
    "setitem of a Python number": (
        "torch/csrc/autograd/python_variable_indexing.cpp THPVariable_setitem: for CUDA the "
        "value becomes a CPU scalar of the tensor's dtype (valueToTensor(..., kCPU)), for other "
        "devices a device scalar; TensorIndexing.h copy_to then copies it into a 0-dim "
        "destination (x[i] = 5 on a 1-d tensor: a blocking host-to-device copy, a sync) and "
        "fills a larger one; advanced indexing gets a host value (index_put_'s value.to())",
        "Tensor.__setitem__ makes the number a CPU scalar of the tensor's dtype first, so the "
        "same copy, fill or index_put_ runs (and syncs) as on CUDA",
    ),
    "batch norm: cuDNN": (
        "aten/src/ATen/native/Normalization.cpp _batch_norm_impl_index: use_cudnn requires "
        "input.is_cuda(); CUDA runs cudnn_batch_norm (and cudnn_batch_norm_backward), "
        "PrivateUse1 native_batch_norm after an empty reserve",
        "cudnn_batch_norm under CUDA's conditions, computed by the CPU's native_batch_norm",
    ),
    "grid sampler: cuDNN": (
        "aten/src/ATen/native/GridSampler.cpp grid_sampler: cond_cudnn_grid_sampler requires "
        "input.is_cuda(); CUDA runs cudnn_grid_sampler (backward cudnn_grid_sampler_backward) "
        "for bilinear, zeros padding, align_corners, 4-d, at most 1,024 channels; PrivateUse1 "
        "grid_sampler_2d",
        "cudnn_grid_sampler under CUDA's conditions, computed by the CPU's grid_sampler_2d",
    ),
    "SDPA backend": (
        "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp select_sdp_backend: flash, then "
        "memory-efficient, then math; the CPU's choice (sdp_utils_cpp.cpp) is flash or math",
        "CUDA's order with CUDA's main constraints (dtype, head dim, mask, grouped-query heads, "
        "a causal mask over unequal lengths)",
    ),
    "linear_cross_entropy: chunked path": (
        "torch/nn/modules/linear_cross_entropy.py _ChunkContext.build: is_cuda = device.type "
        "== 'cuda' picks the buffers and casts (CUDA: the bf16/fp16 weight uncast, mm with "
        "out_dtype=float32; other devices: a float32 copy of the weight and scratch buffers); "
        "linear_cross_entropy_options.py: the 'auto' policy by (device type, dtype) and the "
        "accumulation dtype (_resolve_auto_acc_dtype: float32 for bf16 on sm80+, fp16 on "
        "sm70+; None, so the input's dtype, for other devices)",
        "CUDA's policy, float32 accumulation (sm90) and is_cuda's buffers and casts; mm / "
        "addmm / bmm / baddbmm with out_dtype= and out= run as CUDA's (float32 accumulation)",
    ),
    "FlexAttention's devices": (
        "torch/nn/attention/flex_attention.py _validate_device: CUDA, CPU, XPU, HPU and MPS "
        "only (ValueError for others), and no backward on the CPU or MPS",
        "accepted as CUDA: eager FlexAttention trains (its dense implementation), with CUDA's "
        "kernel options (the log-sum-exp kept for the backward)",
    ),
    "gradient of a full max / min / median": (
        "torch/csrc/autograd/FunctionsManual.cpp evenly_distribute_backward (the derivative of "
        "max(), min(), median(), nanmedian() without a dim): for a tensor subclass or "
        "input.is_cuda() a mask of the tied elements, mask * (grad / mask.sum()); otherwise "
        "value.isnan().item<bool>() (a sync), then new_zeros().masked_fill_()",
        "CUDA's mask, no read: the four ops' autograd at AutogradPrivateUse1 is CUDA's formula",
    ),
    "deterministic replicate pad and max_pool3d": (
        "torch/nn/functional.py pad (mode='replicate') and max_pool3d_with_indices: under "
        "torch.use_deterministic_algorithms(True), input.is_cuda takes torch._decomp's "
        "decomposition (its backward is index_put, deterministic); other devices the native op",
        "the decomposition, as on CUDA",
    ),
}


#: CompositeImplicitAutograd ops for which ``sim`` registers a kernel of its own at
#: ``AutogradPrivateUse1`` (CUDA's branch of the composite), op -> that kernel: counting modes
#: run it where they decompose the op themselves (``perf.instruments.modes.decomposed``, under
#: ``inference_mode``), as they run the composite on CUDA
AUTOGRAD_KERNELS: dict[Any, Any] = {}

#: the tensor types a CUDA branch applies to: not FakeTensor / FunctionalTensor, which
#: ``torch.compile`` traces with (it keeps torch's own path)
PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


def eager_plain(x: Any) -> bool:
    """Whether ``x`` is a plain tensor run eagerly: where ``sim`` takes CUDA's branch."""
    return type(x) in PLAIN_TYPES and not torch.compiler.is_compiling()


def run_composite(op: Any, *args: Any, **kwargs: Any) -> Any:
    """``op``'s C++ CompositeImplicitAutograd kernel, the one a device runs (``op.decompose()``
    prefers a Python decomposition of ``torch._decomp`` where there is one: the RNNs run one
    ``addmm`` per time step there)."""
    return op._op_dk(_COMPOSITE, *args, **kwargs)


# --------------------------------------------------------------------------------------------
# group_norm: CUDA's memory format


def _group_norm(
    input: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-05,
    cudnn_enabled: bool = True,
) -> torch.Tensor:
    """``aten::group_norm`` as on CUDA: a contiguous input for ``native_group_norm``."""
    n, c = input.size(0), input.size(1)
    if c % num_groups != 0:
        raise RuntimeError(
            f"Expected number of channels in input to be divisible by num_groups, but got input "
            f"of shape {list(input.shape)} and num_groups={num_groups}"
        )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (t.dim() != 1 or t.numel() != c):
            raise RuntimeError(
                f"Expected {name} to be a vector of size equal to the number of channels in "
                f"input, but got {name} of shape {list(t.shape)} and input of shape "
                f"{list(input.shape)}"
            )
    hxw = math.prod(input.shape[2:])
    return aten.native_group_norm.default(
        input.contiguous(), weight, bias, n, c, hxw, num_groups, eps
    )[0]


# --------------------------------------------------------------------------------------------
# batch norm: cuDNN's kernel

#: cudnn.h's CUDNN_BN_MIN_EPSILON (0.0 since cuDNN 7.5; 1e-5 before)
_CUDNN_BN_MIN_EPSILON = 0.0


def _suggest_memory_format(x: torch.Tensor) -> torch.memory_format:
    if x.dim() in (4, 5) and not x.is_contiguous():
        cl = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        if x.is_contiguous(memory_format=cl):
            return cl
    return torch.contiguous_format


def _batch_norm_impl_index(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool,
) -> tuple[Any, ...]:
    """``Normalization.cpp`` ``_batch_norm_impl_index`` as on CUDA: ``cudnn_batch_norm`` where
    its ``use_cudnn`` holds (CUDA with cuDNN: no bf16, fp16 input only with fp32 weights, affine,
    running statistics or none in training, 3+ dims, batch ≤ 880,801 in training / 65,535 in
    eval, ``eps`` ≥ cuDNN's minimum, cuDNN enabled), the composite (``native_batch_norm``)
    otherwise."""
    use_cudnn = (
        eager_plain(input)
        and weight is not None
        and bias is not None
        and input.dtype != torch.bfloat16
        and weight.dtype != torch.bfloat16
        and (input.dtype != torch.float16 or weight.dtype == torch.float32)
        and (
            (running_mean is not None and running_var is not None)
            or (running_mean is None and running_var is None and training)
        )
        and input.dim() >= 3
        and ((input.size(0) <= 880801 and training) or (input.size(0) <= 65535 and not training))
        and eps >= _CUDNN_BN_MIN_EPSILON
        and cudnn_enabled
    )
    if not use_cudnn:
        return run_composite(
            aten._batch_norm_impl_index.default, input, weight, bias, running_mean, running_var,
            training, momentum, eps, cudnn_enabled,
        )  # fmt: skip
    assert weight is not None and bias is not None  # for mypy: use_cudnn says so
    out = aten.cudnn_batch_norm.default(
        input.contiguous(memory_format=_suggest_memory_format(input)),
        weight.contiguous(),
        bias.contiguous(),
        running_mean.contiguous() if running_mean is not None else None,
        running_var.contiguous() if running_var is not None else None,
        training,
        momentum,
        eps,
    )
    return (*out, 1)


# --------------------------------------------------------------------------------------------
# grid_sampler: cuDNN's spatial transformer

_INT32_MAX = 2**31 - 1


def _cudnn_acceptable(t: torch.Tensor) -> bool:
    """``Cudnn.cpp`` ``cudnn_is_acceptable`` (cuDNN enabled; double, float or half; not empty)
    and ``canUse32BitIndexMath`` (every element addressable in 32 bits)."""
    span = 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True))
    return (
        torch.backends.cudnn.enabled
        and t.dtype in (torch.float64, torch.float32, torch.float16)
        and t.numel() > 0
        and t.numel() <= _INT32_MAX
        and span <= _INT32_MAX
    )


def _grid_sampler(
    input: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> torch.Tensor:
    """``GridSampler.cpp`` ``grid_sampler`` as on CUDA: ``cudnn_grid_sampler`` for bilinear
    sampling with zeros padding and ``align_corners=True`` of a 4-d input of at most 1,024
    channels that cuDNN accepts (``cond_cudnn_grid_sampler``); ``grid_sampler_2d`` / ``_3d``
    otherwise, as the composite does."""
    if (
        eager_plain(input)
        and interpolation_mode == 0  # bilinear
        and padding_mode == 0  # zeros
        and align_corners
        and input.dim() == 4
        and input.size(1) <= 1024
        and _cudnn_acceptable(input)
        and _cudnn_acceptable(grid)
    ):
        return aten.cudnn_grid_sampler.default(input, grid)
    return run_composite(
        aten.grid_sampler.default, input, grid, interpolation_mode, padding_mode, align_corners
    )


# --------------------------------------------------------------------------------------------
# SDPA: CUDA's backend order

_MATH, _FLASH, _EFFICIENT = 0, 1, 2  # torch.nn.attention.SDPBackend values


def _dense_ok(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
) -> bool:
    """``sdp_utils.h`` ``check_nonzero_sequence_lengths_dense`` and
    ``check_last_dim_stride_equals_1_dense<true>``, constraints of both fused kernels: no empty
    sequence, and a last dimension of stride 1 in query, key and value (or a head dim of 1)
    and, off the CPU, in the mask."""
    if query.size(-2) == 0 or key.size(-2) == 0:
        return False
    unit = query.stride(-1) == 1 and key.stride(-1) == 1 and value.stride(-1) == 1
    return (unit or query.size(-1) == 1) and (mask is None or mask.stride(-1) == 1)


def _sdp_choice(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> int:
    """CUDA's ``select_sdp_backend`` on sm80 / sm90 (they choose alike here; ``sim`` stands for
    sm90, :data:`perf.sim.kernel_syncs.SIM_CAPABILITY`): flash where its constraints hold,
    else memory-efficient, else math; backends disabled through ``torch.backends.cuda`` /
    ``sdpa_kernel`` are skipped, as on CUDA.

    Constraints (``cuda/sdp_utils.cpp`` ``can_use_flash_attention`` /
    ``can_use_mem_efficient_attention``, ``sdp_utils_cpp.h``): 4-d inputs of one batch size,
    dense (:func:`_dense_ok`: a last dimension of stride 1, no empty sequence);
    flash takes fp16 / bf16, no mask, one head dim of at most 256 and a multiple of 8, grouped
    query attention (``enable_gqa``: query heads a multiple of key heads, key and value heads
    equal), and no causal mask over unequal query and key lengths (FlashAttention-2 aligns it
    lower-right); memory-efficient takes fp32 too, masks, head dims aligned to 8 (half) or 4
    (fp32), and query, key and value with the same number of heads."""
    b = torch.backends.cuda
    if (
        (query.dim(), key.dim(), value.dim()) == (4, 4, 4)
        and query.size(0) == key.size(0) == value.size(0)
        and _dense_ok(query, key, value, attn_mask)
    ):
        qh, kh, vh = query.size(-3), key.size(-3), value.size(-3)
        same_heads = qh == kh == vh
        gqa = enable_gqa and kh == vh and kh > 0 and qh % kh == 0
        head = query.size(-1)
        half = query.dtype in (torch.float16, torch.bfloat16)
        if (
            b.flash_sdp_enabled()
            and half
            and attn_mask is None
            and head == key.size(-1) == value.size(-1)
            and head <= 256
            and head % 8 == 0
            and (same_heads or gqa)
            and not (is_causal and query.size(-2) != key.size(-2))
        ):
            return _FLASH
        align = 8 if half else 4
        if (
            b.mem_efficient_sdp_enabled()
            and query.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and head == key.size(-1)
            and head % align == 0
            and value.size(-1) % align == 0
            and same_heads
        ):
            return _EFFICIENT
    if b.math_sdp_enabled():
        return _MATH
    raise RuntimeError(
        "No available kernel for scaled_dot_product_attention on perf's simulated device: "
        "the math backend is disabled and CUDA's flash / memory-efficient constraints do not "
        "hold for these inputs; enable the math backend (torch.nn.attention.sdpa_kernel)"
    )


def _sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``attention.cpp`` ``scaled_dot_product_attention`` as on CUDA: the backend that
    :func:`_sdp_choice` picks, with the composite's steps around it (a boolean mask made
    additive by ``where``; for memory-efficient attention the mask's last dimension padded to
    a multiple of 8 where its strides are unaligned, then expanded; the log-sum-exp asked for
    only where a gradient is wanted).

    Why: the composite asks a dispatch stub for the backend, and a ``PrivateUse1`` device
    without a C++ registration there gets the math backend, whatever ``_fused_sdp_choice``
    says: every attention on ``sim`` ran as about 15 ops (two ``bmm`` and the whole score
    matrix) where CUDA runs one flash or memory-efficient kernel. Tensor subclasses take the
    branch too, as on CUDA (the stub reads a ``DTensor``'s global shapes), and so do the fake
    tensors ``torch.compile`` traces with: a compiled graph holds the kernel, as Inductor's
    graph for CUDA does."""
    if not (
        query.dtype == key.dtype == value.dtype
        and query.device == key.device == value.device
        and (attn_mask is None or attn_mask.dtype in (torch.bool, query.dtype))
        and min(query.dim(), key.dim(), value.dim()) >= 2
    ):
        # validate_sdpa_input refuses these: torch's own message
        return run_composite(
            aten.scaled_dot_product_attention.default, query, key, value, attn_mask,
            dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa,
        )  # fmt: skip
    choice = _sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        inf = aten.scalar_tensor.default(float("-inf"), dtype=query.dtype, device=attn_mask.device)
        attn_mask = aten.where.ScalarSelf(attn_mask, 0.0, inf)
    if choice == _FLASH:
        # pad_last_dim<8> is a no-op here: flash was chosen for head dims divisible by 8
        og_scale = scale if scale is not None else 1.0 / math.sqrt(query.size(-1))
        return aten._scaled_dot_product_flash_attention.default(
            query, key, value, dropout_p, is_causal, False, scale=og_scale
        )[0]
    if choice == _EFFICIENT:
        lse = torch.is_grad_enabled() and (
            query.requires_grad or key.requires_grad or value.requires_grad
        )
        if attn_mask is not None:
            attn_mask = _preprocess_mask(attn_mask, query, key)
        return aten._scaled_dot_product_efficient_attention.default(
            query, key, value, attn_mask, lse, dropout_p, is_causal, scale=scale
        )[0]
    return aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale,
        enable_gqa=enable_gqa,
    )[0]  # fmt: skip


def _preprocess_mask(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``attention.cpp`` ``preprocess_mask``: memory-efficient attention wants the bias's
    strides aligned to 8 elements (else padded and sliced back), expanded to the scores'
    shape."""
    aligned = mask.stride(-1) == 1 and all(mask.stride(i) % 8 == 0 for i in range(mask.dim() - 1))
    if not aligned:
        last = mask.size(-1)
        mask = aten.slice.Tensor(aten.pad.default(mask, [0, 8 - last % 8]), -1, 0, last)
    return mask.expand(query.size(0), query.size(1), query.size(2), key.size(2))


# --------------------------------------------------------------------------------------------
# x[i] = 5: CUDA's host scalar

_NUMBERS = (bool, int, float, complex)


def patch_setitem() -> None:
    """``x[index] = number`` on a sim tensor takes CUDA's branch (see :data:`BRANCHES`).

    Why: on ``PrivateUse1`` torch makes the number a device scalar and ``x[i] = 5`` is a
    device-to-device copy; on CUDA it is a host scalar, copied with a sync (pytorch#186482
    describes it; torch 2.13's ``TensorIndexing.h`` ``copy_to`` still copies). Tensors that
    are not sim tensors, and anything while ``torch.compile`` traces, keep torch's own path."""
    original = torch.Tensor.__setitem__
    if getattr(original, "_perf_sim", False):
        return
    disable = torch._C._DisableTorchDispatch
    compiling = torch.compiler.is_compiling

    @functools.wraps(original)
    def __setitem__(self: torch.Tensor, index: Any, value: Any) -> None:
        if (
            type(value) in _NUMBERS
            and type(self) in PLAIN_TYPES
            and is_sim(self)
            and not compiling()
        ):
            with disable():  # CUDA's scalar is made below the dispatcher (scalar_tensor_static)
                value = torch.scalar_tensor(value, dtype=self.dtype)
        return original(self, index, value)

    __setitem__._perf_sim = True  # type: ignore[attr-defined]
    torch.Tensor.__setitem__ = __setitem__  # type: ignore[method-assign,assignment]


# --------------------------------------------------------------------------------------------
# Python code that tests the device type: F.linear_cross_entropy, FlexAttention's device
# check, deterministic pad / max_pool3d

#: each Python function of torch that decides by ``device.type == "cuda"`` / ``is_cuda``:
#: (module, qualified name, the test as torch writes it, the same test with ``sim`` as CUDA).
#: The function's code is recompiled with the second test (its ``__code__``, so every
#: reference to it follows); a torch whose source differs keeps its own code, and
#: ``tests/harness/test_sim_paths.py`` fails on that branch's test.
PYTHON_BRANCHES: tuple[tuple[str, str, str, str], ...] = (
    (
        "torch.nn.modules.linear_cross_entropy",
        "_ChunkContext.build",
        'is_cuda = device.type == "cuda"',
        f'is_cuda = device.type in ("cuda", "{NAME}")',
    ),
    (
        "torch.nn.attention.flex_attention",
        "_validate_device",
        'supported_devices = {"cuda", "cpu", "xpu", "hpu", "mps"}',
        f'supported_devices = {{"cuda", "cpu", "xpu", "hpu", "mps", "{NAME}"}}',
    ),
    (
        "torch.nn.functional",
        "pad",
        "input.is_cuda or input.is_xpu",
        f'input.is_cuda or input.is_xpu or input.device.type == "{NAME}"',
    ),
    (
        "torch.nn.functional",
        "max_pool3d_with_indices",
        "if input.is_cuda and torch.are_deterministic_algorithms_enabled():",
        f'if (input.is_cuda or input.device.type == "{NAME}") '
        "and torch.are_deterministic_algorithms_enabled():",
    ),
)


def _recompile(func: Any, old: str, new: str) -> bool:
    """Give ``func`` the code of its own source with ``old`` (found once) replaced by ``new``,
    at the same file and line numbers (tracebacks point at torch's lines). Decorators are left
    out: they already ran, on this very function object."""
    try:
        lines, first = inspect.getsourcelines(func)
    except (OSError, TypeError):  # a torch installed without its .py sources
        return False
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def "))
    source = textwrap.dedent("".join(lines[start:]))
    if source.count(old) != 1 or func.__code__.co_freevars:
        return False
    code = compile(
        "\n" * (first + start - 1) + source.replace(old, new),
        inspect.getsourcefile(func) or "<torch>",
        "exec",
    )
    namespace: dict[str, Any] = {}
    exec(code, func.__globals__, namespace)  # torch's own source, with one test changed
    new_code = namespace[func.__name__].__code__
    if hasattr(new_code, "co_qualname"):  # Python 3.11+: tracebacks name the method as before
        new_code = new_code.replace(co_qualname=func.__code__.co_qualname)
    func.__code__ = new_code
    return True


def _resolve_auto_acc_dtype(plain: Any) -> Any:
    """``LinearCrossEntropyOptions._resolve_auto_acc_dtype`` with CUDA's answer on ``sim``:
    float32 for bfloat16 from sm80 and for float16 from sm70 (``sim`` is sm90), which torch
    reads from ``torch.cuda.get_device_capability`` (no CUDA here)."""

    def resolve(dtype: torch.dtype, device: torch.device | None) -> torch.dtype | None:
        if device is None or device.type != NAME:
            return plain(dtype, device)
        if dtype not in (torch.float16, torch.bfloat16):
            return None
        major = SIM_CAPABILITY[0]
        if (dtype == torch.bfloat16 and major < 8) or (dtype == torch.float16 and major < 7):
            return None
        return torch.float32

    resolve._perf_sim = True  # type: ignore[attr-defined]
    return staticmethod(resolve)


def follow_python_branches() -> list[str]:
    """Make ``sim`` take CUDA's branch where torch's Python code tests the device type
    (:data:`PYTHON_BRANCHES`, and ``linear_cross_entropy``'s options); returns the functions
    whose source did not match (left as torch wrote them)."""
    missed = []
    for module_name, qualname, old, new in PYTHON_BRANCHES:
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            continue  # not in this torch
        for part in qualname.split("."):
            owner = getattr(owner, part, None)
        func = getattr(owner, "__func__", owner)
        if func is None or getattr(func, "_perf_sim", False):
            continue
        if _recompile(func, old, new):
            func._perf_sim = True
        else:
            missed.append(f"{module_name}.{qualname}")
    try:
        options = importlib.import_module("torch.nn.modules.linear_cross_entropy_options")
    except ImportError:
        return missed
    cls = options.LinearCrossEntropyOptions
    if not getattr(cls._resolve_auto_acc_dtype, "_perf_sim", False):
        cls._resolve_auto_acc_dtype = _resolve_auto_acc_dtype(cls._resolve_auto_acc_dtype)
    # the "auto" policy and chunking by (device type, dtype): CUDA's rows for sim
    defaults = options._AUTO_DEFAULTS
    for (device_type, dtype), pick in list(defaults.items()):
        if device_type == "cuda":
            defaults.setdefault((NAME, dtype), pick)
    return missed


# --------------------------------------------------------------------------------------------
# the gradient of a full max / min / median: CUDA's mask


class _EvenlyDistributed(torch.autograd.Function):
    """``max()`` / ``min()`` / ``median()`` / ``nanmedian()`` of a whole tensor with CUDA's
    derivative (``FunctionsManual.cpp`` ``evenly_distribute_backward``, its ``is_cuda()``
    branch): the gradient shared by every element equal to the result (NaN matching NaN),
    without reading the device."""

    @staticmethod
    def forward(ctx: Any, op: Any, keyset: Any, x: torch.Tensor) -> torch.Tensor:
        value = op.redispatch(keyset, x)
        ctx.save_for_backward(x, value)
        return value

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        x, value = ctx.saved_tensors
        both_nan = torch.logical_and(x.isnan(), value.isnan())
        mask = (x == value).logical_or_(both_nan)
        return None, None, mask * (grad / mask.sum())


def _evenly_distributed(op: Any, torchs: Any) -> Any:
    """The ``AutogradPrivateUse1`` kernel of ``op``: on a plain tensor run eagerly, its
    forward below autograd, recorded with CUDA's derivative where a gradient is wanted;
    anything else (``torch.func``'s transforms, a compile's fake tensors, which take the mask
    branch themselves) runs ``torchs``, the kernel it replaces."""

    def kernel(keyset: Any, x: torch.Tensor) -> torch.Tensor:
        if not eager_plain(x) or torch._C._are_functorch_transforms_active():
            return torchs.call_boxed(keyset, x)
        below = keyset & _AFTER_AUTOGRAD
        if torch.is_grad_enabled() and x.requires_grad:
            return _EvenlyDistributed.apply(op, below, x)
        return op.redispatch(below, x)

    return kernel


_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
#: the ops whose derivative is ``evenly_distribute_backward`` (derivatives.yaml)
EVENLY_DISTRIBUTED = ("max", "min", "median", "nanmedian")


def register_paths(lib: Any, fallback: Any) -> None:
    """Register CUDA's branches for ``PrivateUse1``; ``fallback`` is the sim fallback kernel
    (the CPU kernel on host views), bound per op."""
    lib.impl("group_norm", _group_norm, "AutogradPrivateUse1")
    lib.impl("group_norm", _group_norm, "PrivateUse1")
    AUTOGRAD_KERNELS[aten.group_norm.default] = _group_norm
    lib.impl("_batch_norm_impl_index", _batch_norm_impl_index, "AutogradPrivateUse1")
    lib.impl("_batch_norm_impl_index", _batch_norm_impl_index, "PrivateUse1")
    AUTOGRAD_KERNELS[aten._batch_norm_impl_index.default] = _batch_norm_impl_index
    for name in (
        "native_group_norm",
        "native_layer_norm",
        "addr",
        "addr.out",
        "_stack",
        "_stack.out",
        "any.dims_out",
        "all.dims_out",
        "linalg__powsum",
        "_grouped_mm",
    ):
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet, None), overload or "default", None)
        if op is not None:
            lib.impl(name, functools.partial(fallback, op), "PrivateUse1")
    lib.impl("grid_sampler", _grid_sampler, "AutogradPrivateUse1")
    lib.impl("grid_sampler", _grid_sampler, "PrivateUse1")
    AUTOGRAD_KERNELS[aten.grid_sampler.default] = _grid_sampler
    lib.impl("_fused_sdp_choice", _sdp_choice, "PrivateUse1")
    lib.impl("scaled_dot_product_attention", _sdpa, "AutogradPrivateUse1")
    lib.impl("scaled_dot_product_attention", _sdpa, "PrivateUse1")
    AUTOGRAD_KERNELS[aten.scaled_dot_product_attention.default] = _sdpa
    get_kernel: Any = getattr(torch.library, "get_kernel", None)  # else torch's own path
    for name in EVENLY_DISTRIBUTED if get_kernel is not None else ():
        op = getattr(aten, name).default
        torchs = get_kernel(op, "AutogradPrivateUse1")
        lib.impl(name, _evenly_distributed(op, torchs), "AutogradPrivateUse1", with_keyset=True)
