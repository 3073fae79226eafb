"""Autocast on ``sim``: CUDA's cast policy (the lists of ``aten/src/ATen/autocast_mode.cpp``),
registered for the ``AutocastPrivateUse1`` key so ``torch.autocast("sim")`` casts what
``torch.autocast("cuda")`` casts."""

from __future__ import annotations

from typing import Any

import torch

from perf.sim.memory import cached_cast
from perf.sim.tensors import NAME, aten

# --------------------------------------------------------------------------------------------
# autocast: CUDA's policy (aten/src/ATen/autocast_mode.cpp, torch 2.x). The set of operators is
# exactly those with an ``AutocastCUDA`` kernel in this torch (the dispatcher lists them on a
# CPU-only build too); tests/harness/test_sim_autocast.py checks both the set and each policy
# against CUDA's own autocast kernels run on fake CUDA tensors.


def _names(text: str) -> list[str]:
    return text.split()


_LOWER = _names("""_convolution _convolution.deprecated conv1d conv2d conv3d conv_tbc
conv_transpose1d conv_transpose2d.input conv_transpose3d.input convolution prelu addmm addmv
addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot
_thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
_scaled_dot_product_flash_attention scaled_dot_product_attention cudnn_convolution
cudnn_convolution_transpose""")
_FP32 = _names("""acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan
pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm group_norm
rms_norm
frobenius_norm.dim nuclear_norm nuclear_norm.dim cosine_similarity poisson_nll_loss
cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss
huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss
triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm
logsumexp upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d
_upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d
upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d
_upsample_bicubic2d_aa norm.Scalar norm.ScalarOpt_dim""")
_FP32_SET_OPT_DTYPE = _names("""prod prod.dim_int softmax.int log_softmax.int cumprod cumsum
linalg_vector_norm linalg_matrix_norm linalg_matrix_norm.str_ord sum sum.dim_IntList""")
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
        return cached_cast(x, dtype)  # CUDA's weight-cast cache
    if isinstance(x, (list, tuple)) and any(_eligible(v) for v in x):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _autocast_kernel(op: Any, policy: str) -> Any:
    key = torch._C.DispatchKey.AutocastPrivateUse1  # type: ignore[attr-defined]  # no stub
    after = torch._C._dispatch_keyset_full_after(key)
    # As autocast_mode.h's wrappers (ExcludeDispatchKeyGuard no_autocast(autocast key)): the
    # ops a composite calls inside run without autocast (tensordot's mm keeps the promoted
    # dtype instead of being lowered again).
    no_autocast = torch._C.DispatchKeySet(key)
    schema_args = op._schema.arguments

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(no_autocast):
            return policy_kernel(keyset, *args, **kwargs)

    def policy_kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
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


def register_autocast(lib: Any) -> None:
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
