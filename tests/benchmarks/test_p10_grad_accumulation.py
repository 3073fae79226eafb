"""P10: gradient accumulation over k micro-batches equals one k-times batch (same gradients,
loss scaled by 1/k) at about 1/k of the activation memory."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import perf
from perf.workloads.data import synthetic_classification
from perf.workloads.loops import accumulate_gradients, grads
from perf.workloads.models import mlp

BATCH = 64


@pytest.mark.parametrize("k", [2, 4, 8])
def test_grad_accumulation_same_gradients_as_full_batch(
    device: torch.device, k: int, perf_metrics
) -> None:
    """float64: k micro-batches of 64/k accumulate to the full-batch gradient within 1e-12."""
    x, y = synthetic_classification(BATCH, 32, 5, device=device, dtype=torch.float64)
    full = mlp(32, 64, 2, 5, seed=0).to(device, torch.float64)
    accum = mlp(32, 64, 2, 5, seed=0).to(device, torch.float64)
    F.cross_entropy(full(x), y).backward()
    accumulate_gradients(accum, x, y, k)
    err = max(float((a - b).abs().max()) for a, b in zip(grads(full), grads(accum), strict=True))
    perf_metrics.record("grad_max_abs_err", err, "1")
    assert err <= 1e-12, err


@pytest.mark.parametrize("k", [2, 4, 8])
def test_grad_accumulation_activation_bytes_one_over_k(
    device: torch.device, k: int, perf_metrics
) -> None:
    """The largest graph alive at once (one micro-batch) saves 1/k of the full batch's bytes
    (within 5%: an MLP with cross-entropy saves only per-sample tensors, plus a 4-byte scalar).

    Micro-batches are separate tensors, as a DataLoader yields them. (Views made by
    ``x.chunk(k)`` would save the whole batch's storage: the meter counts storages, and a view
    does keep its whole base alive.)"""
    x, y = synthetic_classification(BATCH, 32, 5, device=device)
    model = mlp(32, 64, 2, 5, seed=0).to(device)
    with perf.saved_activations(model) as a_full:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    micro: list[int] = []
    for xb, yb in zip(x.chunk(k), y.chunk(k), strict=True):
        xb, yb = xb.clone(), yb.clone()
        with perf.saved_activations(model) as a:
            loss = F.cross_entropy(model(xb), yb) / k
        loss.backward()  # frees this micro-batch's graph before the next one
        micro.append(a.bytes)
    frac = max(micro) / a_full.bytes
    perf_metrics.record("full_batch_activation_bytes", a_full.bytes, "bytes")
    perf_metrics.record("micro_batch_activation_bytes", max(micro), "bytes")
    perf_metrics.record("micro_over_full_bytes", frac, "1")
    assert frac == pytest.approx(1 / k, rel=0.05), (micro, a_full.bytes)
