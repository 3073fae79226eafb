"""The base of perf's counting dispatch modes: on while compiled code runs, off while it
compiles.

Why: a ``TorchDispatchMode`` on the stack makes TorchDynamo refuse to compile (it runs the
code eagerly instead), so a counter around ``torch.compile``'d code would count a different
program. With ``ignore_compile_internals`` the mode is off while torch.compile compiles and on
while the compiled code runs, where it sees the ops that code dispatches (the copies and
scalar reads Inductor's wrapper code issues on CUDA; every graph op on ``sim``).

Each mode's ``__torch_dispatch__`` runs with TorchDynamo off, as torch's own wrapper would
run it, but through Dynamo's C switches (:func:`_dynamo_switches`): torch's wrapper imports
``torch._dynamo`` (and sympy) on a mode's first op, 0.8 s of CPU and about 100 MB in every
process that counts anything, and costs four switches and three Python frames per op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode

from perf.sim import tensors as simulated
from perf.sim.paths import AUTOGRAD_KERNELS, run_composite


def _dynamo_switches() -> tuple[Any, Any, Any] | None:
    """``(set_eval_frame, skip_code, skip_code_and_callees)``: TorchDynamo's C switches, where
    this torch has them.

    Why: torch wraps every ``TorchDispatchMode.__torch_dispatch__`` in
    ``torch._dynamo.disable``, whose first call imports ``torch._dynamo``; and per op the
    wrapper costs Python frames and four ``set_eval_frame`` calls (a do-nothing mode on
    ``sim``: 77 against 73 us a tiny op on the 2-core VM). The same is done here in C: the
    dispatch frame is marked for Dynamo to skip, and the mode's work runs with the eval-frame
    callback off, as ``disable(recursive=True)`` runs it."""
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
            set_eval_frame,
        )
    except ImportError:
        return None
    skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT)
    skip_all = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)

    def skip_code(code: Any) -> None:
        set_code_exec_strategy(code, skip)

    def skip_code_and_callees(code: Any) -> None:
        set_code_exec_strategy(code, skip_all)

    return set_eval_frame, skip_code, skip_code_and_callees


_DYNAMO = _dynamo_switches()


#: perf's torch-function modes (``count_syncs``'s): TorchDynamo guards compiled frames on the
#: torch-function mode stack, so :mod:`perf.instruments.compiles` tells the recompiles that
#: only one of these on (or off) the stack caused
FUNCTION_MODES: list[type] = []


def run_frames_eagerly(code: Any) -> None:
    """Mark ``code`` (a perf instrument's hook) so that TorchDynamo's eval-frame callback, on
    between the graphs of compiled code, compiles neither its frames nor the frames they call
    (``disable(recursive=True)``'s effect, set in C); Dynamo still inlines the function while
    it traces. Nothing on a torch without the switch."""
    if _DYNAMO is not None:
        _DYNAMO[2](code)


def _without_dynamo(dispatch: Callable[..., Any]) -> Callable[..., Any]:
    """``dispatch`` run with Dynamo's eval-frame callback off (restored after), higher-order
    operators sent to the mode's ``higher_order``."""
    assert _DYNAMO is not None
    set_eval_frame = _DYNAMO[0]

    @functools.wraps(dispatch)
    def __torch_dispatch__(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        prior = set_eval_frame(None)
        try:
            if isinstance(func, HigherOrderOperator):
                return _higher_order(self, func, args, kwargs or {})
            return dispatch(self, func, types, args, kwargs)
        finally:
            if prior is not None:
                set_eval_frame(prior)

    return __torch_dispatch__


def _routing_higher_order(dispatch: Callable[..., Any]) -> Callable[..., Any]:
    """``dispatch``, higher-order operators sent to the mode's ``higher_order`` (a torch
    without Dynamo's C switches)."""

    @functools.wraps(dispatch)
    def __torch_dispatch__(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        if isinstance(func, HigherOrderOperator):
            return _higher_order(self, func, args, kwargs or {})
        return dispatch(self, func, types, args, kwargs)

    return __torch_dispatch__


def _higher_order(mode: Any, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """``torch.cond``: its taken branch run inside ``mode``, as its eager implementation runs
    it (``cond_op_dense``: ``if pred:``, a read of the predicate, a sync on a device), so the
    branch's ops are counted; any other higher-order operator: ``mode.higher_order``."""
    if func.name() == "cond" and len(args) == 4 and not kwargs:
        pred, true_fn, false_fn, operands = args
        with mode:
            return (true_fn if pred else false_fn)(*operands)
    return mode.higher_order(func, args, kwargs)


class CountingDispatchMode(TorchDispatchMode):
    """A dispatch mode that counts what compiled code does at run time, not while compiling;
    its ``__torch_dispatch__`` runs with Dynamo off (module docstring).

    Higher-order operators (FlexAttention's ``flex_attention`` and its backward in eager
    code, ``torch.cond``, ...) reach a mode only where it says it takes them; a mode that does
    not makes torch raise "There was no rule registered for HigherOrderOperator" (inside an
    autograd function, where FlexAttention runs, the process aborts). Each perf mode takes
    them: ``torch.cond`` runs its branch inside the mode (the branch's ops are counted), any
    other one through :meth:`higher_order`, whole, as one op, below the mode."""

    supports_higher_order_operators = True

    def higher_order(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """Run higher-order operator ``func`` whole (this mode is off inside it: the
        operator's own implementation dispatches what it dispatches). Counters that count
        ops extend this."""
        return func(*args, **kwargs)

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch's wrapper only where its C switches are missing (an older torch, which does
        # not wrap either): else __init_subclass__ below does the same in C
        return _DYNAMO is None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        raw = cls.__dict__.get("__torch_dispatch__")
        if raw is not None and not isinstance(raw, classmethod):
            wrap = _without_dynamo if _DYNAMO is not None else _routing_higher_order
            cls.__torch_dispatch__ = wrap(raw)  # type: ignore[method-assign]

    def __enter__(self) -> Any:
        if _DYNAMO is not None:  # each time: torch._dynamo.reset() may forget it
            _DYNAMO[1](type(self).__torch_dispatch__.__code__)
        return super().__enter__()


#: id(op) -> (op, whether autograd decomposes it: see :func:`decomposed`, the simulated devices
#: when that was read); holds op, so that its id stays its own. Installing ``sim`` registers
#: kernels (``group_norm``'s CUDA path) that change the answer, so an answer read before is
#: read again.
_IMPLICIT: dict[int, tuple[Any, bool, frozenset[torch.device]]] = {}
#: A direct kernel for one of these keeps an op whole at autograd's keys too (the dispatcher
#: fills an autograd key from CompositeImplicitAutograd only where its backend has no kernel of
#: its own): ``silu_backward``'s fused CPU and CUDA kernels. Such an op reaches a mode whole
#: everywhere and runs its own kernel. ``sim``'s kernels for CUDA's paths (``group_norm``,
#: the RNNs: :data:`perf.sim.paths.AUTOGRAD_KERNELS`) stand in for CUDA's composite instead.
_OWN_KERNEL_KEYS = ("CPU", "CUDA", "PrivateUse1", "CompositeExplicitAutograd")
#: sim's own kernel for these is CUDA's path, not a kernel of its own
_SIM_PATH_KEYS = tuple(k for k in _OWN_KERNEL_KEYS if k != "PrivateUse1")


def autograd_decomposes(func: Any) -> bool:
    name = func.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    try:
        if not has(name, "CompositeImplicitAutograd"):
            return False
    except RuntimeError:  # not in the dispatcher's table (prim::device, which tracing issues)
        return False
    keys = _SIM_PATH_KEYS if func in AUTOGRAD_KERNELS else _OWN_KERNEL_KEYS
    return not any(has(name, k) for k in keys)


def decomposed(mode: TorchDispatchMode, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """``func`` run through its CompositeImplicitAutograd kernel with ``mode`` on, so that the
    ops it decomposes into reach the mode; ``NotImplemented`` where it has no such kernel.

    Why: such an op (``linear``, ``to``, ``matmul``, ``item``, ``lstm`` ...) is decomposed at
    autograd's dispatch keys, above the Python one, so a mode sees what it decomposes into
    (``t`` and ``addmm``, ``_to_copy``, cuDNN's ``_cudnn_rnn``) and the device runs those
    (unless a backend has a kernel of its own for it: then it stays whole, see
    ``_OWN_KERNEL_KEYS``). Where autograd is skipped (``torch.inference_mode()``, inference
    tensors) the mode got the op itself, and a counter keyed on ``addmm`` or ``_to_copy``
    missed the FLOPs, the copy, the launch (an evaluation loop under ``inference_mode`` counted
    0 FLOPs). The kernel run is the C++ one the device runs, not a Python decomposition of
    ``torch._decomp`` (``OpOverload.decompose()`` prefers those: an LSTM became one ``addmm``
    per time step instead of cuDNN's one call); on ``sim``, its kernel for CUDA's path. Every
    perf counting mode calls this first."""
    known = _IMPLICIT.get(id(func))
    if known is None or known[2] is not simulated.SIM_DEVICES:
        known = _IMPLICIT[id(func)] = (func, autograd_decomposes(func), simulated.SIM_DEVICES)
    if not known[1]:
        return NotImplemented
    with mode:
        return run_decomposition(func, args, kwargs)


def run_decomposition(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """The kernel :func:`decomposed` runs ``func`` through: on a ``sim`` argument, ``sim``'s
    own kernel for CUDA's path where it has one, else the C++ composite."""
    own = AUTOGRAD_KERNELS.get(func)
    if own is not None and args and simulated.is_sim(args[0]):
        return own(*args, **kwargs)
    return run_composite(func, *args, **kwargs)


def flat_tensors(x: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors in an op's arguments or result ``x`` (nested tuples / lists / dict values),
    appended to ``out``: torch's pytree is general, and several times slower on the argument
    lists of aten ops (which hold no other containers)."""
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for a in x:
            if isinstance(a, torch.Tensor):
                out.append(a)
            elif isinstance(a, (list, tuple, dict)):
                flat_tensors(a, out)
    elif isinstance(x, dict):
        flat_tensors(tuple(x.values()), out)
    return out


def _on_cuda(t: torch.Tensor) -> bool:
    return t.is_cuda


def device_test(device_type: str) -> Callable[[torch.Tensor], bool]:
    """``test(t)``: whether tensor ``t`` is on a device of ``device_type``.

    Why not ``t.device.type == device_type``: ``.type`` builds a new string, about 1 us a
    tensor on the 2-core VM, the most expensive step of a counting mode's per-op work."""
    if device_type == simulated.NAME:
        return simulated.is_sim
    if device_type == "cuda":
        return _on_cuda
    return lambda t: t.device.type == device_type
