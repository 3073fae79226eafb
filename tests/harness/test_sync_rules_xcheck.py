"""``benchmarks/sync_rules_xcheck.py``'s comparison on OpInfo-like ops written here: one op
both sides count alike, one whose copies only ``sim``'s device sees (``ctc_loss``, whose
``PrivateUse1`` path runs a composite CUDA replaces with its own kernel), one that raises."""

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


def _xcheck() -> Any:
    spec = importlib.util.spec_from_file_location(
        "sync_rules_xcheck", ROOT / "benchmarks" / "sync_rules_xcheck.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sync_rules_xcheck", mod)
    spec.loader.exec_module(mod)
    return mod


class _Op:
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
    xcheck = _xcheck()
    ops = [
        _Op("nonzero", torch.nonzero, lambda d: torch.tensor([0.0, 1.0, 2.0], device=d)),
        _Op(
            "ctc_loss",
            lambda t: F.ctc_loss(t[0], t[1], t[2], torch.full((2,), 4, device=t[0].device)),
            _ctc,
        ),
        _Op("raises", lambda t: t.view(7), lambda d: torch.zeros(3, device=d)),
        _Op("skipped", torch.nonzero, lambda d: torch.zeros(3, device=d)),
    ]
    compared, diffs = xcheck.compare(ops, SIM, skip=["skipped"])
    assert compared == 2
    # ctc_loss on sim: the lengths to the host (2 copies) and a result back (1)
    assert [(d[0], d[2], d[3]) for d in diffs] == [("ctc_loss", {"d2h_copy": 2, "h2d_copy": 1}, {})]
