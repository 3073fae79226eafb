"""FLOPs of a block (``perf.count_flops``), by ``torch.utils.flop_counter``."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from perf.instruments.live import Live
from perf.instruments.modes import CountingDispatchMode, decomposed

aten = torch.ops.aten

# --------------------------------------------------------------------------------------------
# FLOPs


@dataclass(frozen=True)
class FlopCount:
    """FLOPs by ``torch.utils.flop_counter`` (matmuls, convolutions, attention; 2 per MAC)."""

    total: int
    by_op: dict[str, int]


class _FlopMode(CountingDispatchMode):
    """FlopCounterMode's own formulas (``flop_registry``) without its module tracker.

    FlopCounterMode also tracks the module hierarchy and tries to decompose every op without a
    formula; on a launch-bound loop that makes it 5x slower than the loop itself (measured:
    benchmarks/counter_overhead.py). Totals are identical on MLP, CNN (fp32 and autocast) and
    attention training steps (tests/harness/test_counters.py checks this).
    """

    def __init__(self) -> None:
        super().__init__()
        from torch.utils.flop_counter import flop_registry

        self.registry = flop_registry
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = decomposed(self, func, args, kwargs)  # linear under inference_mode: its addmm
        if out is not NotImplemented:
            return out
        out = func(*args, **kwargs)
        formula = self.registry.get(func._overloadpacket)
        if formula is not None:
            self.by_op[func._overloadpacket.__name__] += int(formula(*args, **kwargs, out_val=out))
        return out

    def get_total_flops(self) -> int:
        return sum(self.by_op.values())

    def get_flop_counts(self) -> dict[str, dict[str, int]]:
        return {"Global": dict(self.by_op)}


class _FlopProxy(Live):
    def __init__(self, mode: Any) -> None:
        self._mode = mode

    def _snapshot(self) -> FlopCount:
        if self._final is not None:
            return self._final
        counts = self._mode.get_flop_counts().get("Global", {})
        by = {str(getattr(k, "__name__", k)): int(v) for k, v in counts.items()}
        return FlopCount(int(self._mode.get_total_flops()), dict(sorted(by.items())))


@contextlib.contextmanager
def count_flops(decompose: bool = False) -> Iterator[_FlopProxy]:
    """FLOPs of the block, forward and backward, by ``torch.utils.flop_counter``'s formulas.

    ``decompose=True`` runs the full ``FlopCounterMode`` (quiet), which also decomposes ops
    that have no formula (custom ops) at several times the cost.
    """
    mode: Any
    if decompose:
        from torch.utils.flop_counter import FlopCounterMode

        mode = FlopCounterMode(display=False)
    else:
        mode = _FlopMode()
    proxy = _FlopProxy(mode)
    with mode:
        yield proxy
    proxy._final = proxy._snapshot()
