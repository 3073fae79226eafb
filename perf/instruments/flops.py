"""FLOPs of a block (``perf.count_flops``), by ``torch.utils.flop_counter``."""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from perf.instruments.live import Live
from perf.instruments.modes import CountingDispatchMode, decomposed
from perf.sim import tensors as simulated

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


def _lengths(offsets: Any, max_len: int) -> list[int]:
    """Sequence lengths from cumulative offsets (variable-length attention), read without a
    dispatch, so no counter sees the read: a ``sim`` tensor's host data (no sync), a host
    tensor's own; a fake or meta tensor's are unknown, each ``max_len`` (torch's rule). A CUDA
    tensor's read waits for the device, once per call (torch's own formula syncs too, and
    there its read was counted as the program's)."""
    if type(offsets) is not torch.Tensor or offsets.device.type == "meta":
        return [max_len] * (offsets.size(0) - 1)
    with torch._C._DisableTorchDispatch():
        if offsets.device in simulated.SIM_DEVICES:
            offsets = simulated.host_view(offsets)
        values = offsets.tolist()
    return [b - a for a, b in itertools.pairwise(values)]


def _varlen_flops(
    query: Any, key: Any, value: Any, cum_q: Any, cum_k: Any, max_q: int, max_k: int,
    backward: bool,
) -> int:  # fmt: skip
    """FLOPs of packed attention, per sequence, by torch's ``sdpa_flop_count`` (causal and
    windowed attention count the whole square, as torch counts them)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    _, hq, dq = query.shape
    _, hk, dk = key.shape[-3:]
    _, hv, dv = value.shape[-3:]
    total = 0
    lengths_k = _lengths(cum_k if cum_k is not None else cum_q, max_k)
    for lq, lk in zip(_lengths(cum_q, max_q), lengths_k, strict=False):
        q, k, v = (1, hq, lq, dq), (1, hk, lk, dk), (1, hv, lk, dv)
        total += sdpa_backward_flop_count(q, q, k, v) if backward else sdpa_flop_count(q, k, v)
    return total


def _varlen_attn_out_flop(out: Any, *args: Any, **kwargs: Any) -> int:
    """``torch_attn::_varlen_attn_out`` (``varlen_attn_out``): ``_varlen_attn``'s, after its
    ``out`` (which, like ``_varlen_attn`` and its backward, passes its arguments in
    ``_flash_attention_forward``'s / ``_backward``'s order)."""
    return _flash_forward_flop(*args, **kwargs)


def _flash_forward_flop(q: Any, k: Any, v: Any, cq: Any, ck: Any, mq: int, mk: int, *a: Any,
                        out_val: Any = None, **kw: Any) -> int:  # fmt: skip
    """``_flash_attention_forward``: packed, as above; dense, torch's own formula."""
    if cq is None:
        from torch.utils.flop_counter import flop_registry

        return int(flop_registry[aten._flash_attention_forward](
            q, k, v, cq, ck, mq, mk, *a, out_val=out_val, **kw
        ))  # fmt: skip
    return _varlen_flops(q, k, v, cq, ck, mq, mk, backward=False)


def _flash_backward_flop(g: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, cq: Any, ck: Any,
                         mq: int, mk: int, *a: Any, out_val: Any = None,
                         **kw: Any) -> int:  # fmt: skip
    """``_flash_attention_backward``: packed, as above; dense, torch's own formula."""
    if cq is None:
        from torch.utils.flop_counter import flop_registry

        return int(flop_registry[aten._flash_attention_backward](
            g, q, k, v, o, lse, cq, ck, mq, mk, *a, out_val=out_val, **kw
        ))  # fmt: skip
    return _varlen_flops(q, k, v, cq, ck, mq, mk, backward=True)


#: formulas on the ops' own arguments (not shapes): packed attention's FLOPs depend on the
#: sequence lengths, which torch's formulas read through the dispatcher (a sync a counter saw)
RAW_FORMULAS: dict[Any, Any] = {
    aten._flash_attention_forward: _flash_forward_flop,
    aten._flash_attention_backward: _flash_backward_flop,
}

#: torch's own Python custom ops (registered when their module is imported, which perf does
#: not do: ``torch.nn.attention.varlen`` imports TorchDynamo), by qualified name ->
#: (formula, whether it takes the arguments raw); looked up when such an op first runs
CUSTOM_OP_FORMULAS: dict[str, tuple[Any, bool]] = {
    "torch_nn::_linear_cross_entropy_batch_chunked": (_linear_cross_entropy_flop, False),
    "torch_nn::_linear_cross_entropy_batch_chunked_no_reduction": (
        _linear_cross_entropy_none_flop,
        False,
    ),
    "torch_attn::_varlen_attn": (_flash_forward_flop, True),
    "torch_attn::_varlen_attn_out": (_varlen_attn_out_flop, True),
    "torch_attn::_varlen_attn_backward": (_flash_backward_flop, True),
}


def custom_op_formula(packet: Any) -> Any:
    """The formula of a custom op of :data:`CUSTOM_OP_FORMULAS` (taking its arguments, as the
    registry's), else None."""
    entry = CUSTOM_OP_FORMULAS.get(getattr(packet, "_qualified_op_name", ""))
    if entry is None:
        return None
    from torch.utils.flop_counter import shape_wrapper

    formula, raw = entry
    return formula if raw else shape_wrapper(formula)


def _registered_custom_ops() -> dict[Any, Any]:
    """:func:`custom_op_formula` of each custom op of :data:`CUSTOM_OP_FORMULAS` registered
    now (perf's replace torch's: ``torch.nn.attention.varlen`` adds its own, which read the
    sequence lengths through the dispatcher)."""
    found = {}
    for name in CUSTOM_OP_FORMULAS:
        namespace, _, op = name.partition("::")
        packet = getattr(getattr(torch.ops, namespace), op, None)
        if packet is not None:
            found[packet] = custom_op_formula(packet)
    return found


def _raw(formula: Any) -> Any:
    def raw(*args: Any, **kwargs: Any) -> Any:
        return formula(*args, **kwargs)

    raw._get_raw = True  # type: ignore[attr-defined]
    return raw


def flop_formulas() -> dict[Any, Any]:
    """torch's ``flop_registry`` with :data:`EXTRA_FORMULAS` and :data:`RAW_FORMULAS`, each
    taking an op's arguments (custom ops: :func:`custom_op_formula`, when they run)."""
    from torch.utils.flop_counter import flop_registry, shape_wrapper

    return {
        **flop_registry,
        **{k: shape_wrapper(v) for k, v in EXTRA_FORMULAS.items()},
        **RAW_FORMULAS,
        **_registered_custom_ops(),
    }


@dataclass(frozen=True)
class FlopCount:
    """FLOPs by ``torch.utils.flop_counter`` (matmuls, convolutions, attention; 2 per MAC)."""

    total: int
    by_op: dict[str, int]


_UNSEEN = object()


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
        packet = func._overloadpacket
        formula = self.registry.get(packet, _UNSEEN)
        if formula is _UNSEEN:  # a custom op's first call
            formula = self.registry[packet] = custom_op_formula(packet)
        if formula is not None:
            self.by_op[func._overloadpacket.__name__] += int(formula(*args, **kwargs, out_val=out))
        return out

    def higher_order(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """torch's formula for it where there is one (FlexAttention: the dense attention's)."""
        out = func(*args, **kwargs)
        formula = self.registry.get(func)
        if formula is not None:
            self.by_op[func.name()] += int(formula(*args, **kwargs, out_val=out))
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
def count_flops(*, decompose: bool = False) -> Iterator[_FlopProxy]:
    """FLOPs of the block, forward and backward, by ``torch.utils.flop_counter``'s formulas
    (and :data:`EXTRA_FORMULAS` for ops it lacks: ``_grouped_mm``, cuDNN's RNN). Every op
    counts, whatever its device: there is no device argument.

    ``decompose=True`` runs the full ``FlopCounterMode`` (quiet), which also decomposes ops
    that have no formula (custom ops) at several times the cost; it cannot count eager
    FlexAttention (torch's mode raises "no implementation found for
    'torch.ops.higher_order.flex_attention'"), which the default counts.

    Keyword-only: ``count_flops(dev)``, written like ``count_ops(dev)``, took the device for
    ``decompose`` and ran the other counter.
    """
    mode: Any
    if decompose:
        from torch.utils.flop_counter import FlopCounterMode

        custom = {
            **EXTRA_FORMULAS,
            **{k: _raw(v) for k, v in RAW_FORMULAS.items()},
            **{k: _raw(v) for k, v in _registered_custom_ops().items()},
        }
        mode = FlopCounterMode(display=False, custom_mapping=custom)
    else:
        mode = _FlopMode()
    proxy = _FlopProxy(mode)
    with mode:
        yield proxy
    proxy._final = proxy._snapshot()
