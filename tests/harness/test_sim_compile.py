"""``torch.compile`` (default backend) on the simulated device: training steps match eager
``sim`` numerically and give the sync / transfer counts derived for CUDA; graph breaks and
recompiles are TorchDynamo's own, identical to the same program compiled on the CPU."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._dynamo
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
import torch._inductor.metrics
import torch.nn.functional as F
from _sim import SIM, needs_sim
from torch._dynamo.utils import counters

import perf
from perf.sim import compile as sim_compile
from perf.workloads.models import TransformerBlock

pytestmark = needs_sim
STEPS = 3


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    # Each test compiles from scratch. Inductor's and AOTAutograd's on-disk caches are off so
    # that a CPU compile does not hit entries of an earlier run (a cache hit skips work whose
    # counters the CPU side would then lack).
    torch._dynamo.reset()
    counters.clear()
    with (
        functorch_config.patch(enable_autograd_cache=False),
        inductor_config.patch(fx_graph_cache=False),
    ):
        yield
    torch._dynamo.reset()


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def _batches(shape: tuple[int, ...], classes: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(*shape, generator=g), torch.randint(0, classes, shape[:1], generator=g))
        for _ in range(STEPS)
    ]


def _train(
    model: torch.nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    wrap: Callable[[Any], Any],
    compile_step: bool,
) -> tuple[list[float], list[torch.Tensor], Any, Any, torch.optim.Optimizer]:
    """Steps of AdamW on ``sim``: each moves a host batch to the device (2 blocking copies)
    and reads the loss with ``.item()``."""
    model = copy.deepcopy(model).to(SIM)
    net = wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = net(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    fn = torch.compile(step) if compile_step else step
    losses = []
    with perf.count_syncs(SIM) as syncs, perf.count_transfers() as transfers:
        for x, y in batches:
            losses.append(fn(x.to(SIM), y.to(SIM)).item())
    params = [p.detach().cpu() for p in model.parameters()]
    return losses, params, syncs, transfers, opt


def _assert_cuda_counts(syncs: Any, transfers: Any) -> None:
    # Derived for cuda:0: per step two blocking host-to-device copies (x, y) and one
    # loss.item(); nothing inside the compiled forward, backward or AdamW step reads the
    # device or copies across (Adam's step counters are device tensors when compiled).
    assert syncs.by_op == {"h2d_copy": 2 * STEPS, "item": STEPS}
    assert (transfers.h2d_copies, transfers.d2h_copies) == (2 * STEPS, 0)


def test_compiled_mlp_trains_like_eager_sim_with_cudas_counts() -> None:
    batches = _batches((8, 16), 4)
    eager = _train(_mlp(), batches, lambda m: m, compile_step=False)
    compiled = _train(_mlp(), batches, torch.compile, compile_step=False)
    assert compiled[0] == pytest.approx(eager[0], rel=1e-5)
    for a, b in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    _assert_cuda_counts(compiled[2], compiled[3])
    _assert_cuda_counts(eager[2], eager[3])
    assert counters["stats"]["unique_graphs"] >= 1  # Dynamo really captured graphs


def test_compiled_training_step_of_a_transformer_block_with_adamw() -> None:
    class LM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.block, self.head = TransformerBlock(qkv_bias=False), torch.nn.Linear(16, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.block(x))

    batches = _batches((2, 6, 16), 5)
    batches = [
        (x, torch.randint(0, 5, (2, 6), generator=torch.Generator().manual_seed(i)))
        for i, (x, _) in enumerate(batches)
    ]
    eager = _train(LM(), batches, lambda m: m, compile_step=False)
    compiled = _train(LM(), batches, lambda m: m, compile_step=True)
    assert compiled[0] == pytest.approx(eager[0], rel=1e-4)
    for a, b in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    _assert_cuda_counts(compiled[2], compiled[3])
    # A compiled AdamW keeps its step counters on the device, as Dynamo makes it on CUDA
    # (capturable=True); eagerly they are host tensors.
    step = next(iter(compiled[4].state.values()))["step"]
    assert step.device == SIM
    assert next(iter(eager[4].state.values()))["step"].device.type == "cpu"


def _dynamo_counts() -> dict[str, dict[str, int]]:
    keep = ("stats", "frames", "graph_break", "resumes", "unimplemented")
    return {k: dict(counters[k]) for k in keep if counters[k]}


class BreaksOnItem(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.sum().item() > 0:  # a graph break, and a sync on a device
            y = y * 2
        return y.relu()


def _run_breaks_on_item(device: Any, sizes: tuple[int, ...]) -> dict[str, dict[str, int]]:
    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(copy.deepcopy(BreaksOnItem()).to(device))
    for n in sizes:
        f(torch.ones(n, 8, device=device)).sum().backward()
    return _dynamo_counts()


def test_graph_break_and_recompiles_are_dynamos_as_on_cpu() -> None:
    sizes = (4, 4, 6, 7)  # a break every call; a recompile when the size first changes
    on_cpu = _run_breaks_on_item("cpu", sizes)
    on_sim = _run_breaks_on_item(SIM, sizes)
    assert on_sim == on_cpu
    (reason,) = on_sim["graph_break"]
    assert "Tensor.item()" in reason
    assert on_sim["stats"]["unique_graphs"] == 4  # 2 frames (forward, resume) x 2 shapes


def test_item_in_compiled_forward_is_one_sync_at_its_line() -> None:
    f = torch.compile(copy.deepcopy(BreaksOnItem()).to(SIM))
    x = torch.ones(4, 8, device=SIM)
    with perf.count_syncs(
        SIM
    ) as s:  # compiles inside the block: the compiler's reads are not counted
        for _ in range(3):
            f(x)
    assert s.by_op == {"item": 3}
    (site,) = s.by_site
    assert site.endswith(".py:" + str(BreaksOnItem.forward.__code__.co_firstlineno + 2))
    assert s.site_code[site] == "if y.sum().item() > 0:  # a graph break, and a sync on a device"


def test_shape_change_recompiles_once_then_runs_dynamic_as_on_cpu() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sin().sum(0)

    results = []
    for device in ("cpu", SIM):
        torch._dynamo.reset()
        counters.clear()
        g = torch.compile(f)
        outs = [g(torch.ones(n, 3, device=device)).cpu() for n in (4, 5, 6, 7)]
        results.append((_dynamo_counts(), outs))
    (cpu_counts, cpu_outs), (sim_counts, sim_outs) = results
    assert sim_counts == cpu_counts
    assert sim_counts["stats"]["unique_graphs"] == 2  # static, then one dynamic graph
    for a, b in zip(sim_outs, cpu_outs, strict=True):
        torch.testing.assert_close(a, b)


def test_device_to_host_copy_inside_a_compiled_graph_is_counted() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        return y + 1, y.cpu()  # in the graph: Inductor issues a blocking copy_ on CUDA

    g = torch.compile(f)
    x = torch.ones(3, device=SIM)
    g(x)
    with perf.count_syncs(SIM) as s, perf.count_transfers() as t:
        out, host = g(x)
    assert (out.device, host.device) == (SIM, torch.device("cpu"))
    assert s.by_op == {"d2h_copy": 1}
    assert (t.d2h_copies, t.d2h_bytes, t.h2d_copies) == (1, 12, 0)
    (site,) = s.by_site
    assert site.rsplit(":", 1)[0].endswith("test_sim_compile.py")


@pytest.mark.parametrize(
    "options",
    [
        {"mode": "reduce-overhead"},
        {"mode": "max-autotune-no-cudagraphs"},
        {"fullgraph": True},
        {"dynamic": True},
    ],
    ids=["reduce-overhead", "max-autotune-no-cudagraphs", "fullgraph", "dynamic"],
)
def test_compile_options_work_on_sim(options: dict[str, Any]) -> None:
    model = _mlp().to(SIM)
    f = torch.compile(model, **options)
    for n in (5, 6):
        x = torch.randn(n, 16)
        out = f(x.to(SIM))
        out.sum().backward()
        torch.testing.assert_close(
            out.detach().cpu(), model(x.to(SIM)).detach().cpu(), rtol=1e-5, atol=1e-5
        )
    assert counters["stats"]["unique_graphs"] == (1 if options.get("dynamic") else 2)


def test_fullgraph_reports_a_graph_break_as_on_cpu() -> None:
    errors = []
    for device in ("cpu", SIM):
        torch._dynamo.reset()
        f = torch.compile(copy.deepcopy(BreaksOnItem()).to(device), fullgraph=True)
        with pytest.raises(torch._dynamo.exc.TorchDynamoException) as e:
            f(torch.ones(4, 8, device=device))
        errors.append((type(e.value), str(e.value).split("\n")[0]))
    assert errors[0] == errors[1]
    assert "data-dependent" in errors[1][1]


def test_cpu_graphs_still_go_to_inductor() -> None:
    f = torch.compile(lambda x: (x * 2).sin())
    assert sim_compile.installed()
    torch._inductor.metrics.reset()
    f(torch.ones(4))
    assert torch._inductor.metrics.generated_kernel_count > 0  # Inductor generated CPU code
    torch._inductor.metrics.reset()
    f(torch.ones(4, device=SIM))
    assert counters["stats"]["unique_graphs"] == 2  # the sim graph was captured...
    assert torch._inductor.metrics.generated_kernel_count == 0  # ...and runs op by op


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_compiled_amp_step_with_grad_scaler_counts_one_read_per_step(dtype: torch.dtype) -> None:
    model = _mlp().to(SIM)
    f = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("sim", enabled=dtype == torch.float16)
    xs = [torch.randn(8, 16, generator=torch.Generator().manual_seed(i)) for i in range(STEPS)]
    with perf.count_syncs(SIM) as s, perf.count_transfers() as t:
        for x in xs:
            with torch.autocast("sim", dtype=dtype):
                out = f(x.to(SIM, non_blocking=True))
                loss = out.float().square().mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    assert out.dtype == dtype  # autocast reached into the compiled graph
    # cuda:0: GradScaler.step reads found_inf once per step (fp16 only); the non-blocking
    # input copies are transfers, not syncs
    assert s.by_op == ({"item": STEPS} if dtype == torch.float16 else {})
    assert (t.h2d_copies, t.non_blocking_h2d_copies, t.d2h_copies) == (STEPS, STEPS, 0)


#: every perf block that installs a dispatch mode (Dynamo refuses to compile under one that
#: does not ignore compile internals, and runs the code eagerly: a different program)
COUNTING_BLOCKS: dict[str, Callable[[], Any]] = {
    "count_transfers+count_syncs": lambda: _both(perf.count_transfers(), perf.count_syncs(SIM)),
    "count_ops": lambda: perf.count_ops(SIM),
    "count_ops(cpu)": lambda: perf.count_ops(),
    "count_flops": lambda: perf.count_flops(),
    "model_gpu_time": lambda: perf.model_gpu_time(SIM),
}


def _both(a: Any, b: Any) -> Any:
    stack = contextlib.ExitStack()
    stack.enter_context(a)
    stack.enter_context(b)
    return stack


@pytest.mark.parametrize("block", list(COUNTING_BLOCKS))
def test_code_compiled_inside_counting_blocks_runs_compiled(block: str) -> None:
    f = torch.compile(lambda x, w: (x @ w).sin().sum(), backend="eager")
    w = torch.ones(4, 4, device=SIM)
    with COUNTING_BLOCKS[block]() as c:
        f(torch.ones(2, 4, device=SIM), w)
    # Dynamo compiled inside the block instead of falling back to eager code (count_ops and
    # count_flops did fall back, until they ignored compile internals too) ...
    assert counters["stats"]["unique_graphs"] == 1
    # ... and the block still saw what the compiled code ran
    if block.startswith("count_ops"):
        assert c.by_op["mm"] == 1
    elif block == "count_flops":
        assert c.total == 2 * 2 * 4 * 4


def test_compiled_flex_attention_is_one_kernel_without_the_eager_paths_sync() -> None:
    """``torch.compile(flex_attention)`` is one Triton kernel on CUDA, forward and backward;
    eager FlexAttention runs its dense implementation, whose ``torch.tensor(-inf,
    device=...)`` is a host-to-device copy, a sync, per call. On ``sim`` the compiled graph
    runs that implementation too, so its sync is left out there, as Inductor's kernel makes
    none; eager code keeps it. Values equal eager ``sim``'s."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention", reason="no FlexAttention")
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 16, device=SIM, requires_grad=True) for _ in range(3))
    compiled = torch.compile(fa.flex_attention)
    compiled(q, k, v)  # compile first
    results = {}
    for name, fn in (("eager", fa.flex_attention), ("compiled", compiled)):
        with warnings.catch_warnings(), perf.count_syncs() as syncs, perf.count_ops() as ops:
            warnings.simplefilter("ignore")  # eager: "called without torch.compile()", once
            out = fn(q, k, v)
            out.sum().backward()
        grad = q.grad.clone()
        q.grad = k.grad = v.grad = None
        results[name] = (syncs.count, ops.by_op["flex_attention"], out.detach().cpu(), grad.cpu())
    assert results["eager"][:2] == (2, 1)  # one copy of -inf forward, one backward
    assert results["compiled"][:2] == (0, 1)
    torch.testing.assert_close(results["compiled"][2], results["eager"][2])
    torch.testing.assert_close(results["compiled"][3], results["eager"][3])
