"""P7: memory = model + batch x per-sample. Activation bytes saved for backward (and, on CUDA,
the allocator peak) grow linearly in the batch size; slope = bytes per sample."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perf
from perf.core.stats import linear_fit
from perf.workloads.models import mlp, small_cnn

BATCHES = (8, 16, 32, 64, 128)


def _saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    with perf.saved_activations(model) as a:
        loss = model(x).square().mean()
    del loss
    return int(a.bytes)


def _record_fit(perf_metrics, prefix: str, ys: list[int]) -> perf.core.stats.LinearFit:
    fit = linear_fit(BATCHES, ys)
    perf_metrics.record(f"{prefix}_bytes_per_sample", fit.slope, "bytes/sample")
    perf_metrics.record(f"{prefix}_intercept_bytes", fit.intercept, "bytes")
    perf_metrics.record(f"{prefix}_r2", fit.r2, "r2")
    return fit


def test_memory_linear_mlp_activation_bytes_in_batch_size(
    device: torch.device, perf_metrics
) -> None:
    """MLP 64-256-256-256-10 over 5 batch sizes: R² >= 0.99; an MLP saves only per-sample
    tensors, so the slope is the per-sample width sum x 4 bytes and the intercept is ~0."""
    model = mlp(64, 256, 3, 10).to(device)
    ys = [_saved_bytes(model, torch.randn(b, 64, device=device)) for b in BATCHES]
    fit = _record_fit(perf_metrics, "mlp", ys)
    assert fit.r2 >= 0.99, (fit, ys)
    # saved per sample, float32: the input (64), three ReLU outputs (256 each) and the model
    # output (10) that the loss's square() keeps
    assert fit.slope == pytest.approx((64 + 3 * 256 + 10) * 4, rel=1e-9)
    assert abs(fit.intercept) < 0.01 * ys[0]


def test_memory_linear_cnn_activation_bytes_in_batch_size(
    device: torch.device, perf_metrics
) -> None:
    """Small CNN (conv, batch-norm, pool) over 5 batch sizes: R² >= 0.99, positive slope; the
    intercept is what does not scale with the batch (batch-norm statistics per channel)."""
    model = small_cnn().to(device)
    ys = [_saved_bytes(model, torch.randn(b, 3, 32, 32, device=device)) for b in BATCHES]
    fit = _record_fit(perf_metrics, "cnn", ys)
    assert fit.r2 >= 0.99, (fit, ys)
    assert fit.slope > 0
    assert fit.intercept < 0.05 * ys[0]


def test_memory_linear_cuda_peak_in_batch_size(device: torch.device, perf_metrics) -> None:
    """The allocator peak of a training step above the model's own memory is linear in the
    batch size as well (R² >= 0.99), with a slope of at least the saved bytes per sample. On
    CUDA from the allocator; on the simulated device from its model (CPU CI, a narrower MLP)."""
    if device.type not in ("cuda", "sim"):
        pytest.skip("needs allocator statistics: CUDA or perf's simulated device (sim)")
    size = (1024, 2048) if device.type == "cuda" else (256, 512)
    model = mlp(size[0], size[1], 4, 10).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    peaks: list[int] = []
    batches = tuple(b * (64 if device.type == "cuda" else 16) for b in BATCHES)
    for b in batches:
        x = torch.randn(b, size[0], device=device)
        model(x).square().mean().backward()  # gradients exist before the measured step
        with perf.peak_memory(device) as m:
            opt.zero_grad(set_to_none=False)
            model(x).square().mean().backward()
            opt.step()
        assert m.peak_delta_bytes is not None
        peaks.append(m.peak_delta_bytes)
        del x
    fit = linear_fit(batches, peaks)
    perf_metrics.record("cuda_peak_bytes_per_sample", fit.slope, "bytes/sample")
    perf_metrics.record("cuda_peak_intercept_bytes", fit.intercept, "bytes")
    perf_metrics.record("cuda_peak_r2", fit.r2, "r2")
    saved = _saved_bytes(model, torch.randn(64, size[0], device=device)) / 64
    assert fit.r2 >= 0.99, (fit, peaks)
    assert fit.slope >= saved, (fit.slope, saved)
