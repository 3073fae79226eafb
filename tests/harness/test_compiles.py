"""perf.count_compiles: exact graphs / graph breaks / recompiles, each break named by its line.

Each pattern runs on ``cpu`` and on the simulated accelerator. The backend is ``aot_eager``
(fast; Dynamo's counts come from Dynamo, not from the backend); one test checks the default
Inductor backend gives the same counts on both devices.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

# installed at import, before any backward of the process (autograd fixes its devices then)
from _sim import SIM, needs_sim

import perf
from perf.instruments.compiles import CompileCount, break_label, recompile_label, user_function
from perf.instruments.sites import frame_site

BACKEND = "aot_eager"


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(params=["cpu", "sim"])
def dev(request: pytest.FixtureRequest) -> torch.device:
    if request.param == "cpu":
        return torch.device("cpu")
    return SIM


def _site(fn: Callable[..., Any], text: str) -> str:
    """``"path.py:N"`` of the line of ``fn`` containing ``text`` (as count_compiles names it)."""
    lines, first = inspect.getsourcelines(fn)
    hits = [first + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, (text, hits)
    return frame_site(inspect.getsourcefile(fn) or "", hits[0], fn.__name__)[0]


class Clean(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(8, 8)
        self.l2 = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x)))


class Branch(Clean):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.l1(x)
        if y.sum() > 0:
            y = torch.relu(y)
        return self.l2(y)


class Item(Clean):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.l1(x)
        scale = y.abs().max().item()
        return self.l2(y / scale)


class Print(Clean):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.l1(x)
        print("forward")
        return self.l2(y)


def _train(
    model: torch.nn.Module, dev: torch.device, steps: int = 3, **compile_kw: Any
) -> CompileCount:
    torch.manual_seed(0)
    model = model.to(dev)
    compiled = torch.compile(model, backend=compile_kw.pop("backend", BACKEND), **compile_kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, device=dev)
    with perf.count_compiles() as c:
        for _ in range(steps):
            opt.zero_grad()
            compiled(x).sum().backward()
            opt.step()
    return c.result()


@needs_sim
def test_clean_model_is_one_graph_and_stays_one(dev: torch.device) -> None:
    c = _train(Clean(), dev, steps=4)
    assert (c.graphs, c.frames, c.graph_breaks, c.recompiles) == (1, 1, 0, 0)
    assert c.break_sites == {} and c.recompile_reasons == {}
    assert c.compile_s > 0 and c.compile_s >= c.dynamo_s


@needs_sim
def test_data_dependent_branch_is_one_break_at_its_line(dev: torch.device) -> None:
    c = _train(Branch(), dev)
    site = _site(Branch.forward, "if y.sum() > 0:")
    assert (c.graphs, c.graph_breaks, c.recompiles) == (2, 1, 0)
    assert c.break_reasons == {"Data-dependent branching": 1}
    assert c.break_sites == {
        site: {
            "n": 1,
            "function": "forward",
            "code": "if y.sum() > 0:",
            "what": "graph break (Data-dependent branching)",
        }
    }


@needs_sim
def test_item_in_forward_is_one_break_at_its_line(dev: torch.device) -> None:
    c = _train(Item(), dev)
    site = _site(Item.forward, ".item()")
    # The scalar read is passed to the rest of forward (a resume function) as a Python float:
    # its value changes after the first optimizer step, which recompiles once (then Dynamo's
    # automatic dynamic makes it a symbol). One break, three graphs, one recompile.
    assert (c.graphs, c.graph_breaks, c.recompiles) == (3, 1, 1)
    # Dynamo names the float after its place on the resume function's stack.
    [why] = c.recompile_reasons
    assert why.startswith("___stack0 == ")
    # the resume function starts at the break and is named after forward
    assert list(c.recompile_sites) == [site]
    assert c.recompile_sites[site]["function"] == "forward"
    label = "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    assert c.break_reasons == {label: 1}
    assert list(c.break_sites) == [site]
    assert c.break_sites[site]["code"] == "scale = y.abs().max().item()"
    assert c.break_sites[site]["function"] == "forward"


@needs_sim
def test_print_in_forward_is_one_break_at_its_line(dev: torch.device, capsys: Any) -> None:
    c = _train(Print(), dev)
    assert capsys.readouterr().out.count("forward") == 3  # print still runs, eagerly
    site = _site(Print.forward, 'print("forward")')
    assert (c.graphs, c.graph_breaks, c.recompiles) == (2, 1, 0)
    assert c.break_reasons == {"Failed to trace builtin operator": 1}
    assert list(c.break_sites) == [site]


def _sgd_step(p: torch.Tensor, g: torch.Tensor, lr: float | torch.Tensor) -> torch.Tensor:
    return p - lr * g


@needs_sim
def test_python_float_lr_changed_every_step_recompiles(dev: torch.device) -> None:
    f = torch.compile(_sgd_step, backend=BACKEND)
    p, g = torch.ones(4, device=dev), torch.ones(4, device=dev)
    with perf.count_compiles() as c:
        for i in range(5):
            f(p, g, 0.1 / (i + 1))
    # The first change fails the guard `lr == 0.1`; Dynamo's automatic dynamic then makes lr
    # a symbol, so the later changes reuse the second graph.
    assert (c.graphs, c.graph_breaks, c.recompiles) == (2, 0, 1)
    assert c.recompile_reasons == {"lr == 0.1": 1}
    site = _site(_sgd_step, "def _sgd_step")
    assert c.recompile_sites[site]["what"] == "recompile (lr == 0.1)"
    assert c.recompile_sites[site]["n"] == 1


@needs_sim
def test_python_float_lr_without_automatic_dynamic_recompiles_every_step(
    dev: torch.device,
) -> None:
    f = torch.compile(_sgd_step, backend=BACKEND, dynamic=False)
    p, g = torch.ones(4, device=dev), torch.ones(4, device=dev)
    with perf.count_compiles() as c:
        for i in range(5):
            f(p, g, 0.1 / (i + 1))
    assert (c.graphs, c.recompiles) == (5, 4)
    assert sum(c.recompile_reasons.values()) == 4
    site = c.recompile_sites[_site(_sgd_step, "def _sgd_step")]
    assert (site["n"], site["what"]) == (4, "recompile (lr == 0.1) and 3 others")


@needs_sim
def test_tensor_lr_does_not_recompile(dev: torch.device) -> None:
    f = torch.compile(_sgd_step, backend=BACKEND)
    p, g = torch.ones(4, device=dev), torch.ones(4, device=dev)
    with perf.count_compiles() as c:
        for i in range(5):
            f(p, g, torch.tensor(0.1 / (i + 1), device=dev))
    assert (c.graphs, c.graph_breaks, c.recompiles) == (1, 0, 0)


def _head(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x).sum(dim=1)


@needs_sim
@pytest.mark.parametrize(
    ("dynamic", "graphs", "recompiles"),
    [(None, 2, 1), (True, 1, 0), (False, 4, 3)],
    ids=["automatic", "dynamic", "static"],
)
def test_changing_shapes(
    dev: torch.device, dynamic: bool | None, graphs: int, recompiles: int
) -> None:
    f = torch.compile(_head, backend=BACKEND, dynamic=dynamic)
    with perf.count_compiles() as c:
        for n in (2, 3, 4, 5):
            f(torch.ones(n, 3, device=dev))
    assert (c.graphs, c.graph_breaks, c.recompiles) == (graphs, 0, recompiles)
    if recompiles:
        assert next(iter(c.recompile_reasons)) == (
            "tensor 'x' size mismatch at index 0. expected 2, actual 3"
        )


@needs_sim
def test_count_syncs_around_compiled_code_adds_no_compile(dev: torch.device) -> None:
    """``count_syncs`` pushes a torch-function mode and Dynamo guards on that stack: each
    frame first run inside it (``forward`` and the resume function after its break)
    recompiles once, which the program without perf never does. Those compiles are reported
    apart and left out of the counts, so a gate of 0 recompiles holds under ``count_syncs``."""
    torch.manual_seed(0)
    compiled = torch.compile(Branch().to(dev), backend=BACKEND)
    x = torch.randn(4, 8, device=dev)
    compiled(x).sum().backward()
    with perf.count_compiles() as c, perf.count_syncs(dev, host_as_device=dev.type == "cpu"):
        for _ in range(2):
            compiled(x).sum().backward()
    assert (c.graphs, c.frames, c.graph_breaks, c.recompiles) == (0, 0, 0, 0)
    assert (c.recompile_reasons, c.break_sites, c.compiles, c.compile_s) == ({}, {}, (), 0.0)
    assert [f for f, _ in c.instrument_recompiles] == ["forward", "forward"]
    with perf.count_compiles() as plain:  # the program's own cache entries are still there
        compiled(x).sum().backward()
    assert (plain.graphs, plain.recompiles, plain.instrument_recompiles) == (0, 0, ())


@needs_sim
def test_code_first_compiled_inside_count_syncs_adds_no_compile_after_it(
    dev: torch.device,
) -> None:
    """The other way round: a first call (a warm-up) inside ``count_syncs`` compiles with its
    mode on the stack, and the next call outside recompiles for the mode's absence, which
    the program without perf never does. Set apart as well."""
    f = torch.compile(_head, backend=BACKEND)
    x = torch.ones(2, 3, device=dev)
    with perf.count_syncs(dev, host_as_device=dev.type == "cpu"):
        f(x)
    with perf.count_compiles() as c:
        for _ in range(3):
            f(x)
    assert (c.graphs, c.frames, c.recompiles, c.compiles) == (0, 0, 0, ())
    assert [fn for fn, _ in c.instrument_recompiles] == ["_head"]


@needs_sim
def test_a_recompile_the_program_needs_counts_under_count_syncs(dev: torch.device) -> None:
    """A new shape met for the first time inside ``count_syncs`` recompiles the program too:
    it counts, with its reason (the mode stack, Dynamo's first failed guard of the entry)."""
    f = torch.compile(_head, backend=BACKEND, dynamic=False)
    f(torch.ones(2, 3, device=dev))
    with perf.count_compiles() as c, perf.count_syncs(dev, host_as_device=dev.type == "cpu"):
        f(torch.ones(5, 3, device=dev))
    assert (c.graphs, c.recompiles, c.instrument_recompiles) == (1, 1, ())


def test_only_compilation_is_counted() -> None:
    f = torch.compile(_head, backend=BACKEND)
    x = torch.ones(2, 3)
    f(x)
    with perf.count_compiles() as c:
        for _ in range(10):
            f(x)
    assert (c.graphs, c.frames, c.graph_breaks, c.recompiles) == (0, 0, 0, 0)
    assert c.compile_s == 0.0


def test_live_while_inside_frozen_after() -> None:
    f = torch.compile(_head, backend=BACKEND)
    with perf.count_compiles() as c:
        assert c.graphs == 0
        f(torch.ones(2, 3))
        assert c.graphs == 1
        f(torch.ones(2, 3, dtype=torch.float64))
    assert c.result().recompiles == 1
    f(torch.ones(2, 3, dtype=torch.float16))
    assert c.recompiles == 1  # frozen


def test_nested_blocks_count_their_own_compiles() -> None:
    f = torch.compile(_head, backend=BACKEND)
    with perf.count_compiles() as outer:
        f(torch.ones(2, 3))
        with perf.count_compiles() as inner:
            f(torch.ones(2, 3, dtype=torch.float64))
    assert (outer.graphs, outer.recompiles) == (2, 1)
    assert (inner.graphs, inner.recompiles) == (1, 1)


def test_more_compiles_than_dynamo_keeps_records_of(tmp_path: Path) -> None:
    import importlib.util

    import torch._dynamo.utils as utils

    limit = utils._compilation_metrics.maxlen
    fs = []
    for k in range(limit + 6):  # distinct code objects: distinct frames, no recompiles
        # from a file: torch 2.11 wraps a function without a source file (exec's) in one
        # shared frame, which recompiles and stops at Dynamo's recompile limit
        path = tmp_path / f"f{k}.py"
        path.write_text(f"def f{k}(x):\n    return x * {k}\n")
        spec = importlib.util.spec_from_file_location(f"perf_test_f{k}", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        fs.append(torch.compile(getattr(mod, f"f{k}"), backend="eager"))
    with perf.count_compiles() as c:
        for f in fs:
            f(torch.ones(2))
    assert c.frames == limit + 6
    assert len(c.compiles) == limit + 6
    assert utils._compilation_metrics.maxlen == limit  # restored


def test_a_kernel_tuned_at_its_first_run_is_not_a_reset() -> None:
    """Inductor on CUDA tunes a Triton kernel at its first run and records that under the
    compile's id (``is_runtime``): the same frame id again, which is not Dynamo's frame
    counter restarting (an H200 run raised "records were cleared" on every compiled test).
    Recorded here as Inductor's autotuner records it."""
    from torch._dynamo.utils import dynamo_timed, get_runtime_metrics_context
    from torch._guards import CompileId

    f = torch.compile(_head, backend=BACKEND)
    with perf.count_compiles() as c:
        f(torch.ones(2, 3))
        frame = int(c.compiles[0][1].split("/")[0])
        with dynamo_timed(
            "CachingAutotuner.benchmark_all_configs",
            log_pt2_compile_event=True,
            dynamo_compile_column_us="runtime_triton_autotune_time_us",
            compile_id=CompileId(frame_id=frame, frame_compile_id=0),
            is_backward=False,
        ):
            pass
        get_runtime_metrics_context().finish()
    assert (c.graphs, c.frames, len(c.compiles)) == (1, 1, 1)


def test_reset_inside_the_block_is_a_clear_error() -> None:
    f = torch.compile(_head, backend=BACKEND)
    with (
        pytest.raises(RuntimeError, match=r"reset before entering the block"),
        perf.count_compiles(),
    ):
        f(torch.ones(2, 3))
        torch._dynamo.reset()
        f(torch.ones(2, 3))


def test_break_in_a_called_function_is_named_by_its_line() -> None:
    """Dynamo breaks twice for one break inside a called function: the caller's graph ends at
    the call, then the callee's frame is compiled on its own and breaks at the line. Both
    records name the callee's line."""

    def helper(y: torch.Tensor) -> torch.Tensor:
        return y * y.sum().item()

    def fn(x: torch.Tensor) -> torch.Tensor:
        return helper(x + 1) - 1

    with perf.count_compiles() as c:
        torch.compile(fn, backend=BACKEND)(torch.ones(3))
    assert (c.graphs, c.frames, c.graph_breaks) == (4, 4, 2)
    assert list(c.break_sites) == [_site(helper, "return y * y.sum().item()")]
    assert c.break_sites[_site(helper, "return y")]["function"] == "helper"
    assert c.break_sites[_site(helper, "return y")]["n"] == 2


@needs_sim
def test_default_inductor_backend_gives_the_same_counts(dev: torch.device) -> None:
    c = _train(Branch(), dev, steps=2, backend="inductor")
    assert (c.graphs, c.graph_breaks, c.recompiles) == (2, 1, 0)
    assert list(c.break_sites) == [_site(Branch.forward, "if y.sum() > 0:")]
    assert c.compile_s >= c.dynamo_s + c.aot_s + c.backend_s - 1e-6


def test_labels() -> None:
    assert user_function("torch_dynamo_resume_in_forward_at_57") == "forward"
    assert user_function("torch_dynamo_resume_in_torch_dynamo_resume_in_f_at_3_at_9") == "f"
    assert user_function("forward") == "forward"
    assert break_label("generic_jump TensorVariable()") == "Data-dependent branching"
    assert break_label("Unsupported Tensor.item() call\n  Explanation: ...") == (
        "Unsupported Tensor.item() call"
    )
    reason = "0/0: lr == 0.1                     # return p - lr * g  # m.py:23 in step\nUser stack"
    assert recompile_label(reason) == "lr == 0.1"
    assert recompile_label("3/1: tensor 'x' size mismatch at index 0. expected 2, actual 3") == (
        "tensor 'x' size mismatch at index 0. expected 2, actual 3"
    )


def test_records_counts_with_sites(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_rec="""
        import torch, perf

        def f(x):
            if x.sum() > 0:
                x = x + 1
            return x * 2

        def test_it(perf_metrics):
            torch._dynamo.reset()
            with perf.count_compiles() as c:
                torch.compile(f, backend="aot_eager")(torch.ones(3))
            c.record(perf_metrics)
            got = {m.name: m for m in perf_metrics.recorded}
            assert got["graph_breaks"].value == 1 and got["graph_breaks"].kind == "count"
            assert got["graph_breaks"].extra["sites"]["test_rec.py:4"]["n"] == 1
            assert got["graphs"].value == 2 and got["recompiles"].value == 0
            # compile time only when asked, and of its own kind: never a timing (issue 28)
            assert "compile_s" not in got
            c.record(perf_metrics, prefix="t_", compile_time=True)
            got = {m.name: m for m in perf_metrics.recorded}
            assert got["t_compile_s"].kind == "compile"
            assert got["t_compile_s"].extra["cache"] in ("cold", "warm", "mixed", "none")
        """
    )
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_torch_without_the_bookkeeping_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another torch version lacks what is read: say which record and which torch is tested."""
    import torch._dynamo.utils as utils

    monkeypatch.delattr(utils, "graph_break_reasons")
    with pytest.raises(RuntimeError, match=r"graph_break_reasons.*tested: 2\.13\.0"):
        perf.count_compiles().__enter__()
