"""P13: ``module(x)`` goes through ``nn.Module.__call__`` and runs hooks; ``module.forward(x)``
bypasses them — the same maths, silently without the hooks (profilers, DDP, quantisation ...)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from suite_support import require
from torch import nn

import perf
from perf.workloads.models import mlp


class _HookCounter:
    def __init__(self, model: nn.Module) -> None:
        self.pre = 0
        self.post = 0
        self.handles = [
            model.register_forward_pre_hook(self._pre),
            model.register_forward_hook(self._post),
        ]

    def _pre(self, module: nn.Module, args: Any) -> None:
        self.pre += 1

    def _post(self, module: nn.Module, args: Any, out: Any) -> None:
        self.post += 1

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def test_call_vs_forward_hooks_run_only_via_call(device: torch.device, perf_metrics) -> None:
    """Ten calls each way: __call__ fires pre- and post-hooks ten times, .forward never."""
    model = mlp(8, 16, 2, 3).to(device)
    x = torch.randn(4, 8, device=device)
    hooks = _HookCounter(model)
    for _ in range(10):
        model(x)
    via_call = (hooks.pre, hooks.post)
    for _ in range(10):
        model.forward(x)
    via_forward = (hooks.pre - via_call[0], hooks.post - via_call[1])
    hooks.remove()
    perf_metrics.record("hook_calls_via_call", sum(via_call), "calls")
    perf_metrics.record("hook_calls_via_forward", sum(via_forward), "calls")
    assert via_call == (10, 10)
    assert via_forward == (0, 0)


def test_call_vs_forward_same_output_and_ops(device: torch.device, perf_metrics) -> None:
    """Bypassing __call__ changes no maths: identical output and identical aten op count."""
    model = mlp(8, 16, 2, 3).to(device)
    x = torch.randn(4, 8, device=device)
    with perf.count_ops() as o_call:
        out_call = model(x)
    with perf.count_ops() as o_fwd:
        out_fwd = model.forward(x)
    perf_metrics.record("ops_via_call", o_call.count, "ops")
    perf_metrics.record("ops_via_forward", o_fwd.count, "ops")
    assert o_call.count == o_fwd.count > 0
    torch.testing.assert_close(out_call, out_fwd, rtol=0, atol=0)


def test_call_vs_forward_submodule_hooks_still_run_inside_forward(
    device: torch.device, perf_metrics
) -> None:
    """``.forward`` bypasses only the outer module's hooks: children are still called."""
    model = mlp(8, 16, 2, 3).to(device)
    x = torch.randn(4, 8, device=device)
    child_calls = 0

    def hook(module: nn.Module, args: Any, out: Any) -> None:
        nonlocal child_calls
        child_calls += 1

    handles = [m.register_forward_hook(hook) for m in model.children()]
    model.forward(x)
    for h in handles:
        h.remove()
    perf_metrics.record("child_hook_calls_via_forward", child_calls, "calls")
    assert child_calls == len(list(model.children()))


@pytest.mark.perf_timing
def test_call_vs_forward_hook_overhead_per_call(device: torch.device, perf_metrics) -> None:
    """Per-call cost of __call__ with a forward hook versus .forward on a tiny model.

    On a launch-bound module the Python hook machinery is visible: __call__ with a hook must be
    slower than .forward with confidence; the per-call overhead in seconds is recorded.
    """
    model = nn.Linear(4, 4).to(device)
    x = torch.randn(2, 4, device=device)
    handle = model.register_forward_hook(lambda m, a, o: None)
    with torch.no_grad():
        cmp = perf.compare(
            lambda: model(x),
            lambda: model.forward(x),
            device=device,
            pairs=25,
            labels=("call_with_hook", "forward"),
        )
    handle.remove()
    overhead_s = cmp.a.median_s - cmp.b.median_s
    perf_metrics.record("call_over_forward_time", cmp, "ratio")
    perf_metrics.record("hook_overhead_per_call_s", max(overhead_s, 0.0), "s")
    require(cmp.decide_a_slower(1.0))
