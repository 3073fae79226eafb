"""FLOPs of a block (``perf.count_flops``), by ``torch.utils.flop_counter``."""

from __future__ import annotations

import contextlib
import importlib
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


def _grouped_mm_flop(
    a_shape: Any, b_shape: Any, offs: Any = None, *args: Any, out_shape: Any = None, **kw: Any
) -> int:
    """``torch._grouped_mm`` (``F.grouped_mm``: mixture-of-experts layers), 2 per multiply-add.

    Each group is a matmul over its slice (``GroupedMMUtils.h`` ``_grouped_mm_fallback``): for
    2d x 3d the rows of ``a`` split among the groups' ``(K, N)`` matrices, for 3d x 2d the
    columns of ``b``, for 2d x 2d the shared ``K``; 3d x 3d is a ``bmm``. The sum over groups
    is the full dimension, whatever ``offs`` holds, so no device value is read (rows past
    ``offs[-1]``, which the kernel skips, are counted)."""
    if len(a_shape) == 2 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * b_shape[2]
    if len(a_shape) == 3 and len(b_shape) == 2:
        return 2 * a_shape[1] * a_shape[2] * b_shape[1]
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]


def _rnn_matmul_flop(input_shape: Any, weight_shapes: Any, batch_sizes: Any) -> int:
    """One pass of cuDNN's RNN over every token: each weight matrix (``w_ih``, ``w_hh``,
    ``w_hr``; biases are not matmuls) multiplies each token's vector once, 2 per multiply-add.
    Tokens: ``T x B``, or the packed rows (``sum(batch_sizes)``, the input's first dim)."""
    tokens = input_shape[0] if batch_sizes else input_shape[0] * input_shape[1]
    return 2 * tokens * sum(w[0] * w[1] for w in weight_shapes if len(w) == 2)


def _cudnn_rnn_flop(input_shape: Any, weight_shapes: Any, *args: Any, **kw: Any) -> int:
    """``_cudnn_rnn`` (``nn.LSTM`` / ``GRU`` / ``RNN`` on CUDA): its matmuls."""
    return _rnn_matmul_flop(input_shape, weight_shapes, args[12])


def _cudnn_rnn_backward_flop(input_shape: Any, weight_shapes: Any, *args: Any, **kw: Any) -> int:
    """``_cudnn_rnn_backward``: the data gradient's matmuls, and the weights' when asked
    (``output_mask[3]``), each as many as the forward's (as for ``mm``)."""
    once = _rnn_matmul_flop(input_shape, weight_shapes, args[16])
    return once * (2 if args[19][3] else 1)


def _linear_cross_entropy_flop(input_shape: Any, weight_shape: Any, *args: Any, **kw: Any) -> int:
    """``torch_nn::_linear_cross_entropy_batch_chunked`` (``F.linear_cross_entropy`` with
    ``options``, mean or sum): its forward computes the logits and precomputes the gradients
    asked for (``compute_input_grad``, ``compute_linear_weight_grad``), chunk by chunk, each a
    ``(N, D) x (D, V)``-sized matmul, 2 per multiply-add; the reference path's ``linear`` and
    its backward count the same."""
    once = 2 * input_shape[0] * input_shape[1] * weight_shape[0]
    return once * (1 + bool(args[10]) + bool(args[11]))


def _linear_cross_entropy_none_flop(input_shape: Any, weight_shape: Any, *a: Any, **k: Any) -> int:
    """``..._no_reduction``'s forward: the logits only (its backward, Python above the
    dispatcher, runs matmuls that are counted as they run)."""
    return 2 * input_shape[0] * input_shape[1] * weight_shape[0]


def _addmm_flop(self_shape: Any, a_shape: Any, b_shape: Any, *args: Any, **kw: Any) -> int:
    """``addmm_`` (in place): ``addmm``'s, which torch registers for ``addmm`` and its
    ``out=`` form only (``F.linear_cross_entropy``'s weight gradient is an ``addmm_``)."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


def _baddbmm_flop(self_shape: Any, a_shape: Any, b_shape: Any, *args: Any, **kw: Any) -> int:
    """``baddbmm_`` (in place): ``baddbmm``'s."""
    return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]


#: formulas (on shapes, as ``torch.utils.flop_counter``'s own) for ops torch has none for
EXTRA_FORMULAS: dict[Any, Any] = {
    **({aten._grouped_mm: _grouped_mm_flop} if hasattr(aten, "_grouped_mm") else {}),
    aten._cudnn_rnn: _cudnn_rnn_flop,
    aten._cudnn_rnn_backward: _cudnn_rnn_backward_flop,
    aten.addmm_: _addmm_flop,
    aten.baddbmm_: _baddbmm_flop,
}

#: torch's own Python custom ops, (module that defines them, op name) -> formula: an op is
#: registered when its module is imported, so :func:`flop_formulas` imports the module
CUSTOM_OP_FORMULAS: dict[tuple[str, str], Any] = {
    ("torch.nn.modules.linear_cross_entropy", "torch_nn._linear_cross_entropy_batch_chunked"): (
        _linear_cross_entropy_flop
    ),
    (
        "torch.nn.modules.linear_cross_entropy",
        "torch_nn._linear_cross_entropy_batch_chunked_no_reduction",
    ): _linear_cross_entropy_none_flop,
}


def _custom_op_formulas() -> dict[Any, Any]:
    found = {}
    for (module, name), formula in CUSTOM_OP_FORMULAS.items():
        try:
            importlib.import_module(module)
        except ImportError:
            continue  # not in this torch
        namespace, _, op = name.partition(".")
        packet = getattr(getattr(torch.ops, namespace), op, None)
        if packet is not None:
            found[packet] = formula
    return found


def flop_formulas() -> dict[Any, Any]:
    """torch's ``flop_registry``, :data:`EXTRA_FORMULAS` and :data:`CUSTOM_OP_FORMULAS`, each
    taking an op's arguments."""
    from torch.utils.flop_counter import flop_registry, shape_wrapper

    extra = {**EXTRA_FORMULAS, **_custom_op_formulas()}
    return {**flop_registry, **{k: shape_wrapper(v) for k, v in extra.items()}}


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
        self.registry = flop_formulas()
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
    """FLOPs of the block, forward and backward, by ``torch.utils.flop_counter``'s formulas
    (and :data:`EXTRA_FORMULAS` for ops it lacks: ``_grouped_mm``, cuDNN's RNN).

    ``decompose=True`` runs the full ``FlopCounterMode`` (quiet), which also decomposes ops
    that have no formula (custom ops) at several times the cost.
    """
    mode: Any
    if decompose:
        from torch.utils.flop_counter import FlopCounterMode

        custom = {**EXTRA_FORMULAS, **_custom_op_formulas()}
        mode = FlopCounterMode(display=False, custom_mapping=custom)
    else:
        mode = _FlopMode()
    proxy = _FlopProxy(mode)
    with mode:
        yield proxy
    proxy._final = proxy._snapshot()
