"""Copies between host and ``sim`` counted as CUDA counts them at the edges (each rule with
the PyTorch source line it comes from in docs/sim.md), and the device-agnostic APIs."""

from __future__ import annotations

import pytest
import torch

import perf
from perf.sim.device import unavailable_reason

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None,
    reason=f"simulated device unavailable: {unavailable_reason()}",
)


def _counts(fn) -> tuple[int, int, int, int, int]:  # type: ignore[no-untyped-def]
    dev = perf.simulated_device()
    with perf.count_syncs(dev) as s, perf.count_transfers() as t:
        fn()
    return s.count, t.h2d_copies, t.h2d_bytes, t.d2h_copies, t.d2h_bytes


def test_zero_element_copies_cause_nothing() -> None:
    """Copy.cpp copy_impl: ``if (iter.numel() == 0) return self;`` before copy_stub."""
    dev = perf.simulated_device()
    e = torch.empty(0, 3, device=dev)
    assert _counts(lambda: torch.tensor([], device=dev)) == (0, 0, 0, 0, 0)
    assert _counts(lambda: torch.empty(0).to(dev)) == (0, 0, 0, 0, 0)
    assert _counts(lambda: e.cpu()) == (0, 0, 0, 0, 0)
    assert _counts(lambda: e.tolist()) == (0, 0, 0, 0, 0)
    assert _counts(lambda: e.copy_(torch.empty(0, 3))) == (0, 0, 0, 0, 0)
    assert _counts(lambda: torch.empty(0, 3).copy_(e)) == (0, 0, 0, 0, 0)


def test_copies_of_meta_tensors_move_nothing() -> None:
    """FSDP2 shards a model built on ``meta`` (torchtitan's trainer) by ``narrow(...).copy_``
    between meta tensors; ``count_transfers`` failed there ("Device 'meta' does not have a
    corresponding module registered"). Between meta tensors nothing moves: no copy, no sync.
    (A copy between the host and ``meta`` still counts: the suite's P4 uses ``meta`` as its
    stand-in accelerator.)"""
    dev = perf.simulated_device()

    def shard() -> None:
        full, part = torch.empty(4, 4, device="meta"), torch.empty(2, 4, device="meta")
        full.narrow(0, 0, 2).copy_(part)
        full.to("meta", copy=True)
        torch.empty_like(full, device=dev)

    assert _counts(shard) == (0, 0, 0, 0, 0)


def test_one_element_copies_count() -> None:
    dev = perf.simulated_device()
    assert _counts(lambda: torch.tensor([1.0], device=dev)) == (1, 1, 4, 0, 0)
    x = torch.ones(1, device=dev)
    assert _counts(lambda: x.cpu()) == (1, 0, 0, 1, 4)
    # .item(): _local_scalar_dense's memcpy_and_sync is a sync, not a copy_ (no transfer)
    assert _counts(lambda: x.item()) == (1, 0, 0, 0, 0)


def test_same_device_and_non_blocking() -> None:
    dev = perf.simulated_device()
    x = torch.ones(4, device=dev)
    assert _counts(lambda: x.to(dev)) == (0, 0, 0, 0, 0)  # to() returns self
    assert _counts(lambda: x.to(dev, copy=True)) == (0, 0, 0, 0, 0)  # device to device
    # non_blocking: cudaMemcpyAsync, not flagged by the sync debug mode, still a transfer
    assert _counts(lambda: x.to("cpu", non_blocking=True)) == (0, 0, 0, 1, 16)
    h = torch.ones(4).pin_memory()
    assert _counts(lambda: h.to(dev, non_blocking=True)) == (0, 1, 16, 0, 0)


def test_bytes_of_casting_and_broadcasting_copies() -> None:
    """cuda/Copy.cu copy_kernel_cuda: a cast or broadcast goes through a contiguous temporary
    of the destination's size, cast on the device for host-to-device and non-blocking copies
    and on the host for blocking device-to-host ones."""
    dev = perf.simulated_device()
    x = torch.ones(4, device=dev)
    assert _counts(lambda: torch.ones(4).to(dev, torch.half)) == (1, 1, 8, 0, 0)
    assert _counts(lambda: x.to("cpu", torch.half)) == (1, 0, 0, 1, 16)
    assert _counts(lambda: x.to("cpu", torch.half, non_blocking=True)) == (0, 0, 0, 1, 8)
    assert _counts(lambda: x.copy_(torch.tensor(2.0))) == (1, 1, 16, 0, 0)


def test_torch_accelerator_and_device_module() -> None:
    dev = perf.simulated_device()
    acc = torch.accelerator
    assert acc.is_available() and acc.current_accelerator() == torch.device("sim")
    assert acc.device_count() == 1 and acc.current_device_index() == 0
    acc.synchronize()  # raised "Backend doesn't support synchronizing all streams"
    acc.synchronize(dev)
    assert torch.float16 in acc.get_device_capability()["supported_dtypes"]
    assert acc.current_stream().device.type == dev.type
    mod = torch.get_device_module(dev)
    assert mod is torch.get_device_module("sim")
    assert mod.is_available() and mod.device_count() == 1
    with mod.device(0), mod.stream(mod.current_stream()):
        mod.synchronize()
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        mod.device(1)


def test_device_agnostic_training_loop_runs_unchanged() -> None:
    """A program written against torch.accelerator needs no change on sim."""
    perf.simulated_device()
    dev = torch.accelerator.current_accelerator()
    assert dev is not None
    ds = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,)))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True)
    model = torch.nn.Linear(4, 3).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(dev.type)
    with perf.count_syncs(dev) as s:
        for x, y in loader:
            assert x.is_pinned()
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        torch.accelerator.synchronize()
    # GradScaler.step reads found_inf once per step (grad_scaler.py: `.item()`)
    assert s.count == 4, s.by_op


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.fft.hfft(x),
        lambda x: torch.fft.hfft2(x.view(2, 4)),
        lambda x: torch.fft.hfftn(x.view(2, 4)),
        lambda x: x.conj() + 1,
        lambda x: x.conj().resolve_conj(),
        lambda x: torch._neg_view(x).clone(),
        lambda x: x.conj().to("cpu"),
        lambda x: torch.zeros_like(x).conj().copy_(x),
        # ops that take the lazy bits as they are (torch lets mm, dot, bmm pass the fallbacks):
        # sim's host views once dropped them, a silent wrong result
        lambda x: torch.mm(x.view(2, 4).conj(), x.view(4, 2)),
        lambda x: x.view(2, 4).mH @ x.view(2, 4),
        lambda x: torch.dot(x.conj(), x),
        lambda x: torch.bmm(x.view(1, 2, 4).conj(), x.view(1, 4, 2)),
        lambda x: torch.addmm(x.view(2, 4)[:, :2], torch._neg_view(x.view(2, 4)), x.view(4, 2)),
    ],
    ids=[
        "hfft",
        "hfft2",
        "hfftn",
        "conj_add",
        "resolve_conj",
        "neg_clone",
        "conj_cpu",
        "into_conj",
        "mm_conj",
        "mH_matmul",
        "dot_conj",
        "bmm_conj",
        "addmm_neg",
    ],
)
def test_conjugate_and_negative_views_copy_as_on_the_cpu(fn: object) -> None:
    """A copy of a lazily conjugated or negated tensor (``torch.fft.hfft`` conjugates its input)
    recursed between torch's math-bit fallback and sim's copy until the process crashed."""
    torch.manual_seed(0)
    x = torch.randn(8, dtype=torch.complex64)
    got = fn(x.to(perf.simulated_device())).cpu()  # type: ignore[operator]
    want = fn(x)  # type: ignore[operator]
    torch.testing.assert_close(got.resolve_conj().resolve_neg(), want.resolve_conj().resolve_neg())


def test_complex_gradients_match_the_cpu() -> None:
    """Autograd of complex matmuls multiplies by conjugate views (``grad @ b.mH``)."""
    torch.manual_seed(0)
    a = torch.randn(4, 3, dtype=torch.complex64)
    b = torch.randn(3, 2, dtype=torch.complex64)
    grads = []
    for dev in (torch.device("cpu"), perf.simulated_device()):
        ad, bd = (t.detach().to(dev).requires_grad_() for t in (a, b))
        (ad @ bd).abs().sum().backward()
        grads.append((ad.grad.cpu(), bd.grad.cpu()))
    torch.testing.assert_close(grads[0], grads[1])


def test_a_kernel_returning_a_conjugate_view_keeps_the_bit() -> None:
    """``linalg_lu_solve(..., left=False)`` returns a lazily conjugated view of its work; the
    sim tensor wrapping it had dropped the bit (a silent wrong result)."""
    torch.manual_seed(0)
    a = torch.randn(3, 3, dtype=torch.complex64)
    b = torch.randn(4, 3, dtype=torch.complex64)
    lu, piv = torch.linalg.lu_factor(a)
    want = torch.linalg.lu_solve(lu, piv, b, left=False)
    dev = perf.simulated_device()
    got = torch.linalg.lu_solve(lu.to(dev), piv.to(dev), b.to(dev), left=False)
    assert got.is_conj() == want.is_conj()
    torch.testing.assert_close(got.cpu().resolve_conj(), want.resolve_conj())


def test_a_number_beside_a_low_precision_tensor_keeps_its_precision() -> None:
    """``deg2rad`` of a ``bfloat16`` tensor multiplies by pi/180 as the CPU kernel reads a
    wrapped number (a double); sim once rounded it to ``bfloat16`` first."""
    torch.manual_seed(0)
    x = (torch.randn(20, 20) * 100).to(torch.bfloat16)
    dev = perf.simulated_device()
    for fn in (torch.deg2rad, torch.rad2deg, lambda t: t * 0.1, lambda t: 2.5 + t):
        assert torch.equal(fn(x.to(dev)).cpu(), fn(x))
    # the result's dtype is the tensor's, as with a wrapped number (not float64)
    assert (x.to(dev) * 0.1).dtype == torch.bfloat16
    assert (torch.arange(3, device=dev) * 2.5).dtype == torch.float32
    assert (torch.tensor(2.0, device=dev) * 3).dtype == torch.float32


def test_an_efficient_zero_tensor_is_zeros_on_sim() -> None:
    """Backward formulas return ``_efficientzerotensor`` (``sgn`` of a real tensor); wrapped
    from the CPU's, it had no data and crashed the process on first use."""
    dev = perf.simulated_device()
    z = torch._efficientzerotensor(3, device=dev)
    assert z.device == dev and torch.equal((z + 1).cpu(), torch.ones(3))
    y = torch.randn(3, device=dev, requires_grad=True)
    (g,) = torch.autograd.grad(torch.sgn(y), y, torch.ones(3, device=dev))
    assert torch.equal(g.cpu(), torch.zeros(3))
