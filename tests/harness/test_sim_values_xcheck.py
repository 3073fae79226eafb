"""``benchmarks/sim_values_xcheck.py``'s comparison on OpInfo-like ops written here: one that
computes alike on the CPU and on ``sim``, one whose value depends on the device, one that fails
on ``sim`` only, one that fails everywhere, and a random one, skipped by name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from _sim import SIM, needs_sim

ROOT = Path(__file__).resolve().parents[2]

pytestmark = needs_sim


def _xcheck() -> Any:
    spec = importlib.util.spec_from_file_location(
        "sim_values_xcheck", ROOT / "benchmarks" / "sim_values_xcheck.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sim_values_xcheck", mod)
    spec.loader.exec_module(mod)
    return mod


class _Op:
    supports_autograd = True

    def __init__(self, name: str, fn: Any) -> None:
        self.name, self.variant_test_name, self._fn = name, "", fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def supported_dtypes(self, device: str) -> set[torch.dtype]:
        return {torch.float32, torch.complex64}

    supported_backward_dtypes = supported_dtypes

    def sample_inputs(
        self, device: str, dtype: torch.dtype, requires_grad: bool = False
    ) -> list[SimpleNamespace]:
        x = torch.arange(6.0, device=device).to(dtype).view(2, 3).requires_grad_(requires_grad)
        return [SimpleNamespace(input=x, args=(), kwargs={})]


def test_compare_reports_values_that_differ_and_failures_on_sim_only() -> None:
    xcheck = _xcheck()
    ops = [
        _Op("agrees", lambda t: (t.mH @ t, t.sum(0))),
        _Op("by_device", lambda t: t + (1 if t.device.type == "cpu" else 2)),
        _Op("host_only", lambda t: torch.from_numpy(t.numpy())),
        _Op("fails", lambda t: t.view(7)),
        _Op("randn_like", torch.randn_like),
    ]
    compared, found = xcheck.compare(ops, SIM, [torch.float32, torch.complex64])
    assert compared == 4  # agrees and by_device, in 2 dtypes
    assert [(f[0], f[1], f[2].split(":")[0]) for f in found] == [
        ("by_device", "torch.float32", "values differ"),
        ("by_device", "torch.complex64", "values differ"),
        ("host_only", "torch.float32", "fails on sim"),
        ("host_only", "torch.complex64", "fails on sim"),
    ]


def test_compare_grads_reports_gradients_that_differ() -> None:
    xcheck = _xcheck()
    ops = [
        _Op("agrees", lambda t: (t.mH @ t).sum(0)),
        _Op("by_device", lambda t: t * (1 if t.device.type == "cpu" else 2)),
        _Op("no_gradient", lambda t: t.detach() + 1),
        _Op("host_only", lambda t: t * torch.from_numpy(t.detach().numpy())),
    ]
    compared, found = xcheck.compare_grads(ops, SIM, [torch.float32, torch.complex64])
    assert compared == 4  # agrees and by_device, in 2 dtypes
    assert [(f[0], f[2].split(":")[0]) for f in found] == [
        ("by_device", "gradients"),
        ("by_device", "gradients"),
        ("host_only", "fails on sim"),
        ("host_only", "fails on sim"),
    ]
