"""P9: gradient checkpointing trades memory for compute: fewer activation bytes saved for
backward, more FLOPs (the forward of each checkpointed block runs again in backward)."""

from __future__ import annotations

import pytest
import torch

import perf
from perf.workloads.models import BlockMLP

BATCH = 64


def _step(model: BlockMLP, x: torch.Tensor) -> tuple[int, int]:
    """(activation bytes saved in forward, FLOPs of forward + backward)."""
    model.zero_grad(set_to_none=True)
    with perf.count_flops() as f:
        with perf.saved_activations(model) as a:
            loss = model(x).square().mean()
        loss.backward()
    return a.bytes, f.total


def test_checkpointing_fewer_activation_bytes_more_flops(
    device: torch.device, perf_metrics
) -> None:
    """4 checkpointed feed-forward blocks keep only their inputs (width H instead of 9H per
    sample) and recompute their forward in backward: saved bytes at most half of plain, and
    FLOPs above plain by exactly one forward of the blocks.

    Reentrant checkpointing is measured here because it saves block inputs through
    ``save_for_backward``, where the saved-tensor meter sees them; the non-reentrant form holds
    them elsewhere (its memory saving is checked on CUDA by the allocator peak).
    """
    x = torch.randn(BATCH, 64, device=device)
    plain = BlockMLP(checkpoint=False).to(device)
    ckpt = BlockMLP(checkpoint=True, use_reentrant=True).to(device)
    plain_bytes, plain_flops = _step(plain, x)
    ckpt_bytes, ckpt_flops = _step(ckpt, x)
    perf_metrics.record("plain_activation_bytes", plain_bytes, "bytes")
    perf_metrics.record("checkpointed_activation_bytes", ckpt_bytes, "bytes")
    perf_metrics.record("plain_flops", plain_flops, "flops")
    perf_metrics.record("checkpointed_flops", ckpt_flops, "flops")
    perf_metrics.record("checkpointed_over_plain_bytes", ckpt_bytes / plain_bytes, "1")
    perf_metrics.record("checkpointed_over_plain_flops", ckpt_flops / plain_flops, "1")
    assert ckpt_bytes <= 0.5 * plain_bytes, (ckpt_bytes, plain_bytes)
    # the recompute is one more forward of the 4 blocks: two H x 4H matmuls, 2 FLOPs per MAC
    h = plain.head.in_features
    assert ckpt_flops - plain_flops == 4 * 2 * (2 * BATCH * h * 4 * h), (ckpt_flops, plain_flops)


def test_checkpointing_same_gradients(device: torch.device, perf_metrics) -> None:
    """Checkpointing changes memory and compute, not the maths (float64, atol 1e-12)."""
    x = torch.randn(BATCH, 64, device=device, dtype=torch.float64)
    plain = BlockMLP(checkpoint=False).to(device, torch.float64)
    ckpt = BlockMLP(checkpoint=True, use_reentrant=False).to(device, torch.float64)
    plain(x).square().mean().backward()
    ckpt(x).square().mean().backward()
    err = max(
        float((p.grad - q.grad).abs().max())  # type: ignore[operator]
        for p, q in zip(plain.parameters(), ckpt.parameters(), strict=True)
    )
    perf_metrics.record("grad_max_abs_err", err, "1")
    assert all(q.grad is not None for q in ckpt.parameters())
    assert err <= 1e-12


def test_checkpointing_lower_cuda_peak(device: torch.device, perf_metrics) -> None:
    """The allocator peak of a training step (non-reentrant, the recommended form) is lower
    with checkpointing: a deep, wide model at a batch where activations dominate. On CUDA from
    the allocator; on the simulated device from its model (CPU CI, a smaller batch)."""
    if device.type not in ("cuda", "sim"):
        pytest.skip("needs allocator statistics: CUDA or perf's simulated device (sim)")
    width = 1024 if device.type == "cuda" else 256
    x = torch.randn(4096 if device.type == "cuda" else 1024, width, device=device)
    peaks: dict[str, int] = {}
    for name, ck in (("plain", False), ("checkpointed", True)):
        model = BlockMLP(width, width, 8, 10, checkpoint=ck, use_reentrant=False).to(device)
        model(x).square().mean().backward()  # grads allocated before measuring
        with perf.peak_memory(device) as m:
            model(x).square().mean().backward()
        assert m.peak_delta_bytes is not None
        peaks[name] = m.peak_delta_bytes
        perf_metrics.record(f"{name}_peak_delta_bytes", m.peak_delta_bytes, "bytes")
        perf_metrics.record(f"{name}_reserved_peak_bytes", m.reserved_peak_bytes, "bytes")
        del model
        torch.get_device_module(device.type).empty_cache()
    assert peaks["checkpointed"] < 0.75 * peaks["plain"], peaks
