"""CUDA-only operators on ``sim``: the enumeration stays complete, RNNs and attention run
forward and backward with the CPU's results."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _sim import native_functions

import perf
from perf.sim import cuda_only, cuda_ops, rnn
from perf.sim.device import unavailable_reason

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None,
    reason=f"simulated device unavailable: {unavailable_reason()}",
)


def _cuda_only_ops() -> set[str]:
    out = set()
    for fn in native_functions():
        keys: set[str] = set()
        for k in fn.get("dispatch") or {}:
            keys |= {x.strip() for x in k.split(",")}
        if (
            "CUDA" in keys
            and "CPU" not in keys
            and not any(k.startswith("Composite") for k in keys)
        ):
            out.add(fn["func"].split("(")[0])
    return out


def test_every_cuda_only_operator_has_a_sim_kernel_or_a_reason() -> None:
    """Fails when a torch release adds an operator with a CUDA kernel and no CPU one: decide
    (perf/sim/cuda_ops.py) whether sim needs a kernel for it."""
    ops = _cuda_only_ops()
    assert len(ops) > 50, "native_functions.yaml parsed to too few CUDA-only ops"
    # the dispatcher agrees that none of them has a CPU kernel in this build
    for name in ops:
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "CPU"), name
    handled = set(cuda_ops.KERNELS) | set(cuda_only.NOT_ON_SIM) | set(rnn.CUDNN_OPS)
    assert ops - handled == set(), "new CUDA-only ops: give them a sim kernel or a reason"
    assert set(cuda_only.NOT_ON_SIM) - ops == set(), "stale entries in NOT_ON_SIM"
    overlap = set(cuda_ops.KERNELS) & set(cuda_only.NOT_ON_SIM)
    assert overlap == set()
    assert set(rnn.CUDNN_OPS) & (set(cuda_ops.KERNELS) | set(cuda_only.NOT_ON_SIM)) == set()


def test_each_sim_kernel_is_registered_for_the_device() -> None:
    perf.simulated_device()
    for name in (*cuda_ops.KERNELS, *rnn.CUDNN_OPS):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "PrivateUse1"), name


def test_an_operator_without_a_kernel_fails_naming_it() -> None:
    dev = perf.simulated_device()
    x = torch.ones(4, 4, device=dev)
    with pytest.raises(NotImplementedError, match="_cslt_compress"):
        torch._cslt_compress(x)


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
@pytest.mark.parametrize(
    "kw", [{}, {"bias": False}, {"num_layers": 2, "bidirectional": True, "batch_first": True}]
)
@pytest.mark.parametrize("cudnn", [True, False], ids=["cudnn", "fused-cells"])
def test_rnn_forward_backward_equal_cpu(cls: type, kw: dict, cudnn: bool) -> None:
    """Both of CUDA's RNN paths on sim (cuDNN's, the default, and the fused cells it runs with
    cuDNN off) give the CPU's values and gradients: cuDNN's bit for bit (sim runs the CPU's
    own RNN), the fused cells' to rounding (CUDA's cell math, in other ops)."""
    dev = perf.simulated_device()
    torch.manual_seed(0)
    m = cls(8, 16, **kw)
    with torch.backends.cudnn.flags(enabled=cudnn):
        ms = copy.deepcopy(m).to(dev)
    x = torch.randn(5, 3, 8)
    xs = x.to(dev).requires_grad_()
    x.requires_grad_()
    y, h = m(x)
    with torch.backends.cudnn.flags(enabled=cudnn):
        ys, hs = ms(xs)
    h0 = h[0] if isinstance(h, tuple) else h
    hs0 = hs[0] if isinstance(hs, tuple) else hs
    (y.sum() + h0.sum()).backward()
    (ys.sum() + hs0.sum()).backward()
    assert ys.device == dev
    same = torch.equal if cudnn else _close
    assert same(ys.cpu(), y)
    assert xs.grad is not None and x.grad is not None and same(xs.grad.cpu(), x.grad)
    for p, q in zip(m.parameters(), ms.parameters(), strict=True):
        assert same(q.grad.cpu(), p.grad)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    torch.testing.assert_close(a, b)
    return True


@pytest.mark.parametrize("cell", [torch.nn.LSTMCell, torch.nn.GRUCell, torch.nn.RNNCell])
def test_rnn_cells_forward_backward_equal_cpu(cell: type) -> None:
    dev = perf.simulated_device()
    torch.manual_seed(0)
    m = cell(8, 16)
    ms = copy.deepcopy(m).to(dev)
    x = torch.randn(3, 8)
    y, ys = m(x), ms(x.to(dev))
    y = y[0] if isinstance(y, tuple) else y
    ys = ys[0] if isinstance(ys, tuple) else ys
    (y * y).sum().backward()
    (ys * ys).sum().backward()
    torch.testing.assert_close(ys.cpu(), y)
    for p, q in zip(m.parameters(), ms.parameters(), strict=True):
        torch.testing.assert_close(q.grad.cpu(), p.grad)


def test_lstm_uses_the_fused_cell_as_on_cuda_without_cudnn() -> None:
    """With cuDNN off, RNN.cpp picks _thnn_fused_lstm_cell for non-CPU inputs: sim must run
    that path (with cuDNN on, the default, test_sim_rnn.py)."""
    dev = perf.simulated_device()
    m = torch.nn.LSTM(4, 8).to(dev)
    x = torch.randn(3, 2, 4, device=dev)
    with perf.count_ops() as o, torch.backends.cudnn.flags(enabled=False):
        m(x)[0].sum().backward()
    assert o.by_op.get("_thnn_fused_lstm_cell", 0) == 3, o.by_op
    assert o.by_op.get("_thnn_fused_lstm_cell_backward_impl", 0) == 3, o.by_op


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sdpa_under_autocast_backward(dtype: torch.dtype) -> None:
    """The issue's repro: fp16 SDPA backward failed with "expected scalar type Float"."""
    dev = perf.simulated_device()
    q = (torch.arange(2 * 3 * 16 * 8, dtype=torch.float32).reshape(2, 3, 16, 8) % 7 / 7).to(dev)
    q.requires_grad_()
    with torch.autocast(dev.type, dtype=dtype):
        z = F.scaled_dot_product_attention(q, q, q)
    z.float().sum().backward()
    assert z.dtype == dtype and q.grad is not None and q.grad.dtype == torch.float32


def test_flash_attention_kernel_matches_math() -> None:
    dev = perf.simulated_device()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    qs, ks, vs = (t.to(dev).requires_grad_() for t in (q, k, v))
    out = torch.ops.aten._scaled_dot_product_flash_attention(qs, ks, vs, 0.0, True)[0]
    torch.testing.assert_close(out.cpu(), ref)
    out.sum().backward()
    assert qs.grad is not None and qs.grad.shape == q.shape


def test_out_dtype_matmul_and_record_stream() -> None:
    dev = perf.simulated_device()
    a = torch.ones(2, 3, device=dev, dtype=torch.float16)
    b = torch.ones(3, 4, device=dev, dtype=torch.float16)
    out = torch.mm(a, b, out_dtype=torch.float32)
    assert out.dtype == torch.float32 and out.device == dev
    assert torch.equal(out.cpu(), torch.full((2, 4), 3.0))
    a.record_stream(torch.accelerator.current_stream())  # no error, nothing to record


def test_integer_histc_runs_cudas_integer_kernel() -> None:
    """``histc`` of integers: CUDA has a kernel (transformers' MoE routing calls it off the
    CPU), the CPU none; ``sim`` computes what ``cuda/SummaryOps.cu`` does, in int64."""
    dev = perf.simulated_device()
    x = torch.tensor([0, 1, 1, 3, 3, 3, 7, -2], dtype=torch.int32)
    with pytest.raises(NotImplementedError):
        torch.histc(x, bins=4, min=0, max=3)  # the CPU's kernel has floating types only
    got = torch.histc(x.to(dev), bins=4, min=0, max=3)
    assert got.dtype == torch.int32 and got.device == dev
    assert got.tolist() == [1, 2, 0, 3]  # 7 and -2 are out of range; 3 goes to the last bin
    # min == max: the range is the data's, [-2, 7]; bin = (v + 2) * 3 // 9, 7 -> the last
    assert torch.histc(x.to(dev), bins=3).tolist() == [2, 5, 1]
    # Scalar bounds convert to int64 as C++ does (truncation): [0.5, 6.9] is [0, 6]
    assert torch.histc(x.to(dev), bins=7, min=0.5, max=6.9).tolist() == [1, 2, 0, 3, 0, 0, 0]
    out = torch.empty(0, dtype=torch.int32, device=dev)
    torch.histc(x.to(dev), bins=4, min=0, max=3, out=out)
    assert out.tolist() == [1, 2, 0, 3]
    # floats keep the CPU's kernel; bool has no kernel on CUDA either
    f = torch.tensor([0.0, 1.0, 2.5])
    assert torch.equal(torch.histc(f.to(dev), 3, 0, 3).cpu(), torch.histc(f, 3, 0, 3))
    with pytest.raises(NotImplementedError, match="histc"):
        torch.histc(x.bool().to(dev), bins=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_forward_backward_equal_cpu(dtype: torch.dtype) -> None:
    """``_grouped_mm`` (MoE experts) runs the CPU's kernel on host views, forward and backward,
    where the composite kernel ran op by op on the device."""
    dev = perf.simulated_device()
    g = torch.Generator().manual_seed(0)
    a = torch.randn(12, 16, generator=g).to(dtype).requires_grad_()
    w = torch.randn(3, 16, 16, generator=g).to(dtype).requires_grad_()
    offs = torch.tensor([4, 9, 12], dtype=torch.int32)
    grad = torch.randn(12, 16, generator=g).to(dtype)
    sa, sw = (t.detach().to(dev).requires_grad_() for t in (a, w))
    out = torch._grouped_mm(sa, sw, offs=offs.to(dev))
    out.backward(grad.to(dev))
    ref = torch._grouped_mm(a, w, offs=offs)
    ref.backward(grad)
    assert torch.equal(out.cpu(), ref)
    assert sa.grad is not None and sw.grad is not None and a.grad is not None
    assert torch.equal(sa.grad.cpu(), a.grad) and torch.equal(sw.grad.cpu(), w.grad)


# --------------------------------------------------------------------------------------------
# variable-length attention (torch.nn.attention.varlen): FlashAttention's own entry points


def _varlen() -> Any:
    return pytest.importorskip("torch.nn.attention.varlen", reason="no varlen_attn")


def _band(lq: int, lk: int, left: int, right: int) -> torch.Tensor:
    """FlashAttention's mask as diagonals of a (lq, lk) matrix aligned bottom-right (its
    causal mask is torch's ``causal_lower_right``): at most ``right`` keys past the aligned
    diagonal, ``left`` before it; -1 unbounded."""
    keep = torch.ones(lq, lk, dtype=torch.bool)
    if right >= 0:
        keep = keep.tril(diagonal=lk - lq + right)
    if left >= 0:
        keep = keep.triu(diagonal=lk - lq - left)
    return keep


def _varlen_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cq: list[int], ck: list[int],
    window: tuple[int, int],
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Each sequence's attention in float64 (output (T, H, D), log-sum-exp (H, T))."""
    outs, lses = [], []
    for i in range(len(cq) - 1):
        qi = q[cq[i] : cq[i + 1]].double().transpose(0, 1)
        ki = k[ck[i] : ck[i + 1]].double().transpose(0, 1)
        vi = v[ck[i] : ck[i + 1]].double().transpose(0, 1)
        group = qi.size(0) // ki.size(0)
        ki, vi = ki.repeat_interleave(group, 0), vi.repeat_interleave(group, 0)
        scores = qi @ ki.transpose(-2, -1) / qi.size(-1) ** 0.5
        scores = scores.masked_fill(~_band(qi.size(1), ki.size(1), *window), float("-inf"))
        lse = torch.logsumexp(scores, -1)
        outs.append((torch.softmax(scores, -1) @ vi).transpose(0, 1))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "window", [(-1, -1), (-1, 0), (3, 0), (2, 2)], ids=["full", "causal", "sliding", "band"]
)
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_varlen_attention_runs_flash_as_on_cuda_forward_and_backward(
    dtype: torch.dtype, window: tuple[int, int], cross: bool
) -> None:
    """``varlen_attn`` calls ``_flash_attention_forward`` / ``_backward``, which only CUDA has
    (the CPU cannot run it at all): on ``sim`` packed sequences of their own lengths, grouped
    query heads, FlashAttention's windows and bottom-right causal alignment, with the float64
    reference's output, log-sum-exp and gradients to the dtype's precision."""
    varlen = _varlen()
    dev = perf.simulated_device()
    g = torch.Generator().manual_seed(0)
    cq = [0, 5, 14, 17]
    ck = [0, 7, 18, 22] if cross else cq
    h, hkv, d = 4, 2, 8
    q = torch.randn(cq[-1], h, d, generator=g).to(dtype)
    k = torch.randn(ck[-1], hkv, d, generator=g).to(dtype)
    v = torch.randn(ck[-1], hkv, d, generator=g).to(dtype)
    grad = torch.randn(cq[-1], h, d, generator=g).to(dtype)
    qs, ks, vs = (t.to(dev).requires_grad_() for t in (q, k, v))
    out, lse = varlen.varlen_attn(
        qs, ks, vs, torch.tensor(cq, dtype=torch.int32).to(dev),
        torch.tensor(ck, dtype=torch.int32).to(dev), 9, 11, window_size=window,
        enable_gqa=True, return_aux=varlen.AuxRequest(lse=True),
    )  # fmt: skip
    out.backward(grad.to(dev))
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    ref, ref_lse = _varlen_reference(qr, kr, vr, cq, ck, window)
    ref.backward(grad.double())
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    assert out.dtype == dtype and out.shape == q.shape and lse.dtype == torch.float32
    torch.testing.assert_close(out.cpu().double(), ref.detach(), **tol)
    torch.testing.assert_close(lse.cpu().double(), ref_lse.detach(), **tol)
    for got, want in ((qs.grad, qr.grad), (ks.grad, kr.grad), (vs.grad, vr.grad)):
        assert got.dtype == dtype
        torch.testing.assert_close(got.cpu().double(), want, **tol)


def test_varlen_attention_out_writes_into_its_buffer_and_refuses_what_sim_does_not_run() -> None:
    varlen = _varlen()
    dev = perf.simulated_device()
    g = torch.Generator().manual_seed(1)
    cu = [0, 6, 10]
    q, k, v = (torch.randn(10, 2, 8, generator=g) for _ in range(3))
    cus = torch.tensor(cu, dtype=torch.int32).to(dev)
    buf = torch.empty(10, 2, 8, device=dev)
    got = varlen.varlen_attn_out(buf, q.to(dev), k.to(dev), v.to(dev), cus, cus, 6, 6)
    assert got is buf
    ref, _ = _varlen_reference(q, k, v, cu, cu, (-1, -1))
    torch.testing.assert_close(buf.cpu().double(), ref, rtol=1e-5, atol=1e-5)
    used = torch.tensor([4, 4], dtype=torch.int32).to(dev)  # KV-cache decoding
    with pytest.raises(NotImplementedError, match="without seqused_k"):
        varlen.varlen_attn(q.to(dev), k.to(dev), v.to(dev), cus, cus, 6, 6, seqused_k=used)
