"""P11: evaluation under ``torch.no_grad()`` saves no activations and runs faster than the same
forward with autograd recording."""

from __future__ import annotations

import pytest
import torch
from suite_support import require

import perf
from perf.workloads.loops import make_eval_step
from perf.workloads.models import mlp


def test_no_grad_saves_no_activations(device: torch.device, perf_metrics) -> None:
    """Same forward pass: with grad enabled autograd keeps the activations; under no_grad and
    inference_mode it keeps nothing and the output has no graph."""
    model = mlp(64, 256, 3, 10).to(device)
    x = torch.randn(64, 64, device=device)
    with perf.saved_activations(model) as with_grad:
        out_grad = make_eval_step(model, x, no_grad=False)()
    with perf.saved_activations(model) as no_grad:
        out_nograd = make_eval_step(model, x, no_grad=True)()
    with perf.saved_activations(model) as inference, torch.inference_mode():
        model(x)
    perf_metrics.record("grad_enabled_saved_bytes", with_grad.bytes, "bytes")
    perf_metrics.record("no_grad_saved_bytes", no_grad.bytes, "bytes")
    perf_metrics.record("inference_mode_saved_bytes", inference.bytes, "bytes")
    assert with_grad.bytes > 0 and out_grad.grad_fn is not None
    assert no_grad.bytes == 0 and no_grad.saved_refs == 0 and out_nograd.grad_fn is None
    assert inference.bytes == 0
    torch.testing.assert_close(out_grad.detach(), out_nograd, rtol=0, atol=0)


@pytest.mark.perf_timing
def test_no_grad_evaluation_faster(device: torch.device, perf_metrics) -> None:
    """Paired interleaved timing of an evaluation forward: grad-enabled / no_grad > 1 with 95%
    confidence. A narrow, deep MLP (16 layers of width 16) at batch 4, where autograd's per-op
    graph recording is a large share of the work; ~1.4x on an idle 2-core box."""
    model = mlp(16, 16, 16, 10).to(device)
    x = torch.randn(4, 16, device=device)
    cmp = perf.compare(
        make_eval_step(model, x, no_grad=False),
        make_eval_step(model, x, no_grad=True),
        device=device,
        pairs=41,
        warmup=20,
        min_sample_time_s=0.02,
        labels=("grad_enabled", "no_grad"),
    )
    perf_metrics.record("grad_over_no_grad_eval_time", cmp, "ratio", higher_is_better=True)
    require(cmp.decide_a_slower(1.0))
