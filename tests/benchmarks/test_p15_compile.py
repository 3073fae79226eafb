"""P15: a compiled model stays compiled. One graph, no graph breaks, no recompiles across
training steps; a ``.item()`` in ``forward`` is one break at its line; a Python float
learning rate changed every step (by a scheduler) recompiles a compiled optimizer step every
step, a tensor learning rate does not.

The counts are TorchDynamo's (``perf.count_compiles``), identical on every run and device.
Backend: ``torch.compile``'s default (Inductor) on every device (on the simulated device
through ``perf.sim.compile``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import perf
from perf.instruments.sites import frame_site
from perf.workloads.models import mlp


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


@pytest.fixture(scope="module", autouse=True)
def _no_compile_workers_left_behind() -> Iterator[None]:
    """Inductor keeps a pool of compile workers, one process per core up to 32 (16 on the
    H200 runner), which start by importing torch. The next module's CPU timings would run
    beside them: on the H200 the first CPU figures of P1, which runs next, were 350-590x the
    GPU's for a 64x64 matmul and 0.8x at 128 (a likely cause, not proven). Shut the pool down
    with this module."""
    yield
    from torch._inductor import async_compile

    shutdown = getattr(async_compile, "shutdown_compile_workers", None)
    if shutdown is not None:
        shutdown()


class ItemNet(nn.Module):
    """An MLP whose forward normalises by a host read: the classic `.item()` graph break."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp(8, 16, 1, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return y / y.abs().max().item()


def test_compiled_model_stays_one_graph(device: torch.device, perf_metrics) -> None:
    """Five training steps of a compiled MLP: one graph, compiled once, never again."""
    model = mlp(8, 16, 2, 4).to(device)
    compiled = torch.compile(model, backend="inductor")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = torch.randn(16, 8, device=device), torch.randn(16, 4, device=device)

    def step() -> None:
        opt.zero_grad()
        nn.functional.mse_loss(compiled(x), target).backward()
        opt.step()

    with perf.count_compiles() as first:
        step()
    with perf.count_compiles() as later:
        for _ in range(4):
            step()
    first.record(perf_metrics)
    assert (first.graphs, first.graph_breaks, first.recompiles) == (1, 0, 0)
    assert (later.graphs, later.frames, later.graph_breaks, later.recompiles) == (0, 0, 0, 0)


def test_item_in_forward_is_one_break_at_its_line(device: torch.device, perf_metrics) -> None:
    compiled = torch.compile(ItemNet().to(device), backend="inductor")
    x = torch.randn(16, 8, device=device)
    with perf.count_compiles() as c:
        compiled(x).sum().backward()
    c.record(perf_metrics)
    lines, first = inspect.getsourcelines(ItemNet.forward)
    line = first + next(i for i, t in enumerate(lines) if ".item()" in t)
    site = frame_site(inspect.getsourcefile(ItemNet) or "", line, "forward")[0]
    assert (c.graphs, c.graph_breaks) == (2, 1)
    assert c.break_sites == {
        site: {
            "n": 1,
            "function": "forward",
            "code": "return y / y.abs().max().item()",
            "what": "graph break (Unsupported Tensor.item() call with "
            "capture_scalar_outputs=False)",
        }
    }


@pytest.mark.parametrize("lr_kind", ["float", "tensor"])
def test_scheduled_lr_recompiles_a_compiled_step_only_as_a_python_float(
    device: torch.device, perf_metrics, lr_kind: str
) -> None:
    """A scheduler writes a new lr into ``param_groups`` every step. Dynamo guards a Python
    float by value: the compiled ``opt.step`` recompiles at each of the 4 changes of 5 steps.
    A tensor lr (PyTorch's advice for compiled optimizers) is guarded by its metadata only."""
    model = nn.Linear(8, 4).to(device)
    lr = 0.1 if lr_kind == "float" else torch.tensor(0.1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (s + 1))
    # five compiles: aot_eager keeps it quick off CUDA (the counts are Dynamo's, not the backend's)
    backend = "aot_eager" if device.type != "cuda" else "inductor"

    @torch.compile(backend=backend)
    def step() -> None:
        opt.step()

    x = torch.randn(16, 8, device=device)
    with perf.count_compiles() as c:
        for _ in range(5):
            opt.zero_grad()
            model(x).sum().backward()
            step()
            sched.step()
    perf_metrics.record("recompiles", c.recompiles, "count", sites=c.recompile_sites)
    if lr_kind == "float":
        assert c.recompiles == 4
        assert sorted(c.recompile_reasons) == sorted(
            f"self.param_groups[0]['lr'] == {0.1 * (1 / (s + 1))!r}" for s in range(4)
        )
    else:
        assert c.recompiles == 0
