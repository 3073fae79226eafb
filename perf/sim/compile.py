"""``torch.compile`` on the simulated device: TorchDynamo and AOTAutograd as Inductor runs
them, then each captured graph's aten ops run eagerly on ``sim``.

Why this cut: the counts. A sync or a host-device copy inside a compiled graph on CUDA is an aten
op of that graph (``_local_scalar_dense``, ``_to_copy`` / ``copy_`` across devices) that
Inductor's wrapper code issues as the same op; everything Inductor fuses into kernels is
device-only work. Running the graph's ops on ``sim`` passes every one of those ops through the
simulated device's own kernels, which report syncs and copies exactly as for eager code. Code
generated for the CPU over the host views would run faster but hide those ops inside generated
C++ (a ``sim`` -> ``cpu`` copy becomes a host-to-host copy).

What is real: TorchDynamo's graph capture, guards, graph breaks and recompiles (nothing here
touches Dynamo's decisions); Inductor's own ``compile_fx`` with its decompositions, pre-grad and
joint-graph passes and its min-cut partitioner (so the forward / backward graphs and what they
save are Inductor's). What is replaced: only Inductor's ``inner_compile`` (lowering,
scheduling, code generation) for graphs whose tensors are on ``sim``; graphs on other devices
are untouched.

How it hooks in (:func:`install`, called by ``simulated_device()``; it imports neither Dynamo
nor Inductor, which cost seconds, but hooks ``torch.compile``'s default backend object,
``torch._TorchCompileInductorWrapper``, to set the hooks below when first used):

- ``torch._inductor.compile_fx.compile_fx`` (what that backend calls, looked up at call time)
  is wrapped: a graph with a ``sim`` tensor gets
  :func:`_run_on_sim` as its inner compiler. Options Inductor reads from its config
  (``mode="reduce-overhead"``'s CUDA graphs, ``"max-autotune"``) have nothing to act on, as on
  the CPU, and are ignored.
- Syncs the compiler itself causes are not the program's: Inductor's constant folding reads a
  folded scalar with ``.item()`` while compiling. The simulated device's sync listeners are
  paused for the duration of a compile.
- Dynamo never sees the simulated device's kernels: every function of ``perf.sim`` is marked
  "skip, and skip what it calls" (``set_code_exec_strategy(code, SKIP, SKIP)``), as a CUDA
  kernel is C++ that Dynamo never sees. Without it, the Python kernels that run when a compiled
  frame calls an op eagerly (a graph break's ``.item()``) would be traced as user frames and
  add frames, graphs and recompiles that CUDA does not have.
- A compiled optimizer step on CUDA makes its ``step`` tensors device tensors
  (``capturable=True``, Dynamo's ``OptimizerVariable._set_capturable``, which looks at
  ``is_cuda`` / ``is_xpu``); the same is done for parameters on ``sim``, so the optimizer state
  is where CUDA keeps it.

Tested on torch 2.13.0 (the hooks are private torch APIs; :func:`install` raises
``SimulatedDeviceError`` naming the missing one on a torch without them).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from perf.sim.kernels import sync_listeners
from perf.sim.tensors import NAME

__all__ = ["as_planned", "install", "installed"]

_installed = False
#: Why torch.compile cannot be routed for sim graphs in this process (None: it can).
unavailable: str | None = None
_hooked: set[str] = set()  # which of torch's compile stages are hooked: "dynamo", "inductor"


def installed() -> bool:
    """Whether ``torch.compile`` is routed for ``sim`` graphs in this process."""
    return _installed


def install() -> None:
    """Make ``torch.compile`` (default backend) run graphs on ``sim``; idempotent.

    Importing TorchDynamo and Inductor costs seconds, so nothing here imports them: the hooks
    into them are set when ``torch.compile`` builds its default backend (which has imported
    Dynamo by then) and when that backend first compiles (the first Inductor import), or now
    where they are already imported."""
    global _installed
    if _installed:
        return
    global unavailable
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )

        wrapper = torch._TorchCompileInductorWrapper
    except (ImportError, AttributeError) as e:  # pragma: no cover - other torch versions
        # eager code on sim works without these; torch.compile on sim then fails in Inductor
        unavailable = f"torch {torch.__version__} lacks {e} (tested: torch 2.13.0)"
        return
    skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    for code in _sim_code_objects():
        set_code_exec_strategy(code, skip)
    plain_init, plain_call = wrapper.__init__, wrapper.__call__

    @functools.wraps(plain_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _hook_dynamo()
        plain_init(self, *args, **kwargs)

    @functools.wraps(plain_call)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        _hook_dynamo()  # where torch.compile ran before simulated_device()
        _hook_inductor()
        return plain_call(self, *args, **kwargs)

    wrapper.__init__, wrapper.__call__ = __init__, __call__  # type: ignore[method-assign]
    if "torch._dynamo.variables.optimizer" in sys.modules:
        _hook_dynamo()
    if "torch._inductor.compile_fx" in sys.modules:
        _hook_inductor()
    _installed = True


def _hook_dynamo() -> None:
    if "dynamo" in _hooked:
        return
    from torch._dynamo.variables.optimizer import OptimizerVariable

    OptimizerVariable._set_capturable = _capturable_on_sim(OptimizerVariable._set_capturable)  # type: ignore[method-assign]
    _hooked.add("dynamo")


def _hook_inductor() -> None:
    if "inductor" in _hooked:
        return
    import torch._inductor.compile_fx as compile_fx_mod

    compile_fx_mod.compile_fx = _routing(compile_fx_mod.compile_fx)
    _hooked.add("inductor")


def _sim_code_objects() -> Iterator[types.CodeType]:
    """The code of every function and method defined in ``perf.sim``'s modules, nested code
    (closures, comprehensions) included."""
    prefix = __name__.rpartition(".")[0] + "."  # "perf.sim."
    todo: list[types.CodeType] = []
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefix) or module is None:
            continue
        for obj in vars(module).values():
            for fn in (obj, *(vars(obj).values() if isinstance(obj, type) else ())):
                fn = getattr(fn, "__func__", fn)  # staticmethod / classmethod
                code = getattr(fn, "__code__", None)
                if isinstance(code, types.CodeType) and fn.__module__ == module.__name__:
                    todo.append(code)
    seen: set[int] = set()
    while todo:
        code = todo.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        yield code
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


# --------------------------------------------------------------------------------------------
# routing Inductor's sim graphs


def _on_sim(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == NAME


def _is_sim_graph(gm: Any, example_inputs: Sequence[Any]) -> bool:
    """A graph whose inputs or intermediate values live on ``sim``."""
    if any(_on_sim(x) for x in example_inputs):
        return True
    graph = getattr(gm, "graph", None)
    if graph is None:
        return False
    for node in graph.nodes:
        val = node.meta.get("example_value", node.meta.get("val"))
        if _on_sim(val) or (isinstance(val, (list, tuple)) and any(_on_sim(v) for v in val)):
            return True
    return False


def _routing(plain: Any) -> Any:
    @functools.wraps(plain)
    def compile_fx(model_: Any, example_inputs_: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        if args or "inner_compile" in kwargs or not _is_sim_graph(model_, example_inputs_):
            # not ours, or Inductor's recursive call that already carries our inner compiler
            return plain(model_, example_inputs_, *args, **kwargs)
        with _compiler_syncs_paused():
            return plain(model_, example_inputs_, *args, inner_compile=_run_on_sim, **kwargs)

    compile_fx._perf_sim = True  # type: ignore[attr-defined]
    return compile_fx


@contextlib.contextmanager
def _compiler_syncs_paused() -> Iterator[None]:
    """The compiler's own reads of device values are not the program's syncs."""
    saved = list(sync_listeners)
    sync_listeners.clear()
    try:
        yield
    finally:
        sync_listeners[:] = saved + [f for f in sync_listeners if f not in saved]


def _run_on_sim(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """Inductor's inner compiler for ``sim`` graphs: the graph itself, its ops run eagerly.

    Called with Inductor's keyword arguments (``cudagraphs``, ``is_inference``, ...); none of
    them changes what the graph computes. Returns a boxed callable (arguments in a list that
    it clears), Inductor's calling convention."""
    _device_put_as_to_copy(gm)
    _higher_order_as_kernels(gm)
    checked = False

    def run(args: list[Any]) -> Any:
        nonlocal checked
        call_args = list(args)
        args.clear()  # boxed convention: let the inputs die as soon as the graph is done
        if not checked:
            checked = True
            return _run_as_planned(gm, call_args)
        return gm.forward(*call_args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _planned_stride(node: torch.fx.Node) -> tuple[int, ...] | None:
    """The strides Inductor planned for ``node``'s tensor output (concrete only)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.device.type != NAME:
        return None
    stride = tuple(val.stride())
    if not all(type(s) is int for s in (*stride, *val.shape)):
        return None  # symbolic: not checked
    return stride


def _differs(x: torch.Tensor, want: tuple[int, ...]) -> bool:
    # strides of dimensions of size 1 (or of an empty tensor) do not matter
    if x.dim() != len(want) or x.numel() == 0:
        return False
    return any(n > 1 and a != b for a, b, n in zip(x.stride(), want, x.shape, strict=True))


def as_planned(x: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """``x`` with the strides Inductor planned: a device-to-device copy where they differ."""
    if not _differs(x, tuple(stride)):
        return x
    out = torch.empty_strided(x.size(), tuple(stride), dtype=x.dtype, device=x.device)
    return out.copy_(x)


def _run_as_planned(gm: torch.fx.GraphModule, args: list[Any]) -> Any:
    """The graph's first call, op by op, checking each op's output against the strides
    Inductor planned for it.

    Why: Inductor plans strides with the meta kernels for device ``sim`` (for convolution,
    contiguous), but ``sim`` runs the CPU kernels, which choose their own layout (convolution:
    channels-last when the input or the weight is); a later ``view`` planned on the first
    layout then fails (a channels-last UNet's backward). Where a non-view op's output differs,
    it is copied to the planned strides, and the graph gets that copy as an op after it, so
    later calls run at full speed with the strides Inductor planned."""
    fixes: dict[torch.fx.Node, tuple[int, ...]] = {}

    class Check(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            out = super().run_node(n)
            target = n.target
            fresh = target is operator.getitem or (  # an element of a multi-output op
                isinstance(target, torch._ops.OpOverload)
                and not target.is_view
                and not target._schema.is_mutable
            )
            if n.op == "call_function" and isinstance(out, torch.Tensor) and fresh:
                want = _planned_stride(n)
                if want is not None and _differs(out, want):
                    fixes[n] = want
                    out = as_planned(out, want)
            return out

    result = Check(gm).run(*args)
    if fixes:
        for node, stride in fixes.items():
            with gm.graph.inserting_after(node):
                fixed = gm.graph.call_function(as_planned, (node, list(stride)))
            node.replace_all_uses_with(fixed, delete_user_cb=functools.partial(operator.ne, fixed))
        gm.recompile()
    return result


def _device_put_as_to_copy(gm: torch.fx.GraphModule) -> None:
    """Inductor's decompositions turn ``x.to(device)`` into ``prims.device_put``, which Inductor
    lowers to a ``copy_`` that its wrapper code dispatches (where counters see it). Run it as
    the equivalent ``aten._to_copy``, the op the simulated device and perf's counters know."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.prims.device_put.default:
            src, device = (
                node.args[0],
                node.args[1] if len(node.args) > 1 else node.kwargs["device"],
            )
            non_blocking = (
                node.args[2] if len(node.args) > 2 else node.kwargs.get("non_blocking", False)
            )
            node.target = torch.ops.aten._to_copy.default
            node.args = (src,)
            node.kwargs = {"device": device, "non_blocking": non_blocking}
            changed = True
    if changed:
        gm.recompile()


#: higher-order operators Inductor compiles into one kernel of its own (a Triton template on
#: CUDA): FlexAttention, forward and backward
_KERNEL_HOPS = ("flex_attention", "flex_attention_backward")


def _one_kernel(hop: Any) -> Any:
    """``hop`` run by its eager implementation with the simulated device's sync listeners
    paused: its reads of host values (the dense FlexAttention copies ``-inf`` to the device,
    a sync) are not the compiled program's, whose kernel reads none."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with _compiler_syncs_paused():
            return hop(*args, **kwargs)

    kernel.__name__ = f"{hop.name()}_kernel"
    return kernel


def _higher_order_as_kernels(gm: torch.fx.GraphModule) -> None:
    """A graph's FlexAttention runs as the one kernel Inductor makes of it (see
    :func:`_one_kernel`); a dispatch mode still sees the operator, once."""
    changed = False
    for node in gm.graph.nodes:
        target = node.target
        if (
            node.op == "call_function"
            and isinstance(target, torch._ops.HigherOrderOperator)
            and target.name() in _KERNEL_HOPS
        ):
            node.target = _one_kernel(target)
            changed = True
    if changed:
        gm.recompile()


# --------------------------------------------------------------------------------------------
# compiled optimizers keep their step on the device, as on CUDA


def _capturable_on_sim(set_capturable: Any) -> Any:
    @functools.wraps(set_capturable)
    def _set_capturable(self: Any, tx: Any) -> None:
        for group in self.value.param_groups:
            params = group.get("params", [])
            if (
                "capturable" in group
                and params
                and all(p.device.type == NAME for p in params)
                and all(p not in self.value.state for p in params)
            ):
                group["capturable"] = True
        set_capturable(self, tx)

    _set_capturable._perf_sim = True  # type: ignore[attr-defined]
    return _set_capturable
