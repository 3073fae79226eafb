"""CUDA's code paths on ``sim`` (perf/sim/paths.py): one test per device-type branch of torch,
each checking that ``sim`` takes CUDA's branch, with the CPU's numbers."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _sim import SIM, native_functions, needs_sim
from torch import nn

import perf
from perf.sim import paths

pytestmark = needs_sim


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------
# group_norm's memory format


def test_group_norm_channels_last_runs_as_on_cuda_forward_and_backward() -> None:
    torch.manual_seed(0)
    gn = nn.GroupNorm(4, 8)
    x = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last)
    xs = x.to(SIM).requires_grad_()
    xc = x.clone().requires_grad_()
    gs = nn.GroupNorm(4, 8).to(SIM)
    gs.load_state_dict(gn.state_dict())
    ys, yc = gs(xs), gn(xc)
    # CUDA's branch: contiguous output (the CPU keeps channels-last)
    assert ys.is_contiguous() and not yc.is_contiguous()
    _close(ys, yc)
    (ys * torch.arange(ys.numel(), device=SIM).view_as(ys)).sum().backward()
    (yc * torch.arange(yc.numel()).view_as(yc)).sum().backward()
    _close(xs.grad, xc.grad)
    _close(gs.weight.grad, gn.weight.grad)


def test_group_norm_bad_groups_fail_as_in_torch() -> None:
    with pytest.raises(RuntimeError, match="divisible by num_groups"):
        F.group_norm(torch.randn(2, 6, 3, device=SIM), 4)


def test_group_norm_runs_in_inference_mode() -> None:
    x = torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        _close(F.group_norm(x.to(SIM), 2), F.group_norm(x, 2))


class _UNetBlock(nn.Module):
    """A diffusion UNet's pattern: GroupNorm after a self-attention block on conv features."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.norm = nn.GroupNorm(4, c)
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.proj = nn.Conv2d(c, c, 1)
        self.norm2 = nn.GroupNorm(4, c)
        self.out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        b, c, hh, ww = h.shape
        q, k, v = self.qkv(self.norm(h)).chunk(3, 1)
        q, k, v = (t.reshape(b, 1, c, hh * ww).transpose(2, 3) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v).transpose(2, 3).reshape(b, c, hh, ww)
        h = h + self.proj(a)
        return self.out(F.silu(self.norm2(h)))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_channels_last_unet_block_trains(compiled: bool) -> None:
    torch.manual_seed(0)
    ref = _UNetBlock().to(memory_format=torch.channels_last)
    m = _UNetBlock().to(SIM).to(memory_format=torch.channels_last)
    m.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    if compiled:
        torch._dynamo.reset()
    run = torch.compile(m) if compiled else m
    loss = run(x.to(SIM)).square().mean()
    loss.backward()
    ref(x).square().mean().backward()
    torch.testing.assert_close(loss.cpu(), ref(x).square().mean(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.conv.weight.grad.cpu(), ref.conv.weight.grad, rtol=1e-3, atol=1e-4)


# --------------------------------------------------------------------------------------------
# composite-explicit operators run their own kernel, as on CUDA


def test_every_op_with_cpu_cuda_and_composite_kernels_runs_its_own_kernel_on_sim() -> None:
    """An operator with CPU and CUDA kernels and a CompositeExplicitAutograd one runs the
    composite on other backends (op by op, other syncs); on ``sim`` it must run one kernel, as
    CUDA does. Fails when a torch release adds one: register it in perf/sim/paths.py."""
    missing = []
    for fn in native_functions():
        keys: set[str] = set()
        for k in fn.get("dispatch") or {}:
            keys |= {x.strip() for x in k.split(",")}
        if {"CPU", "CUDA", "CompositeExplicitAutograd"} <= keys:
            name = "aten::" + fn["func"].split("(")[0]
            if name == "aten::_pin_memory":
                continue  # host memory: perf/sim/kernels.py
            if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
                missing.append(name)
    assert missing == []


def test_every_op_with_a_cuda_kernel_over_an_implicit_composite_runs_a_kernel_on_sim() -> None:
    """An operator with a CUDA kernel and a CompositeImplicitAutograd one, but no CPU kernel,
    is one kernel on CUDA and its composite elsewhere (``_fused_rms_norm``: about 25 ops with
    its backward). Fails when a torch release adds one: give it a kernel in
    perf/sim/cuda_ops.py."""
    found, missing = [], []
    for fn in native_functions():
        keys: set[str] = set()
        for k in fn.get("dispatch") or {}:
            keys |= {x.strip() for x in k.split(",")}
        if "CUDA" in keys and "CPU" not in keys and "CompositeImplicitAutograd" in keys:
            name = "aten::" + fn["func"].split("(")[0]
            found.append(name)
            if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
                missing.append(name)
    assert "aten::_fused_rms_norm" in found  # the class is read (else this test cannot fail)
    assert missing == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_runs_cudas_fused_kernel_with_the_cpus_values(dtype: torch.dtype) -> None:
    """`F.rms_norm` / `nn.RMSNorm`: one `_fused_rms_norm` and one `_fused_rms_norm_backward`, as
    on CUDA (a `PrivateUse1` device without a kernel ran the composite: pow, mean, add, rsqrt,
    two mul, and their backward); values and gradients equal the CPU's bit for bit."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 16, generator=g).to(dtype).requires_grad_()
    w = torch.randn(16, generator=g).to(dtype).requires_grad_()
    weights = torch.arange(4 * 6 * 16).view(4, 6, 16).cos()
    (F.rms_norm(x, (16,), w, 1e-5).float() * weights).sum().backward()
    xs, ws = (t.detach().to(SIM).requires_grad_() for t in (x, w))
    with perf.count_ops(SIM) as o:
        y = F.rms_norm(xs, (16,), ws, 1e-5)
        (y.float() * weights.to(SIM)).sum().backward()
    assert o.by_op["_fused_rms_norm"] == 1 and o.by_op["_fused_rms_norm_backward"] == 1
    assert not {"pow", "rsqrt", "mean"} & set(o.by_op), o.by_op
    assert torch.equal(y.cpu(), F.rms_norm(x, (16,), w, 1e-5))
    assert torch.equal(xs.grad.cpu(), x.grad) and torch.equal(ws.grad.cpu(), w.grad)
    # no weight, eps from the dtype; only the input's gradient
    z = torch.randn(3, 16, generator=g, requires_grad=True)
    zs = z.detach().to(SIM).requires_grad_()
    nn.RMSNorm(16, elementwise_affine=False)(z).pow(2).sum().backward()
    nn.RMSNorm(16, elementwise_affine=False).to(SIM)(zs).pow(2).sum().backward()
    assert torch.equal(zs.grad.cpu(), z.grad)


def test_layer_norm_runs_the_cpu_kernel_not_the_math_composite() -> None:
    seen: list[str] = []

    class Ops(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 16)
    ln = nn.LayerNorm(16)
    lns = nn.LayerNorm(16).to(SIM)
    with Ops():
        y = lns(x.to(SIM))
    assert seen == ["aten._to_copy.default", "aten.native_layer_norm.default"]
    _close(y, ln(x))


def test_addr_and_stack_match_the_cpu() -> None:
    a, b, m = torch.randn(3), torch.randn(4), torch.randn(3, 4)
    _close(torch.addr(m.to(SIM), a.to(SIM), b.to(SIM)), torch.addr(m, a, b))
    _close(torch.stack([a.to(SIM), a.to(SIM)]), torch.stack([a, a]))


# --------------------------------------------------------------------------------------------
# SDPA backend choice: CUDA's order


def _choice(dtype: torch.dtype, head: int = 16, mask: bool = False) -> int:
    q = torch.randn(2, 2, 8, head, device=SIM, dtype=dtype)
    m = torch.ones(8, 8, dtype=torch.bool, device=SIM) if mask else None
    return int(torch.ops.aten._fused_sdp_choice(q, q, q, m))


# --------------------------------------------------------------------------------------------
# batch norm: cuDNN's kernel


@pytest.mark.parametrize(
    "case", ["train", "eval", "channels_last", "fp16_input", "bf16", "no_affine"]
)
def test_batch_norm_takes_cudnns_kernel_where_cuda_does(case: str) -> None:
    """``_batch_norm_impl_index``'s ``use_cudnn``: ``cudnn_batch_norm`` and its backward on
    CUDA, with cuDNN's conditions (bf16 and a BatchNorm without affine weights keep
    ``native_batch_norm``, on CUDA too); values, gradients and running statistics equal the
    CPU's, bit for bit (its ``native_batch_norm`` computes them)."""
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(4, affine=case != "no_affine")
    x = torch.randn(3, 4, 5, 5)
    if case == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    if case == "fp16_input":
        x = x.half()  # fp32 weights: cuDNN takes it (the AMP case)
    if case == "bf16":
        bn, x = bn.bfloat16(), x.bfloat16()
    if case == "eval":
        bn.eval()
    bs = nn.BatchNorm2d(4, affine=bn.affine).to(x.dtype if case == "bf16" else None).to(SIM)
    bs.load_state_dict(bn.state_dict())
    bs.train(bn.training)
    xs, xc = x.to(SIM).requires_grad_(), x.clone().requires_grad_()
    with torch.backends.cudnn.flags(enabled=True), perf.count_ops(SIM) as o:
        ys = bs(xs)
        (ys.float() * torch.arange(ys.numel(), device=SIM).view_as(ys)).sum().backward()
    yc = bn(xc)
    (yc.float() * torch.arange(yc.numel()).view_as(yc)).sum().backward()
    cudnn = case not in ("bf16", "no_affine")
    assert ("cudnn_batch_norm" in o.by_op) == cudnn, o.by_op
    assert ("native_batch_norm" in o.by_op) == (not cudnn), o.by_op
    if case == "train":
        assert o.by_op["cudnn_batch_norm_backward"] == 1
    assert torch.equal(ys.cpu(), yc)
    if case == "channels_last":
        assert not torch.equal(xs.grad.cpu(), xc.grad)  # the order of the sums, as above
        _close(xs.grad, xc.grad)
    else:
        assert torch.equal(xs.grad.cpu(), xc.grad)
    for a, b in zip(bs.state_dict().values(), bn.state_dict().values(), strict=True):
        assert torch.equal(a.cpu(), b)
    if bn.affine and case == "channels_last":
        _close(bs.weight.grad, bn.weight.grad)
    elif bn.affine:
        assert torch.equal(bs.weight.grad.cpu(), bn.weight.grad)


def test_batch_norm_with_cudnn_off_keeps_native() -> None:
    bs = nn.BatchNorm2d(4).to(SIM)
    with torch.backends.cudnn.flags(enabled=False), perf.count_ops(SIM) as o:
        bs(torch.randn(2, 4, 3, 3, device=SIM))
    assert o.by_op.get("native_batch_norm") == 1 and "cudnn_batch_norm" not in o.by_op


def test_sdpa_picks_cudas_backends() -> None:
    from torch.nn.attention import SDPBackend

    assert _choice(torch.float16) == SDPBackend.FLASH_ATTENTION.value
    assert _choice(torch.bfloat16) == SDPBackend.FLASH_ATTENTION.value
    assert _choice(torch.float32) == SDPBackend.EFFICIENT_ATTENTION.value  # no fp32 flash
    assert _choice(torch.float16, mask=True) == SDPBackend.EFFICIENT_ATTENTION.value
    assert _choice(torch.float32, head=6) == SDPBackend.MATH.value
    with torch.nn.attention.sdpa_kernel(SDPBackend.MATH):
        assert _choice(torch.float16) == SDPBackend.MATH.value


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_grouped_query_and_non_square_causal_follow_cuda(dtype: torch.dtype) -> None:
    """Grouped-query attention (Llama, Mistral, Qwen: fewer key / value heads) takes flash on
    CUDA in half precision and math in fp32 (memory-efficient needs equal heads); a causal
    mask over unequal lengths never takes flash (FlashAttention-2 aligns it lower-right).
    ``sim`` picks the same and computes what the CPU computes, forward and backward."""
    from torch.nn.attention import SDPBackend

    g = torch.Generator().manual_seed(0)
    half = dtype == torch.bfloat16

    def qkv(qh: int, kh: int, lq: int, lk: int) -> list[torch.Tensor]:
        shapes = [(2, qh, lq, 32), (2, kh, lk, 32), (2, kh, lk, 32)]
        return [torch.randn(sh, generator=g).to(dtype).requires_grad_() for sh in shapes]

    flash, eff, math = SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH
    for (qh, kh, lq, lk), kw, expected in [
        ((8, 2, 16, 16), {"is_causal": True, "enable_gqa": True}, flash if half else math),
        ((8, 2, 1, 16), {"enable_gqa": True}, flash if half else math),
        ((8, 8, 16, 16), {"enable_gqa": True}, flash if half else eff),
        ((8, 8, 4, 16), {"is_causal": True}, eff),
    ]:
        cpu = qkv(qh, kh, lq, lk)
        sim = [t.detach().to(SIM).requires_grad_() for t in cpu]
        choice = int(torch.ops.aten._fused_sdp_choice(*sim, **kw))
        assert choice == expected.value, (qh, kh, lq, lk, kw)
        out = F.scaled_dot_product_attention(*sim, **kw)
        ref = F.scaled_dot_product_attention(*cpu, **kw)
        out.sum().backward()
        ref.sum().backward()
        tol = 1e-5 if dtype == torch.float32 else 7e-2
        torch.testing.assert_close(out.cpu(), ref, rtol=tol, atol=tol)
        for a, b in zip(sim, cpu, strict=True):
            torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_on_each_backend_matches_the_cpu(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 16, dtype=dtype, requires_grad=True) for _ in range(3))
    qs, ks, vs = (t.detach().to(SIM).requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()
    ref.sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.cpu(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(qs.grad.cpu(), q.grad, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("kw", "dtype", "channels", "cudnn"),
    [
        ({"align_corners": True}, torch.float32, 3, True),
        ({"align_corners": False}, torch.float32, 3, False),  # cuDNN aligns corners only
        ({"align_corners": True, "mode": "nearest"}, torch.float32, 3, False),
        ({"align_corners": True, "padding_mode": "border"}, torch.float32, 3, False),
        ({"align_corners": True}, torch.bfloat16, 3, False),  # not a cuDNN dtype
        ({"align_corners": True}, torch.float32, 1025, False),  # cuDNN: at most 1,024
    ],
)
def test_grid_sample_takes_cudnns_sampler_under_cudas_conditions(
    kw: dict[str, Any], dtype: torch.dtype, channels: int, cudnn: bool
) -> None:
    """``grid_sampler`` runs ``cudnn_grid_sampler`` on CUDA for bilinear sampling with zeros
    padding and aligned corners (a spatial transformer's ``F.grid_sample(x, grid,
    align_corners=True)``); ``sim`` ran ``grid_sampler_2d``. Values and gradients equal the
    CPU's."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, channels, 6, 6, generator=g).to(dtype).requires_grad_()
    grid = (torch.rand(2, 5, 5, 2, generator=g) * 2.2 - 1.1).to(dtype).requires_grad_()
    xs, gs = (t.detach().to(SIM).requires_grad_() for t in (x, grid))
    with perf.count_ops(SIM) as o:
        out = F.grid_sample(xs, gs, **kw)
        out.float().square().sum().backward()
    ref = F.grid_sample(x, grid, **kw)
    ref.float().square().sum().backward()
    names = {"cudnn_grid_sampler", "cudnn_grid_sampler_backward"}
    assert (names <= o.by_op.keys()) == cudnn and ("grid_sampler_2d" in o.by_op) != cudnn
    _close(out, ref)
    _close(xs.grad, x.grad)
    _close(gs.grad, grid.grad)
    with torch.inference_mode(), perf.count_ops(SIM) as o:
        F.grid_sample(xs.detach(), gs.detach(), **kw)
    assert ("cudnn_grid_sampler" in o.by_op) == cudnn


def _attention_ops(fn: Any) -> dict[str, int]:
    with perf.count_ops(SIM) as o:
        fn()
    return {k: v for k, v in o.by_op.items() if "attention" in k or k in ("bmm", "where")}


def test_sdpa_runs_the_kernel_cuda_picks_forward_and_backward() -> None:
    """The composite asks a dispatch stub for the backend, which a ``PrivateUse1`` device
    has not registered: ``sim`` ran the math backend (two ``bmm`` and the score matrix)
    whatever ``_fused_sdp_choice`` said. Now one kernel, as on CUDA, also under
    ``inference_mode`` (where autograd's key is skipped)."""

    def step(dtype: torch.dtype, head: int = 16, **kw: Any) -> Any:
        q = torch.randn(2, 2, 8, head, device=SIM, dtype=dtype, requires_grad=True)
        return lambda: F.scaled_dot_product_attention(q, q, q, **kw).sum().backward()

    flash = "_scaled_dot_product_flash_attention"
    eff = "_scaled_dot_product_efficient_attention"
    for dtype in (torch.float16, torch.bfloat16):
        assert _attention_ops(step(dtype, is_causal=True)) == {flash: 1, f"{flash}_backward": 1}
    assert _attention_ops(step(torch.float32, is_causal=True)) == {eff: 1, f"{eff}_backward": 1}
    # math (a head dim of 6 is aligned for neither): 2 bmm forward, 4 backward
    assert _attention_ops(step(torch.float32, head=6)) == {"bmm": 6}
    q = torch.randn(2, 2, 8, 16, device=SIM)
    with torch.inference_mode():
        assert _attention_ops(lambda: F.scaled_dot_product_attention(q, q, q)) == {eff: 1}
    # a last dimension of stride 64 (a contiguous (B, C, H, W) viewed as (B, 1, C, HW) and
    # transposed): both fused kernels refuse it on CUDA (check_last_dim_stride_equals_1_dense);
    # math, with the CPU's values (the CPU's flash kernel read such input as garbage)
    t = torch.randn(2, 1, 16, 64).transpose(2, 3)
    ts = t.to(SIM)  # same strides
    assert ts.stride(-1) == 64
    assert _attention_ops(lambda: F.scaled_dot_product_attention(ts, ts, ts)) == {"bmm": 2}
    ref = F.scaled_dot_product_attention(t, t, t)
    _close(F.scaled_dot_product_attention(ts, ts, ts), ref)
    direct = torch.ops.aten._scaled_dot_product_efficient_attention(ts, ts, ts, None, False)[0]
    _close(direct, ref)
    mask = torch.rand(8, 8, device=SIM) > 0.3  # boolean: made additive by where, as on CUDA
    assert _attention_ops(lambda: F.scaled_dot_product_attention(q, q, q, mask)) == {
        eff: 1,
        "where": 1,
    }


@pytest.mark.parametrize("layout", ["contiguous", "heads_transposed"])
def test_compiled_sdpa_holds_cudas_kernel_in_the_layouts_inductor_planned(layout: str) -> None:
    """Under ``torch.compile`` the composite runs on fake ``sim`` tensors: the graph holds the
    kernel CUDA's graph holds, and ``sim``'s kernels return the layouts the meta kernels
    planned (CUDA's), so no copy is added to fix strides (the CPU's flash kernel returns its
    log-sum-exp transposed; memory-efficient attention's is padded to 32 on CUDA)."""
    torch.manual_seed(0)

    def make() -> torch.Tensor:
        if layout == "contiguous":
            t = torch.randn(2, 2, 8, 16)
        else:  # (batch, length, heads, dim) viewed as heads first: what models pass
            t = torch.randn(2, 8, 2, 16).transpose(1, 2)
        return t.to(SIM, torch.bfloat16).requires_grad_()

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum()

    qkv = [make() for _ in range(3)]
    eager = [t.detach().clone().requires_grad_() for t in qkv]
    compiled = torch.compile(f, backend="inductor")
    with perf.count_ops(SIM) as o:
        out = compiled(*qkv)
        out.backward()
    ref = f(*eager)
    ref.backward()
    flash = "_scaled_dot_product_flash_attention"
    assert o.by_op[flash] == 1 and o.by_op[f"{flash}_backward"] == 1
    assert "copy_" not in o.by_op and "bmm" not in o.by_op
    torch.testing.assert_close(out, ref)
    for a, b in zip(qkv, eager, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("layout", ["bool", "float", "unaligned"])
def test_sdpa_masks_take_memory_efficient_attention_with_the_cpus_values(layout: str) -> None:
    """A mask goes to memory-efficient attention (flash takes none); a float mask that needs a
    gradient (a learned position bias, T5's) gets it from ``sim``'s kernel."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, generator=g, requires_grad=True) for _ in range(3))
    if layout == "bool":
        mask = torch.rand(8, 8, generator=g) > 0.3
    else:  # a bias of 8 x 5 columns: unaligned strides are padded to 8 and sliced back
        cols = 5 if layout == "unaligned" else 8
        mask = torch.randn(4, 8, cols, generator=g)[..., :cols].requires_grad_()
        k, v = (t[:, :, :cols].detach().requires_grad_() for t in (k, v))
    sim = [t.detach().to(SIM).requires_grad_(t.requires_grad) for t in (q, k, v, mask)]
    with perf.count_ops(SIM) as o:
        out = F.scaled_dot_product_attention(*sim)
        out.sum().backward()
    ref = F.scaled_dot_product_attention(q, k, v, mask)
    ref.sum().backward()
    assert o.by_op["_scaled_dot_product_efficient_attention"] == 1
    assert ("constant_pad_nd" in o.by_op) == (layout == "unaligned")
    _close(out, ref)
    for a, b in zip(sim, (q, k, v, mask), strict=True):
        if b.requires_grad:
            _close(a.grad, b.grad)


@pytest.mark.parametrize(
    ("dtype", "qk", "vd"), [(torch.float32, 16, 32), (torch.bfloat16, 192, 128)]
)
def test_sdpa_with_a_value_head_dim_of_its_own_runs_memory_efficient_attention(
    dtype: torch.dtype, qk: int, vd: int
) -> None:
    """Query and key heads of one size, value heads of another (multi-head latent attention:
    DeepSeek's 192 and 128): CUDA takes memory-efficient attention (flash needs one head dim).
    `sim` took it too, then failed in the CPU's flash kernel ("Q/K/V should have the same
    head size"); it now computes it with the CPU's math backend, forward and backward."""
    g = torch.Generator().manual_seed(0)
    shapes = ((2, 4, 8, qk), (2, 4, 8, qk), (2, 4, 8, vd))
    q, k, v = (torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes)
    sim = [t.detach().to(SIM).requires_grad_() for t in (q, k, v)]
    with perf.count_ops(SIM) as o:
        out = F.scaled_dot_product_attention(*sim, is_causal=True)
        out.sum().backward()
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.sum().backward()
    eff = "_scaled_dot_product_efficient_attention"
    assert o.by_op[eff] == 1 and o.by_op[f"{eff}_backward"] == 1
    assert out.shape == (2, 4, 8, vd)
    _close(out, ref)
    for a, b in zip(sim, (q, k, v), strict=True):
        _close(a.grad, b.grad)


def _dropout_run(dtype: torch.dtype, qkv0: torch.Tensor, p: float, device: Any = SIM) -> Any:
    """Attention with dropout over query, key and value ``qkv0[0..2]``: (output, their
    gradients, the next random numbers)."""
    qkv = [t.detach().to(device, dtype).requires_grad_() for t in qkv0]
    torch.manual_seed(7)
    out = F.scaled_dot_product_attention(*qkv, dropout_p=p, is_causal=True)
    weights = torch.arange(out.numel(), device=device).view(out.shape).cos()
    (out.float() * weights).sum().backward()
    grads = torch.stack([t.grad.float().cpu() for t in qkv])
    return out.float().cpu(), grads, torch.rand(3)


def test_sdpa_dropout_on_the_fused_kernels_equals_the_cpus_and_its_backward_is_its_derivative() -> (
    None
):
    """CUDA's flash and memory-efficient kernels take dropout (the CPU's flash kernel does
    not): ``sim`` runs the CPU's math backend on the host, drawing the mask from the CPU's
    generator as a CPU run does, and draws it again in the backward. Checked: dropout drops;
    values, gradients and the random stream after the step equal a CPU run's (fp32,
    memory-efficient); the backward is the forward's derivative (central differences);
    flash (bf16) draws the same mask."""
    torch.manual_seed(0)
    qkv0 = torch.randn(3, 1, 2, 8, 16)
    out, grads, after = _dropout_run(torch.float32, qkv0, 0.5)
    assert not torch.allclose(out, _dropout_run(torch.float32, qkv0, 0.0)[0])
    cpu_out, cpu_grads, cpu_after = _dropout_run(torch.float32, qkv0, 0.5, device="cpu")
    assert torch.equal(out, cpu_out) and torch.equal(grads, cpu_grads)
    assert torch.equal(after, cpu_after)

    def loss(q: torch.Tensor) -> float:
        torch.manual_seed(7)
        k, v = qkv0[1].to(SIM), qkv0[2].to(SIM)
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)
        return float((o * torch.arange(o.numel(), device=SIM).view(o.shape).cos()).sum())

    d = torch.randn(qkv0[0].shape)
    eps = 1e-3
    qs = qkv0[0].to(SIM)
    numeric = (loss(qs + eps * d.to(SIM)) - loss(qs - eps * d.to(SIM))) / (2 * eps)
    assert abs(numeric - float((grads[0] * d).sum())) <= 1e-2 * max(1.0, abs(numeric))
    out16, grads16, _ = _dropout_run(torch.bfloat16, qkv0, 0.5)
    torch.testing.assert_close(out16, out, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(grads16, grads, rtol=1e-1, atol=1e-1)


# --------------------------------------------------------------------------------------------
# branches where torch already treats PrivateUse1 as CUDA


def test_optimizers_default_to_foreach_and_take_fused_as_on_cuda() -> None:
    from torch.optim.optimizer import _default_to_fused_or_foreach

    p = nn.Parameter(torch.randn(4, device=SIM))
    assert _default_to_fused_or_foreach([p], differentiable=False, use_fused=False) == (
        False,
        True,
    )
    torch.manual_seed(0)
    w = torch.randn(8)
    pc, ps = nn.Parameter(w.clone()), nn.Parameter(w.to(SIM))
    oc = torch.optim.AdamW([pc], lr=0.1, fused=True)
    os_ = torch.optim.AdamW([ps], lr=0.1, fused=True)
    for o, p_ in ((oc, pc), (os_, ps)):
        p_.grad = torch.ones_like(p_)
        o.step()
    _close(ps, pc)


def test_pin_memory_and_non_blocking_copies_take_cudas_path() -> None:
    x = torch.randn(4).pin_memory()
    assert x.is_pinned()
    loader = torch.utils.data.DataLoader(torch.arange(8.0), batch_size=4, pin_memory=True)
    assert all(b.is_pinned() for b in loader)
    _close(x.to(SIM, non_blocking=True), x)


def test_every_branch_is_documented() -> None:
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "sim.md")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    for branch in paths.BRANCHES:
        assert branch in text, branch


# --------------------------------------------------------------------------------------------
# compiled graphs run with the strides Inductor planned


def test_compiled_backward_views_a_conv_gradient_as_inductor_planned() -> None:
    """Inductor plans a contiguous convolution_backward gradient on ``sim`` (its meta kernel)
    and turns the backward of ``x.view(...)`` into a ``view``; the CPU kernel returns
    channels-last (the weight is), so the view failed. The first call copies that output to
    the planned strides and the graph keeps the copy."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 3, padding=1).to(memory_format=torch.channels_last)
    conv_sim = nn.Conv2d(8, 8, 3, padding=1).to(SIM).to(memory_format=torch.channels_last)
    conv_sim.load_state_dict(conv.state_dict())
    x = torch.randn(2, 288)

    def loss(m: nn.Module, t: torch.Tensor) -> torch.Tensor:
        return (m(t.view(2, 8, 6, 6)) ** 2).sum()

    torch._dynamo.reset()
    step = torch.compile(loss)
    grads = []
    for _ in range(2):  # the checked first call, then the rewritten graph
        xs = x.to(SIM).requires_grad_()
        step(conv_sim, xs).backward()
        grads.append(xs.grad.cpu())
    xc = x.clone().requires_grad_()
    loss(conv, xc).backward()
    for g in grads:
        torch.testing.assert_close(g, xc.grad, rtol=1e-4, atol=1e-4)


def test_as_planned_copies_only_where_strides_differ() -> None:
    from perf.sim.compile import as_planned

    x = torch.randn(2, 3, 4, 4, device=SIM)
    assert as_planned(x, x.stride()) is x
    cl = x.contiguous(memory_format=torch.channels_last)
    out = as_planned(cl, x.stride())
    assert out.stride() == x.stride()
    _close(out, x)
    one = torch.randn(1, 5, device=SIM)
    assert as_planned(one, (1, 1)) is one  # a dimension of size 1 has no meaningful stride


# --------------------------------------------------------------------------------------------
# x[i] = 5: CUDA's host scalar


def test_setitem_of_a_python_number_copies_a_host_scalar_as_on_cuda() -> None:
    """A 0-dim destination gets a blocking copy of a CPU scalar (a sync, a transfer of one
    element), a larger one a fill; advanced indexing gets a host value (docs/sim.md)."""
    import perf

    y, m = torch.zeros(4, device=SIM), torch.zeros(3, 3, dtype=torch.int64, device=SIM)
    yc, mc = torch.zeros(4), torch.zeros(3, 3, dtype=torch.int64)
    idx = torch.tensor([0, 2], device=SIM)
    cases = [  # (index, value, tensor, host twin, syncs by op, h2d bytes)
        (1, 5, y, yc, {"h2d_copy": 1}, 4),
        (1, True, y, yc, {"h2d_copy": 1}, 4),
        ((1, 2), 7, m, mc, {"h2d_copy": 1}, 8),
        (0, 3, m, mc, {}, 0),
        (slice(2, 4), 2.5, y, yc, {}, 0),
        (idx, 9.0, y, yc, {"index_put": 1}, 0),
        (y > 8, 0.0, y, yc, {}, 0),
    ]
    for index, value, t, host, syncs, nbytes in cases:
        with perf.count_syncs(SIM) as s, perf.count_transfers() as tr, perf.count_ops(SIM) as o:
            t[index] = value
        host_index = index.cpu() if isinstance(index, torch.Tensor) else index
        host[host_index] = value
        assert s.by_op == syncs, (index, value, s.by_op)
        assert tr.h2d_bytes == nbytes, (index, value, tr)
        assert "scalar_tensor" not in o.by_op, o.by_op  # made below the dispatcher, as CUDA's
        assert torch.equal(t.cpu(), host), (index, value)
    z = torch.zeros((), device=SIM)
    with perf.count_syncs(SIM) as s:
        z[...] = 3
    assert s.by_op == {"h2d_copy": 1} and z.item() == 3
    # A device value is a device-to-device copy, as on CUDA.
    with perf.count_syncs(SIM) as s:
        y[0] = z
    assert s.count == 0 and y[0].item() == 3


def test_setitem_of_a_python_number_compiles_as_before() -> None:
    import perf

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y[0] = 5
        y[1:3] = 1.5
        return y.sum()

    g = torch.compile(f)
    x = torch.ones(8, device=SIM)
    with perf.count_compiles() as c:
        assert g(x).item() == f(x.cpu()).item() == 18.0
    assert (c.graphs, c.graph_breaks) == (1, 0)


# --------------------------------------------------------------------------------------------
# Python code that tests the device type: F.linear_cross_entropy, deterministic pad/max_pool3d

_LCE = "torch.nn.modules.linear_cross_entropy"


def _lce_module() -> Any:
    return pytest.importorskip(_LCE, reason="this torch has no F.linear_cross_entropy")


def test_every_python_branch_is_found_in_this_torch() -> None:
    """A torch whose source no longer has a branch's test (or moved it) keeps its own code on
    ``sim``: this names it, so the branch is looked at again."""
    assert paths.follow_python_branches() == []
    for module_name, qualname, _, _ in paths.PYTHON_BRANCHES:
        owner: Any = pytest.importorskip(module_name)
        for part in qualname.split("."):
            owner = getattr(owner, part)
        assert getattr(owner, "_perf_sim", False), qualname


def _cuda_context(build: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The context torch's own code builds for a CUDA input of the same shapes and dtypes
    (fake CUDA tensors: no CUDA needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():

        def fake(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            return torch.empty(x.shape, dtype=x.dtype, device="cuda")

        return build(*[fake(a) for a in args], **{k: fake(v) for k, v in kwargs.items()})


def _flags(ctx: Any) -> dict[str, Any]:
    import dataclasses

    return {
        f.name: getattr(ctx, f.name)
        for f in dataclasses.fields(ctx)
        if not isinstance(getattr(ctx, f.name), torch.Tensor) and f.name != "loss_grad_output"
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_linear_cross_entropy_chunked_path_builds_cudas_context(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_ChunkContext.build`` picks buffers and casts by ``device.type == "cuda"``: on
    ``sim`` every flag equals the one torch's code gives a CUDA input, over the policies,
    the gradients asked for, a bias and the reductions (the forward, and the backward of
    ``reduction="none"``, which builds again)."""
    module = _lce_module()
    plain = module._ChunkContext.build
    built: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        ctx = plain(*args, **kwargs)
        built.append((ctx, args, kwargs))
        return ctx

    monkeypatch.setattr(module._ChunkContext, "build", spy)
    torch.manual_seed(0)
    n, d, v = 12, 8, 40
    acc = [None] if dtype == torch.float32 else [None, torch.float32]
    cases = 0
    for policy in ("auto", "accurate", "balanced", "compact"):
        for acc_dtype in acc:
            for reduction in ("mean", "sum", "none"):
                for bias in (False, True):
                    x = torch.randn(n, d, dtype=dtype, device=SIM, requires_grad=True)
                    w = torch.randn(v, d, dtype=dtype, device=SIM, requires_grad=True)
                    b = torch.randn(v, dtype=dtype, device=SIM, requires_grad=True)
                    t = torch.randint(0, v, (n,), device=SIM)
                    opts = torch.nn.LinearCrossEntropyOptions(
                        acc_policy=policy, acc_dtype=acc_dtype, batch_chunk_size=5
                    )
                    built.clear()
                    loss = F.linear_cross_entropy(
                        x, w, t, linear_bias=b if bias else None, reduction=reduction, options=opts
                    )
                    loss.sum().backward()
                    assert built, (policy, reduction)
                    for ctx, args, kwargs in built:
                        assert ctx.is_cuda
                        assert _flags(ctx) == _flags(_cuda_context(plain, args, kwargs))
                        cases += 1
    assert cases == 4 * len(acc) * 2 * (1 + 1 + 2)  # reduction='none' builds again backward


def test_linear_cross_entropy_auto_options_resolve_as_on_an_sm90_gpu() -> None:
    """``"auto"``: CUDA's policy and chunking rows, and float32 accumulation for bfloat16 and
    float16 (``_resolve_auto_acc_dtype`` on sm80+ / sm70+), where other devices accumulate in
    the input's dtype."""
    _lce_module()
    from torch.nn.modules.linear_cross_entropy_options import _AUTO_DEFAULTS

    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        opts = torch.nn.LinearCrossEntropyOptions()._adjust(64, 32, 512, dtype, SIM)
        cuda = _AUTO_DEFAULTS.get(("cuda", dtype))
        if cuda is not None:
            assert (opts.acc_policy, opts.chunking_method) == cuda
        assert opts.acc_dtype == torch.float32
    meta = torch.device("meta")
    other = torch.nn.LinearCrossEntropyOptions()._adjust(64, 32, 512, torch.bfloat16, meta)
    assert other.acc_dtype == torch.bfloat16  # what sim got before: the input's dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_linear_cross_entropy_chunked_on_sim_matches_the_reference(
    dtype: torch.dtype, reduction: str
) -> None:
    """CUDA's branch runs on ``sim`` (its ``mm(..., out_dtype=float32, out=...)`` included) and
    gives the loss and gradients of ``cross_entropy(linear(...))`` in float32, to the input
    dtype's precision."""
    _lce_module()
    torch.manual_seed(0)
    n, d, v = 24, 16, 96
    x0, w0, b0 = torch.randn(n, d), torch.randn(v, d) / 4, torch.randn(v)
    t = torch.randint(0, v, (n,))
    x, w, b = (a.to(dtype).to(SIM).requires_grad_() for a in (x0, w0, b0))
    loss = F.linear_cross_entropy(
        x, w, t.to(SIM), linear_bias=b, reduction=reduction,
        options=torch.nn.LinearCrossEntropyOptions(batch_chunk_size=7),
    )  # fmt: skip
    grad_out = torch.rand(loss.shape)
    loss.backward(grad_out.to(loss.dtype).to(SIM))
    xr, wr, br = (a.to(dtype).float().requires_grad_() for a in (x0, w0, b0))
    ref = F.cross_entropy(F.linear(xr, wr, br), t, reduction=reduction)
    ref.backward(grad_out.to(loss.dtype).float())
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(loss.cpu().float(), ref.detach(), **tol)
    for got, want in ((x.grad, xr.grad), (w.grad, wr.grad), (b.grad, br.grad)):
        torch.testing.assert_close(got.cpu().float(), want, **tol)


@pytest.mark.parametrize("op", ["mm", "addmm", "bmm", "baddbmm"])
def test_matmuls_with_out_dtype_and_out_run_as_on_cuda(op: str) -> None:
    """``torch.mm(a, b, out_dtype=torch.float32, out=buf)``: float32 accumulation of the
    bfloat16 inputs into ``buf`` (resized where its shape differs), and CUDA's error for an
    ``out`` of another dtype. The CPU has no kernel for these."""
    torch.manual_seed(0)
    batched = op in ("bmm", "baddbmm")
    shape_a, shape_b = ((3, 4, 5), (3, 5, 6)) if batched else ((4, 5), (5, 6))
    a, b = torch.randn(shape_a), torch.randn(shape_b)
    c = torch.randn(shape_a[:-1] + shape_b[-1:])
    args = (a, b) if op in ("mm", "bmm") else (c, a, b)
    fn = getattr(torch, op)
    want = fn(*[x.bfloat16().float() if x is not c else x for x in args])
    sim_args = [x.bfloat16().to(SIM) if x is not c else x.to(SIM) for x in args]
    out = torch.empty(0, device=SIM)
    got = fn(*sim_args, out_dtype=torch.float32, out=out)
    assert got is out and out.shape == want.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="out_dtype must be the same"):
        fn(*sim_args, out_dtype=torch.float32, out=torch.empty(0, device=SIM, dtype=torch.bfloat16))


@pytest.fixture
def deterministic() -> Any:
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _ops_and_grad(fn: Any, x: torch.Tensor) -> tuple[dict[str, int], torch.Tensor, torch.Tensor]:
    xs = x.to(SIM).requires_grad_()
    with perf.count_ops() as ops:
        y = fn(xs)
        (y * torch.arange(y.numel(), device=SIM).view_as(y)).sum().backward()
    return dict(ops.by_op), y, xs.grad


@pytest.mark.usefixtures("deterministic")
def test_deterministic_replicate_pad_takes_the_decomposition_as_on_cuda() -> None:
    """``F.pad(mode="replicate")`` under deterministic algorithms: CUDA inputs take
    ``torch._decomp``'s replication pad (its backward is ``index_put``), the CPU the native
    op. On ``sim``: the decomposition, with the CPU's values and gradients."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 5)
    pad = (1, 2, 2, 1)
    ops, y, grad = _ops_and_grad(lambda t: F.pad(t, pad, mode="replicate"), x)
    assert "replication_pad2d" not in ops and ops.get("_unsafe_index_put") == 2, ops
    xc = x.clone().requires_grad_()
    yc = F.pad(xc, pad, mode="replicate")
    (yc * torch.arange(yc.numel()).view_as(yc)).sum().backward()
    _close(y, yc)
    _close(grad, xc.grad)
    torch.use_deterministic_algorithms(False)
    ops, _, _ = _ops_and_grad(lambda t: F.pad(t, pad, mode="replicate"), x)
    assert ops.get("replication_pad2d") == 1, ops  # not deterministic: the native op


@pytest.mark.usefixtures("deterministic")
def test_deterministic_max_pool3d_with_indices_takes_the_decomposition_as_on_cuda() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 6, 6)

    def pool(t: torch.Tensor) -> torch.Tensor:
        return F.max_pool3d(t, 2, return_indices=True)[0]

    ops, y, grad = _ops_and_grad(pool, x)
    assert "max_pool3d_with_indices" not in ops and ops.get("index_put") == 1, ops
    xc = x.clone().requires_grad_()
    yc = pool(xc)
    (yc * torch.arange(yc.numel()).view_as(yc)).sum().backward()
    _close(y, yc)
    _close(grad, xc.grad)


def test_flex_attention_trains_on_sim_as_on_cuda() -> None:
    """``flex_attention`` refuses devices other than CUDA, CPU, XPU, HPU and MPS
    (``_validate_device``) and trains only on CUDA among them (the CPU: "does not support
    backward"). On ``sim``: CUDA's branch, forward and backward, with the values and gradients
    of the same attention by SDPA on the CPU."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention", reason="no FlexAttention")
    torch.manual_seed(0)
    b, h, s, d = 2, 2, 32, 8
    q0, k0, v0 = (torch.randn(b, h, s, d) for _ in range(3))

    def causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return q >= kv

    mask = fa.create_block_mask(causal, b, h, s, s, device=SIM)
    q, k, v = (t.to(SIM).requires_grad_() for t in (q0, k0, v0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "called without torch.compile()", once a process
        out = fa.flex_attention(q, k, v, block_mask=mask)
    out.backward(torch.arange(out.numel(), device=SIM).view_as(out) / out.numel())
    qr, kr, vr = (t.clone().requires_grad_() for t in (q0, k0, v0))
    ref = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
    ref.backward(torch.arange(ref.numel()).view_as(ref) / ref.numel())
    _close(out, ref)
    for got, want in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        _close(got, want)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        fa.flex_attention(q0.requires_grad_(), k0, v0)  # the CPU's branch, for contrast


# --------------------------------------------------------------------------------------------
# the gradient of a full max / min / median: CUDA's mask, no read


@pytest.mark.parametrize("name", paths.EVENLY_DISTRIBUTED)
def test_full_reduction_gradients_take_cudas_mask_without_a_read(name: str) -> None:
    """``evenly_distribute_backward`` reads ``value.isnan().item()`` off CUDA only: on CUDA
    (``input.is_cuda()``) the gradient is the tied elements' mask, ops without a read. ``sim``
    runs CUDA's ops (the CPU's own under a dispatch mode, which takes that branch too) with
    the CPU's values, ties and NaNs included."""
    fn = getattr(torch, name)
    for data in (
        torch.tensor([[1.0, 5.0, 5.0], [2.0, -1.0, 5.0]]),
        torch.tensor([1.0, float("nan"), 3.0, float("nan")]),
    ):
        x = data.clone().requires_grad_()
        (fn(x) * 3.0).backward()
        xs = data.to(SIM).requires_grad_()
        with perf.count_syncs(SIM) as s, perf.count_ops(SIM) as on_sim:
            y = fn(xs) * 3.0
            y.backward()
        assert s.count == 0, s.by_op
        torch.testing.assert_close(xs.grad.cpu(), x.grad, equal_nan=True)
        assert float(y.detach().cpu()) == float(fn(data) * 3.0) or data.isnan().any()
        xc = data.clone().requires_grad_()
        with perf.count_ops("cpu") as on_cpu:  # a mode: the CPU takes CUDA's branch too
            (fn(xc) * 3.0).backward()
        assert on_sim.by_op == on_cpu.by_op
    with torch.no_grad():
        assert not fn(torch.ones(3, device=SIM, requires_grad=True)).requires_grad
    # torch.func's transforms run torch's own kernel (its mask branch under a transform)
    data = torch.tensor([[1.0, 5.0, 5.0], [2.0, -1.0, 5.0]])
    per_row = torch.func.vmap(torch.func.grad(lambda t: fn(t) * 2.0))
    torch.testing.assert_close(per_row(data.to(SIM)).cpu(), per_row(data))


def test_a_compiled_full_max_trains_as_eagerly() -> None:
    data = torch.tensor([[1.0, 5.0, 5.0], [2.0, -1.0, 5.0]])
    x, xs = data.clone().requires_grad_(), data.to(SIM).requires_grad_()
    (x.max() * x).sum().backward()
    torch.compile(lambda t: (t.max() * t).sum())(xs).backward()
    torch.testing.assert_close(xs.grad.cpu(), x.grad)
