"""The OpInfo cross-checks of ``benchmarks/`` on OpInfo-like ops written here.

``sync_rules_xcheck.compare``: one op both sides count alike, one whose copies only ``sim``'s
device sees (``ctc_loss``, whose ``PrivateUse1`` path runs a composite CUDA replaces with its
own kernel), one that raises, one skipped by name. ``sim_values_xcheck.compare`` and
``compare_grads``: one op that computes alike on the CPU and on ``sim``, one whose value
depends on the device, one that fails on ``sim`` only, one that fails everywhere, a random one
skipped by name.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from _sim import SIM, needs_sim

ROOT = Path(__file__).resolve().parents[2]

pytestmark = needs_sim


def _load(name: str) -> Any:
    """``benchmarks/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------------------------
# sync_rules_xcheck


class _SyncOp:
    def __init__(self, name: str, fn: Any, make: Any) -> None:
        self.name, self.variant_test_name, self._fn, self._make = name, "", fn, make

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def sample_inputs(self, device: torch.device, dtype: torch.dtype) -> list[SimpleNamespace]:
        return [SimpleNamespace(input=self._make(device), args=(), kwargs={})]


def _ctc(d: torch.device) -> Any:
    torch.manual_seed(0)
    lp = torch.randn(10, 2, 5).log_softmax(2).to(d)
    return (lp, torch.randint(1, 5, (2, 4)).to(d), torch.full((2,), 10).to(d))


def test_compare_reports_only_what_the_cuda_side_would_miss() -> None:
    xcheck = _load("sync_rules_xcheck")
    ops = [
        _SyncOp("nonzero", torch.nonzero, lambda d: torch.tensor([0.0, 1.0, 2.0], device=d)),
        _SyncOp(
            "ctc_loss",
            lambda t: F.ctc_loss(t[0], t[1], t[2], torch.full((2,), 4, device=t[0].device)),
            _ctc,
        ),
        _SyncOp("raises", lambda t: t.view(7), lambda d: torch.zeros(3, device=d)),
        _SyncOp("skipped", torch.nonzero, lambda d: torch.zeros(3, device=d)),
    ]
    compared, diffs = xcheck.compare(ops, SIM, skip=["skipped"])
    assert compared == 2
    # ctc_loss: the composite takes another path under a dispatch mode (docs/sim.md): on sim
    # the lengths to the host (2), the mean's lengths back (1) and the kernel's 3 copies; on
    # the CUDA side _ctc_loss.Tensor copies the lengths inside (5) and the mean copies nothing
    assert [(d[0], d[2], d[3]) for d in diffs] == [
        ("ctc_loss", {"ctc_loss": 3, "d2h_copy": 2, "h2d_copy": 1}, {"ctc_loss": 5})
    ]


# --------------------------------------------------------------------------------------------
# sim_values_xcheck


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
    xcheck = _load("sim_values_xcheck")
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
    xcheck = _load("sim_values_xcheck")
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


def test_check_instruments_reports_what_raises_only_under_them() -> None:
    xcheck = _load("sim_values_xcheck")

    def reads_the_flop_mode(t: torch.Tensor) -> torch.Tensor:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        if _get_current_dispatch_mode_stack():  # a stand-in for an instrument's own bug
            raise RuntimeError("broken under a dispatch mode")
        return t + 1

    ops = [
        _Op("agrees", lambda t: (t.mH @ t, t.to_sparse() * 2)),
        _Op("raises_under_modes", reads_the_flop_mode),
        _Op("fails", lambda t: t.view(7)),
    ]
    ran, found = xcheck.check_instruments(ops, SIM, [torch.float32])
    assert ran == 2
    assert [(f[0], f[2].split(":")[0]) for f in found] == [
        ("raises_under_modes", "raises under the instruments")
    ]


# --------------------------------------------------------------------------------------------
# mode_paths_xcheck


class _GradOp:
    supports_autograd = True

    def __init__(self, name: str, fn: Any, make: Any) -> None:
        self.name, self.variant_test_name, self._fn, self._make = name, "", fn, make

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def sample_inputs(
        self, device: torch.device, dtype: torch.dtype, requires_grad: bool = False
    ) -> list[SimpleNamespace]:
        torch.manual_seed(0)
        x = torch.randn(4, device=device, dtype=dtype, requires_grad=requires_grad)
        return [SimpleNamespace(input=x, args=self._make(device), kwargs={})]


def test_mode_paths_reports_the_ops_whose_kernels_change_under_a_dispatch_mode() -> None:
    """``binary_cross_entropy_with_logits``' backward works in place alone and out of place
    under a mode (``areAnyTensorSubclassLike``); ``abs`` runs the same kernels either way."""
    xcheck = _load("mode_paths_xcheck")
    ops = [
        _GradOp("abs", lambda x: x.abs(), lambda d: ()),
        _GradOp(
            "bce_with_logits",
            lambda x, t: F.binary_cross_entropy_with_logits(x, t),
            lambda d: (torch.rand(4, device=d),),
        ),
        _GradOp("raises", lambda x: x.view(7), lambda d: ()),
    ]
    compared, diffs = xcheck.compare(ops, SIM)
    assert compared == 2
    assert [(d[0], dict(d[2]), dict(d[3])) for d in diffs] == [
        (
            "bce_with_logits",
            {"aten.sub_.Tensor": 1, "aten.mul_.Tensor": 1},
            {"aten.sub.Tensor": 1, "aten.mul.Tensor": 1},
        )
    ]
    assert xcheck.compare(ops, SIM, names=["abs"])[0] == 1
