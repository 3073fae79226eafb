"""Kernels on ``sim`` for the aten operators that have a CUDA kernel and no CPU one.

Why: PyTorch chooses some operators for every non-CPU device (``input.is_cuda() ||
input.is_xpu() || input.is_privateuseone()`` in ``aten/src/ATen/native/RNN.cpp`` picks
``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell``), and CUDA's autocast and attention
paths produce dtype combinations that only CUDA kernels accept (``_softmax`` with
``half_to_float``). The simulated device runs every op with its CPU kernel, so each such
operator gets a kernel here: the math of the CUDA kernel written with CPU ops on host views.

:data:`CUDA_ONLY` accounts for every operator of ``native_functions.yaml`` with a CUDA kernel
and neither a CPU nor a composite one: each has a kernel here or a reason why ``sim`` does not
run it (the operator is only reached through cuDNN / MIOpen checks that require
``is_cuda()``, or only by an explicit call to a CUDA feature). A test fails when a torch release
adds an operator to that class, so it gets a decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from perf.sim.errors import named_kernel
from perf.sim.tensors import Seen, aten, host_recompute, out_index, rewrap, unwrap

__all__ = ["CUDA_DTYPES", "KERNELS"]

# --------------------------------------------------------------------------------------------
# fused RNN cells (aten/src/ATen/native/cuda/RNN.cu; chosen in RNN.cpp for non-CPU devices)


def _lstm_cell(
    igates: torch.Tensor,
    hgates: torch.Tensor,
    cx: torch.Tensor,
    b_ih: torch.Tensor | None = None,
    b_hh: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gates = igates + hgates
    if b_ih is not None:
        gates = gates + b_ih
    if b_hh is not None:
        gates = gates + b_hh
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    workspace = torch.cat([i, f, g, o], 1)  # the activated gates, as CUDA's workspace
    return hy, cy, workspace


def _lstm_cell_backward(
    grad_hy: torch.Tensor | None,
    grad_cy: torch.Tensor | None,
    cx: torch.Tensor,
    cy: torch.Tensor,
    workspace: torch.Tensor,
    has_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    i, f, g, o = workspace.chunk(4, 1)
    tcy = cy.tanh()
    gh = torch.zeros_like(cy) if grad_hy is None else grad_hy
    gc = torch.zeros_like(cy) if grad_cy is None else grad_cy
    d_cy = gc + gh * o * (1 - tcy * tcy)
    grad_gates = torch.cat(
        [
            d_cy * g * i * (1 - i),
            d_cy * cx * f * (1 - f),
            d_cy * i * (1 - g * g),
            gh * tcy * o * (1 - o),
        ],
        1,
    )
    grad_cx = d_cy * f
    return grad_gates, grad_cx, grad_gates.sum(0) if has_bias else None


def _gru_cell(
    igates: torch.Tensor,
    hgates: torch.Tensor,
    hx: torch.Tensor,
    b_ih: torch.Tensor | None = None,
    b_hh: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if b_ih is not None:
        igates = igates + b_ih
    if b_hh is not None:
        hgates = hgates + b_hh
    ir, iz, in_ = igates.chunk(3, 1)
    hr, hz, hn = hgates.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx - n)
    workspace = torch.cat([r, z, n, hx, hn], 1)  # CUDA's layout: r, z, n, hx, hn
    return hy, workspace


def _gru_cell_backward(
    grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool
) -> tuple[Any, ...]:
    r, z, n, hx, hn = workspace.chunk(5, 1)
    d_n = grad_hy * (1 - z) * (1 - n * n)
    d_z = grad_hy * (hx - n) * z * (1 - z)
    d_r = d_n * hn * r * (1 - r)
    grad_input_gates = torch.cat([d_r, d_z, d_n], 1)
    grad_hidden_gates = torch.cat([d_r, d_z, d_n * r], 1)
    grad_hx = grad_hy * z
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return (
        grad_input_gates,
        grad_hidden_gates,
        grad_hx,
        grad_input_gates.sum(0),
        grad_hidden_gates.sum(0),
    )


# --------------------------------------------------------------------------------------------
# dropout, matmuls with out_dtype, streams


def _fused_dropout(
    x: torch.Tensor, p: float, generator: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    # p is the probability to keep (cuda/Dropout.cu fused_dropout)
    mask = torch.empty_like(x, dtype=torch.uint8).bernoulli_(p, generator=generator)
    return x * mask * (1.0 / p if p > 0 else 0.0), mask


def _masked_scale(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    return x * mask * scale


def _out_dtype(fn: Any) -> Any:
    """``mm(a, b, out_dtype)`` and friends: accumulate in float32, return ``out_dtype``."""

    def kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
        rest = list(args)
        out_dtype = kwargs.pop("out_dtype", None)
        if out_dtype is None:  # the schemas put it right after the tensors
            out_dtype = next(a for a in rest if isinstance(a, torch.dtype))
            rest.remove(out_dtype)
        up = [a.float() if isinstance(a, torch.Tensor) else a for a in rest]
        return fn(*up, **kwargs).to(out_dtype)

    return kernel


def _out_dtype_out(fn: Any) -> Any:
    """The ``out=`` forms (``mm.dtype_out``, ...): ``F.linear_cross_entropy``'s CUDA branch
    calls ``torch.mm(a, b, out_dtype=torch.float32, out=buf)``. As ``Blas.cpp``
    ``_mm_dtype_out_cuda``: ``out`` must have ``out_dtype``; it is resized if its shape
    differs."""
    functional = _out_dtype(fn)

    def kernel(*args: Any, out: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        out_dtype = kwargs.get("out_dtype") or next(a for a in args if isinstance(a, torch.dtype))
        if out.dtype != out_dtype:
            raise RuntimeError("out_dtype must be the same as the dtype of the provided out tensor")
        result = functional(*args, **kwargs)
        if out.shape != result.shape:
            out.resize_(result.shape)
        return out.copy_(result)

    return kernel


def _record_stream(x: torch.Tensor, stream: Any) -> None:
    return None  # one stream: nothing to record


# --------------------------------------------------------------------------------------------
# attention kernels that SDPA picks on CUDA: the CPU flash kernel (same math, same layouts);
# with dropout, or a gradient for the bias, the CPU's math backend on the host

#: attribute of a dropout attention's log-sum-exp host storage: the CPU generator's state
#: before the forward drew its mask, for the backward to draw it again
_RNG_STATE = "_perf_sim_attention_rng"


def _host_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """The CPU's math backend on host tensors: the CPU's flash kernel takes no dropout and
    returns no gradient for the bias; this does both. Its dropout draws from the CPU's
    generator, which ``sim``'s random ops share, exactly as a CPU run's attention does, so a
    step with attention dropout on ``sim`` equals the CPU's (CUDA's kernels draw their own
    philox stream instead)."""
    gqa = k.size(-3) != q.size(-3)
    return aten._scaled_dot_product_attention_math.default(
        q, k, v, bias, dropout_p, is_causal, None, scale=scale, enable_gqa=gqa
    )[0]


def _logsumexp(
    q: torch.Tensor,
    k: torch.Tensor,
    bias: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """The fused kernels' second output: each query row's log-sum-exp of its scores, fp32."""
    kf = k.float()
    if kf.size(-3) != q.size(-3):
        kf = kf.repeat_interleave(q.size(-3) // kf.size(-3), -3)
    s = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    scores = (q.float() @ kf.transpose(-2, -1)) * s
    if is_causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if bias is not None:
        scores = scores + bias.float()
    return torch.logsumexp(scores, -1)


def _attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(output, log-sum-exp, the generator state a dropout mask was drawn from, else None):
    the CPU's flash kernel, or with dropout or a value head dim of its own (see
    :func:`_cpu_flash_takes`) the CPU's math backend on the host."""
    if dropout_p > 0 or not _cpu_flash_takes(q, v):
        state = torch.get_rng_state() if dropout_p > 0 else None
        out = _host_attention(q, k, v, bias, dropout_p, is_causal, scale)
        return out, _logsumexp(q, k, bias, is_causal, scale), state
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
        *_unit_last(q, k, v), dropout_p, is_causal, attn_mask=bias, scale=scale
    )
    return out, lse, None


def _cpu_flash_takes(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the CPU's flash kernel computes this attention: it needs the value's head dim
    to be the query's, where CUDA's memory-efficient kernel takes its own (multi-head latent
    attention: DeepSeek's query and key heads of 192, value heads of 128)."""
    return q.size(-1) == v.size(-1)


def _keep_rng_state(lse: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
    """``lse``, whose storage now carries the generator state its forward's dropout drew
    from (the backward reads it there, as it gets the log-sum-exp)."""
    if state is not None:
        setattr(lse.untyped_storage(), _RNG_STATE, state)
    return lse


def _unit_last(*ts: torch.Tensor | None) -> list[Any]:
    """The tensors with a last dimension of stride 1, which the CPU's flash kernel reads its
    inputs as (it computes garbage otherwise; CUDA's kernels refuse such inputs, and SDPA
    never sends them: ``check_last_dim_stride_equals_1_dense``)."""
    return [t if t is None or t.stride(-1) == 1 else t.contiguous() for t in ts]


def _laid_out(out: torch.Tensor, strides_like: torch.Tensor) -> torch.Tensor:
    """``out`` with the strides of ``strides_like`` (CUDA's kernel's layout, which the meta
    kernels, and so Inductor, plan with): a host copy only where they differ."""
    if out.stride() == strides_like.stride():
        return out
    return strides_like.copy_(out)


def _host_attention_grads(
    grad_out: torch.Tensor,
    inputs: tuple[torch.Tensor | None, ...],
    wanted: tuple[bool, ...],
    lse: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
) -> list[torch.Tensor | None]:
    """The gradients of :func:`_host_attention` (query, key, value, bias) where ``wanted``,
    recomputed under autograd, with dropout from the generator state the forward drew from
    (restored afterwards)."""
    state = None
    if dropout_p > 0:
        state = getattr(lse.untyped_storage(), _RNG_STATE, None)
        if state is None:
            raise RuntimeError(
                "perf's simulated device: the backward of an attention kernel with dropout "
                "found no record of the forward's dropout mask (its log-sum-exp output was "
                "replaced); please report this"
            )

    def forward(q: Any, k: Any, v: Any, bias: Any) -> torch.Tensor:
        return _host_attention(q, k, v, bias, dropout_p, is_causal, scale)

    return _recomputed_grads(forward, inputs, wanted, grad_out, state)


def _recomputed_grads(
    forward: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor | None],
    wanted: Sequence[bool],
    grad_out: torch.Tensor,
    rng_state: torch.Tensor | None = None,
) -> list[torch.Tensor | None]:
    """The gradients of ``forward(*inputs)`` for the inputs ``wanted`` (None where not), its
    host forward recomputed under autograd as a CPU run's autograd computes them, with the
    CPU generator at ``rng_state`` (:func:`perf.sim.tensors.host_recompute`)."""
    with host_recompute(rng_state):
        leaves = [
            None if t is None else t.detach().requires_grad_(w)
            for t, w in zip(inputs, wanted, strict=True)
        ]
        out = forward(*leaves)
        need = [t for t in leaves if t is not None and t.requires_grad]
        got = iter(torch.autograd.grad(out, need, grad_out) if need else ())
    return [next(got) if t is not None and t.requires_grad else None for t in leaves]


def _flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
) -> tuple[Any, ...]:
    """CUDA's layouts: the output that of ``empty_like(q.transpose(1, 2)).transpose(1, 2)``,
    the log-sum-exp contiguous."""
    out, lse, state = _attention_forward(q, k, v, None, dropout_p, is_causal, scale)
    out = _laid_out(out, torch.empty_like(q.transpose(1, 2)).transpose(1, 2))
    lse = _keep_rng_state(lse.contiguous(), state)
    zero = torch.zeros((), dtype=torch.int64)
    empty = torch.empty(0, dtype=q.dtype)
    return out, lse, None, None, q.size(2), k.size(2), zero, zero, empty


def _flash_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cum_seq_q: Any,
    cum_seq_k: Any,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    philox_seed: Any,
    philox_offset: Any,
    *,
    scale: float | None = None,
) -> tuple[Any, ...]:
    if dropout_p > 0:
        grads = _host_attention_grads(
            grad_out, (q, k, v, None), (True, True, True, False), lse, dropout_p, is_causal,
            scale,
        )[:3]  # fmt: skip
    else:
        grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *_unit_last(grad_out, q, k, v, out), lse, dropout_p, is_causal, scale=scale
        )
    laid = []  # CUDA's layout: each gradient that of empty_like(its input)
    for g, x in zip(grads, (q, k, v), strict=True):
        assert g is not None  # all three are computed
        laid.append(_laid_out(g, torch.empty_like(x)))
    return tuple(laid)


def _efficient(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None,
    compute_log_sumexp: bool,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> tuple[Any, ...]:
    """CUDA's layouts: the output (B, L, H, D)-contiguous, transposed; the log-sum-exp
    (B, H, L rounded up to 32), or (B, H, 0) when not asked for (its padding holds inf)."""
    out, lse, state = _attention_forward(q, k, v, attn_bias, dropout_p, is_causal, scale)
    b, h, length, d = q.size(0), q.size(1), q.size(2), v.size(-1)
    out = _laid_out(out, torch.empty(b, length, h, d, dtype=out.dtype).transpose(1, 2))
    padded = torch.full((b, h, -(-length // 32) * 32 if compute_log_sumexp else 0), math.inf)
    if compute_log_sumexp:
        padded[..., :length] = lse
    padded = _keep_rng_state(padded, state)
    zero = torch.zeros((), dtype=torch.int64)
    return out, padded, zero, zero


def _efficient_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    philox_seed: Any,
    philox_offset: Any,
    dropout_p: float,
    grad_input_mask: Any,
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> tuple[Any, ...]:
    bias_grad = attn_bias is not None and bool(grad_input_mask[3])
    gb = None
    if dropout_p > 0 or bias_grad or not _cpu_flash_takes(q, v):
        gq, gk, gv, gb = _host_attention_grads(
            grad_out, (q, k, v, attn_bias), (True, True, True, bias_grad), lse, dropout_p,
            is_causal, scale,
        )  # fmt: skip
    else:
        gq, gk, gv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *_unit_last(grad_out, q, k, v, out), lse[..., : q.size(2)], dropout_p, is_causal,
            attn_mask=attn_bias, scale=scale,
        )  # fmt: skip
    # CUDA's layout: (B, L, H, D)-contiguous, transposed
    grads = []
    for g, x in zip((gq, gk, gv), (q, k, v), strict=True):
        assert g is not None
        b, h, length, d = x.shape
        grads.append(_laid_out(g, torch.empty(b, length, h, d, dtype=g.dtype).transpose(1, 2)))
    return (*grads, gb)


# --------------------------------------------------------------------------------------------
# FlashAttention's own entry points: variable-length attention (torch.nn.attention.varlen)


def _flash_sequences(
    q: torch.Tensor, k: torch.Tensor, cum_q: torch.Tensor | None, cum_k: torch.Tensor | None
) -> list[tuple[Any, Any]]:
    """Each sequence's (query index, key index): a slice of the packed tokens (``cum_q`` /
    ``cum_k``: host views of the device's cumulative lengths, read as the kernel reads them,
    on the device: no sync), or a batch entry of the dense layout (B, S, H, D)."""
    if cum_q is None or cum_k is None:
        return [((b,), (b,)) for b in range(q.size(0))]
    cq, ck = cum_q.tolist(), cum_k.tolist()
    return [(slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])) for i in range(len(cq) - 1)]


def _flash_window_mask(
    lq: int, lk: int, is_causal: bool, left: int | None, right: int | None
) -> torch.Tensor | None:
    """FlashAttention's mask for one sequence, True where a query may see a key:
    ``flash_api.cpp`` makes ``is_causal`` a right window of 0; query ``i`` sees key ``j`` when
    ``i + lk - lq - left <= j <= i + lk - lq + right`` (a bottom-right-aligned band; a window
    of -1 or None is unbounded)."""
    left = -1 if left is None else left
    right = 0 if is_causal else (-1 if right is None else right)
    if left < 0 and right < 0:
        return None
    i = torch.arange(lq).unsqueeze(1) + (lk - lq)
    j = torch.arange(lk).unsqueeze(0)
    keep = torch.ones(lq, lk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def _flash_one(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, (L, H, D) each, in float32 as the kernel accumulates: (output (L, H, D),
    log-sum-exp (H, L), +inf where a row sees no key, as FlashAttention writes it)."""
    qh, kh, vh = (t.float().transpose(0, 1) for t in (q, k, v))
    if kh.size(0) != qh.size(0):  # grouped-query attention
        kh = kh.repeat_interleave(qh.size(0) // kh.size(0), 0)
        vh = vh.repeat_interleave(qh.size(0) // vh.size(0), 0)
    s = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    scores = (qh @ kh.transpose(-2, -1)) * s
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    empty = torch.isinf(lse)
    p = torch.exp(scores - lse.masked_fill(empty, 0.0).unsqueeze(-1)).masked_fill(
        empty.unsqueeze(-1), 0.0
    )
    return (p @ vh).transpose(0, 1), lse.masked_fill(empty, float("inf"))


def _flash_not_simulated(dropout_p: float, **extra: Any) -> None:
    given = [k for k, v in extra.items() if v is not None]
    if dropout_p > 0 or given:
        what = ", ".join([*given, *(["dropout"] if dropout_p > 0 else [])])
        raise NotImplementedError(
            f"perf's simulated device runs _flash_attention_forward without {what} (variable-"
            "length attention for training: torch.nn.attention.varlen.varlen_attn); count "
            "this call on CUDA"
        )


def _flash_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cum_seq_q: torch.Tensor | None,
    cum_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    return_debug_mask: bool,
    *,
    scale: float | None = None,
    window_size_left: int | None = None,
    window_size_right: int | None = None,
    seqused_k: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """``_flash_attention_forward`` (``varlen_attn``'s kernel, CUDA only): per sequence, the
    attention in float32 on the host, with FlashAttention's window, causal alignment,
    grouped-query heads and layouts (output as the query; log-sum-exp (H, total) packed,
    (B, H, S) dense)."""
    _flash_not_simulated(
        dropout_p, seqused_k=seqused_k, alibi_slopes=alibi_slopes, block_table=block_table
    )
    out = torch.empty_like(q)
    if cum_seq_q is None:
        lse = torch.empty(q.size(0), q.size(2), q.size(1), dtype=torch.float32)
    else:
        lse = torch.empty(q.size(1), q.size(0), dtype=torch.float32)
    for iq, ik in _flash_sequences(q, k, cum_seq_q, cum_seq_k):
        qi, ki = q[iq], k[ik]
        if qi.size(0) == 0:
            continue
        mask = _flash_window_mask(
            qi.size(0), ki.size(0), is_causal, window_size_left, window_size_right
        )
        o, l_ = _flash_one(qi, ki, v[ik], mask, scale)
        out[iq] = o.to(out.dtype)
        if cum_seq_q is None:
            lse[iq] = l_
        else:
            lse[:, iq] = l_
    rng_state = torch.zeros(2, dtype=torch.uint64)
    debug = torch.empty(0, dtype=q.dtype)
    return out, lse, rng_state, torch.zeros((), dtype=torch.uint64), debug


def _flash_attention_forward_no_dropout_inplace(
    out: torch.Tensor, q: torch.Tensor, *args: Any, **kwargs: Any
) -> torch.Tensor:
    """``varlen_attn_out``'s kernel: the forward, written into ``out``; returns the
    log-sum-exp."""
    result, lse = _flash_attention_forward(q, *args, **kwargs)[:2]
    out.copy_(result)
    return lse


def _flash_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cum_seq_q: torch.Tensor | None,
    cum_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    rng_state: torch.Tensor,
    unused: torch.Tensor,
    *,
    scale: float | None = None,
    window_size_left: int | None = None,
    window_size_right: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_flash_attention_backward``: per sequence, the float32 forward of
    :func:`_flash_attention_forward` recomputed under autograd on the host; the gradients
    of grouped key and value heads summed over their query heads."""
    _flash_not_simulated(dropout_p)
    gq, gk, gv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for iq, ik in _flash_sequences(q, k, cum_seq_q, cum_seq_k):
        qi, ki, vi = q[iq], k[ik], v[ik]
        if qi.size(0) == 0:
            continue
        mask = _flash_window_mask(
            qi.size(0), ki.size(0), is_causal, window_size_left, window_size_right
        )

        def forward(a: Any, b: Any, c: Any, mask: Any = mask) -> torch.Tensor:
            return _flash_one(a, b, c, mask, scale)[0]

        grads = _recomputed_grads(
            forward, (qi.float(), ki.float(), vi.float()), (True, True, True),
            grad_out[iq].float(),
        )  # fmt: skip
        for g, dst, index in zip(grads, (gq, gk, gv), (iq, ik, ik), strict=True):
            assert g is not None
            dst[index] = g.to(dst.dtype)
    return gq, gk, gv


# --------------------------------------------------------------------------------------------
# RMSNorm: CUDA's fused kernel, computed by its composite on the host

#: attribute of a fused RMSNorm's host ``rstd`` storage: the forward's ``eps``, for the
#: backward's recompute (CUDA's backward needs none; the CPU's composite does)
_RMS_EPS = "_perf_sim_rms_norm_eps"


def _fused_rms_norm(
    input: torch.Tensor,
    normalized_shape: list[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_fused_rms_norm`` (``F.rms_norm``, ``nn.RMSNorm``): ``rms_norm_symint`` calls it for
    every device but MPS, and CUDA has a kernel for it (autograd: one
    ``_fused_rms_norm_backward``), where a device without one (the CPU, ``PrivateUse1``) runs
    its composite, about 10 ops forward and 15 backward. Computed here by that composite on the
    host: the CPU's values."""
    out, rstd = aten._fused_rms_norm.default(input, normalized_shape, weight, eps)
    setattr(rstd.untyped_storage(), _RMS_EPS, eps)
    return out, rstd


def _fused_rms_norm_backward(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    normalized_shape: list[int],
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    output_mask: list[bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients a CPU run computes: its composite recomputed under autograd with the
    forward's ``eps`` (kept on ``rstd``); without it (an ``rstd`` made elsewhere), PyTorch's
    decomposition of CUDA's backward."""
    wanted = (bool(output_mask[0]), bool(output_mask[1]) and weight is not None)
    storage = rstd.untyped_storage()
    if not hasattr(storage, _RMS_EPS):
        from torch._decomp.decompositions import _fused_rms_norm_backward as decomposed

        return decomposed(grad_out, input, normalized_shape, rstd, weight, list(wanted))
    eps = getattr(storage, _RMS_EPS)

    def forward(x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        return aten._fused_rms_norm.default(x, normalized_shape, w, eps)[0]

    gx, gw = _recomputed_grads(forward, (input, weight), wanted, grad_out)
    return gx, gw


# --------------------------------------------------------------------------------------------
# cuDNN's grid sampler: the CPU's bilinear, zeros, align_corners sampler


def _cudnn_grid_sampler(input: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """``cudnn_grid_sampler_forward``: a contiguous output (N, C, H_out, W_out)."""
    out = aten.grid_sampler_2d(input, grid.contiguous(), 0, 0, True)
    return out.contiguous()


def _cudnn_grid_sampler_backward(
    input: torch.Tensor, grid: torch.Tensor, grad_output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cudnn_grid_sampler_backward``: both gradients, always (cuDNN computes both)."""
    gi, gg = aten.grid_sampler_2d_backward(
        grad_output, input, grid.contiguous(), 0, 0, True, [True, True]
    )
    return gi.contiguous(), gg.contiguous()


# --------------------------------------------------------------------------------------------
# dtype combinations only CUDA kernels accept


def _softmax_backward_data(
    grad: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype
) -> torch.Tensor:
    # _softmax(half, half_to_float=True) (SDPA's math path under autocast) has a float output;
    # CUDA's backward returns the input's dtype, the CPU kernel refuses the pair.
    if grad.dtype != input_dtype:
        return aten._softmax_backward_data(grad, output, dim, grad.dtype).to(input_dtype)
    return aten._softmax_backward_data(grad, output, dim, input_dtype)


def _log_softmax_backward_data(
    grad: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype
) -> torch.Tensor:
    if grad.dtype != input_dtype:
        return aten._log_softmax_backward_data(grad, output, dim, grad.dtype).to(input_dtype)
    return aten._log_softmax_backward_data(grad, output, dim, input_dtype)


_INTEGRAL = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _histc_integral(x: torch.Tensor, bins: int = 100, min: Any = 0, max: Any = 0) -> torch.Tensor:
    """``histc`` of an integer tensor, as ``cuda/SummaryOps.cu`` computes it.

    CUDA's ``_histc_cuda`` dispatches ``AT_DISPATCH_ALL_TYPES`` (integers too, deterministic
    since they count with integer atomics); the CPU kernel has floating types only. So code
    that keeps CUDA's branch (transformers' MoE routing: ``histc(expert_ids.int())`` off the
    CPU) needs this on ``sim``. The bounds are ``acc_type`` (int64) scalars stored as the input
    type; a read of the extremes when ``min == max`` (two syncs, counted by the rule in
    :mod:`perf.sim.kernel_syncs`); ``getBin`` is ``(int)((v - min) * bins / (max - min))`` in
    int64, the last bin closed."""
    if bins <= 0:
        raise RuntimeError("bins must be > 0")
    lo = torch.tensor(int(min)).to(x.dtype).item()  # Scalar::to<int64_t>, then input_t
    hi = torch.tensor(int(max)).to(x.dtype).item()
    if lo == hi and x.numel() > 0:
        lo, hi = int(x.min()), int(x.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not lo < hi:
        raise RuntimeError("max must be larger than min")
    v = x.reshape(-1).to(torch.int64)
    v = v[(v >= lo) & (v <= hi)]
    b = ((v - lo) * bins).div_(hi - lo, rounding_mode="floor").clamp_(max=bins - 1)
    return torch.bincount(b, minlength=bins).to(x.dtype)


def _histc_integral_out(
    x: torch.Tensor, bins: int = 100, min: Any = 0, max: Any = 0, *, out: torch.Tensor
) -> torch.Tensor:
    ret = _histc_integral(x, bins, min, max)  # _histc_out_cuda: resize_output, then copy_
    if out.shape != ret.shape:
        out.resize_(ret.shape)
    return out.copy_(ret)


# --------------------------------------------------------------------------------------------
# cuDNN's batch norm (cudnn/BatchNorm.cpp; chosen in Normalization.cpp _batch_norm_impl_index,
# perf.sim.paths): the CPU's native_batch_norm computes what it computes


def _cudnn_batch_norm(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    exponential_average_factor: float,
    epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, save_mean, save_invstd, reserve): cuDNN saves the inverse standard deviation,
    as ``native_batch_norm`` does; the reserve is cuDNN's
    (``cudnnGetBatchNormalizationTrainingExReserveSpaceSize``), 0 bytes without a fused
    activation, as here."""
    out, mean, invstd = torch.native_batch_norm(
        input, weight, bias, running_mean, running_var, training, exponential_average_factor,
        epsilon,
    )  # fmt: skip
    return out, mean, invstd, torch.empty(0, dtype=torch.uint8)


def _cudnn_batch_norm_backward(
    input: torch.Tensor,
    grad_output: torch.Tensor,
    weight: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    save_mean: torch.Tensor | None,
    save_var: torch.Tensor | None,
    epsilon: float,
    reserveSpace: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad input, grad weight, grad bias), all three, as cuDNN's training backward."""
    return aten.native_batch_norm_backward.default(
        grad_output, input, weight, running_mean, running_var, save_mean, save_var, True,
        epsilon, [True, True, True],
    )  # fmt: skip


#: operator name -> (the dtypes whose kernel only CUDA has, the host kernel for them): the
#: fallback runs the CPU kernel and, where it has no kernel for the dtype, this one
CUDA_DTYPES: dict[str, tuple[tuple[torch.dtype, ...], Any]] = {
    "histc": (_INTEGRAL, _histc_integral),
    "histc.out": (_INTEGRAL, _histc_integral_out),
}


#: operator (``native_functions.yaml`` name) -> the host kernel that runs it on ``sim``
KERNELS: dict[str, Any] = {
    "cudnn_batch_norm": _cudnn_batch_norm,
    "cudnn_batch_norm_backward": _cudnn_batch_norm_backward,
    "_thnn_fused_lstm_cell": _lstm_cell,
    "_thnn_fused_lstm_cell_backward_impl": _lstm_cell_backward,
    "_thnn_fused_gru_cell": _gru_cell,
    "_thnn_fused_gru_cell_backward": _gru_cell_backward,
    "_fused_dropout": _fused_dropout,
    "_masked_scale": _masked_scale,
    "mm.dtype": _out_dtype(aten.mm.default),
    "bmm.dtype": _out_dtype(aten.bmm.default),
    "addmm.dtype": _out_dtype(aten.addmm.default),
    "baddbmm.dtype": _out_dtype(aten.baddbmm.default),
    "mm.dtype_out": _out_dtype_out(aten.mm.default),
    "bmm.dtype_out": _out_dtype_out(aten.bmm.default),
    "addmm.dtype_out": _out_dtype_out(aten.addmm.default),
    "baddbmm.dtype_out": _out_dtype_out(aten.baddbmm.default),
    "record_stream": _record_stream,
    "_scaled_dot_product_flash_attention": _flash,
    "_scaled_dot_product_flash_attention_backward": _flash_backward,
    "_scaled_dot_product_efficient_attention": _efficient,
    "_scaled_dot_product_efficient_attention_backward": _efficient_backward,
    "_flash_attention_forward": _flash_attention_forward,
    "_flash_attention_forward_no_dropout_inplace": _flash_attention_forward_no_dropout_inplace,
    "_flash_attention_backward": _flash_attention_backward,
    "_fused_rms_norm": _fused_rms_norm,
    "_fused_rms_norm_backward": _fused_rms_norm_backward,
    "cudnn_grid_sampler": _cudnn_grid_sampler,
    "cudnn_grid_sampler_backward": _cudnn_grid_sampler_backward,
    "_softmax_backward_data": _softmax_backward_data,
    "_log_softmax_backward_data": _log_softmax_backward_data,
}


def _host_kernel(fn: Any, op: Any, after_op: dict[Any, Any]) -> Any:
    run = named_kernel(op, fn)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        seen: Seen = {}
        cargs = [unwrap(op, a, seen) for a in args]
        ckw = {k: unwrap(op, v, seen) for k, v in kwargs.items()}
        out = run(*cargs, **ckw)
        result = rewrap(out, seen, out_index(op, seen, kwargs))
        after = after_op.get(op)  # the memory model's BLAS workspaces
        if after is not None:
            after(op, args)
        return result

    kernel.__name__ = f"sim_{fn.__name__}"
    return kernel


def register_cuda_ops(lib: Any, after_op: dict[Any, Any]) -> None:
    """Register :data:`KERNELS`; ``after_op`` (``perf.sim.kernels.after_op``, kept current by
    the memory model) holds the hooks to call after an op ran."""
    for name, fn in KERNELS.items():
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet, None), overload or "default", None)
        if op is None:
            continue  # not in this torch
        lib.impl(name, _host_kernel(fn, op, after_op), "PrivateUse1")
