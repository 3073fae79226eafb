"""``perf.model_gpu_time`` on ``sim``: its C++ recorder against the dispatch mode it replaced.

The same programs, modelled both ways (``PERF_GPU_MODEL_RECORDER=0`` is the dispatch mode),
give the same events, op for op and field for field, but where a dispatch mode changes the
program: ATen's composites take their tensor-subclass path while any mode is on (``reshape``
becomes ``view``, a gradient summed in backward is ``add`` not ``add_``), and the ``detach``
inside ``nn.Parameter(t)`` runs below any mode. The recorder sees what runs without a mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _sim import SIM, needs_sim

import perf
from perf.instruments import gpu_model
from perf.instruments.gpu_model import model_gpu_time
from perf.sim import native

needs_recorder = pytest.mark.skipif(
    native.module() is None and native.mode() == "0",
    reason="the recorder is part of sim's C++ path, off here (PERF_SIM_NATIVE=0)",
)


def _both(
    monkeypatch: pytest.MonkeyPatch, program: Callable[[], Any]
) -> tuple[Any, Any, tuple[int, int]]:
    """``program`` modelled by the dispatch mode, then by the recorder (with the recorder's
    fast and Python-routed op counts)."""
    monkeypatch.setenv("PERF_GPU_MODEL_RECORDER", "0")
    torch.manual_seed(0)
    with model_gpu_time(SIM) as by_mode:
        program()
    monkeypatch.setenv("PERF_GPU_MODEL_RECORDER", "1")
    torch.manual_seed(0)
    with model_gpu_time(SIM) as by_recorder:
        program()
    counts = native.module().rec_counts()
    return by_mode, by_recorder, counts


def _no_detach(events: Any) -> list[Any]:
    return [e for e in events if not (e.kind == "host" and e.name == "detach")]


def _iris_training(steps: int = 3, log_every: int = 2) -> None:
    X = torch.randn(120, 4)
    y = torch.randint(0, 3, (120,))
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model.to(SIM)
    opt = torch.optim.Adam(model.parameters(), foreach=True)
    Xs, ys = X.to(SIM), y.to(SIM)
    for step in range(steps):
        loss = torch.nn.functional.cross_entropy(model(Xs), ys)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % log_every == 0:
            loss.item()


def _inference_and_factories() -> None:
    lin = torch.nn.Linear(8, 8).to(SIM)
    x = torch.randn(4, 8, device=SIM)
    with torch.inference_mode():  # linear reaches the model whole: decomposed as on CUDA
        lin(x).relu().sum().item()
    z = torch.zeros(3, device=SIM)
    z.add_(1)  # a wrapped number: not a tensor of the op
    torch.ones_like(z).mul(2.5)
    torch.empty(5, device=SIM)
    torch.arange(6, device=SIM).view(2, 3).t().contiguous()


def _dtypes_and_shapes() -> None:
    a = torch.randn(32, 64, device=SIM, dtype=torch.bfloat16)
    b = torch.randn(64, 16, device=SIM, dtype=torch.bfloat16)
    for _ in range(2):
        a @ b
        a.float() @ b.float()
        torch.addmm(torch.zeros(32, 16, device=SIM), a.float(), b.float(), beta=0.5)
    conv = torch.nn.Conv2d(3, 8, 3).to(SIM)
    conv(torch.randn(2, 3, 16, 16, device=SIM)).mean().backward()
    lstm = torch.nn.LSTM(4, 8).to(SIM)
    lstm(torch.randn(5, 2, 4, device=SIM))[0].sum().backward()


def _copies_and_reads() -> None:
    host = torch.randn(256, 256).pin_memory() if torch.cuda.is_available() else torch.randn(256)
    dev = host.to(SIM, non_blocking=True)
    (dev * 2).sum().item()
    torch.tensor([1.0, 2.0], device=SIM).cpu()
    x = torch.randn(64, device=SIM)
    x[x > 0].sum()
    torch.nonzero(x > 0)
    s = torch.randn(4, 4).to_sparse().to(SIM)
    (s * 2).coalesce()


def _control_flow() -> None:
    x = torch.randn(8, device=SIM)
    torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))


PROGRAMS = {
    "iris training": _iris_training,
    "inference and factories": _inference_and_factories,
    "dtypes and shapes": _dtypes_and_shapes,
    "copies and reads": _copies_and_reads,
    "torch.cond": _control_flow,
}


@needs_sim
@needs_recorder
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_recorder_gives_the_dispatch_modes_events(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    by_mode, by_recorder, (fast, _) = _both(monkeypatch, PROGRAMS[name])
    assert fast > 0, "the recorder did not run"
    assert _no_detach(by_recorder.events) == _no_detach(by_mode.events)
    if by_recorder.events == by_mode.events:
        assert by_recorder.result() == by_mode.result()


@needs_sim
@needs_recorder
def test_the_detach_a_mode_causes_is_no_event_either_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Autograd saves relu's output; with a dispatch mode on, torch detaches it through the
    mode (``TensorImpl::shallow_copy_and_detach``, as for ``.data``): a ``detach`` no run
    without a mode dispatches, and no event. The program's own ``detach`` is one both ways.
    ``nn.Parameter`` detaches its data below any mode: a dispatch the mode misses."""
    w = torch.randn(4, 4, device=SIM, requires_grad=True)

    def forward() -> None:
        torch.relu(w).sum()
        w.data.add_(0)
        w.detach()

    by_mode, by_recorder, _ = _both(monkeypatch, forward)
    names = ["relu", "sum", "add_", "detach"]
    assert [e.name for e in by_mode.events] == names
    assert [e.name for e in by_recorder.events] == names
    assert by_mode.result() == by_recorder.result()

    def parameter() -> None:
        torch.nn.Parameter(torch.ones(2, device=SIM))

    by_mode, by_recorder, _ = _both(monkeypatch, parameter)
    assert [e.name for e in by_mode.events] == ["ones"]
    assert [e.name for e in by_recorder.events] == ["ones", "detach"]


@needs_sim
@needs_recorder
def test_composites_take_the_programs_path_under_the_recorder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``isTensorSubclassLike`` is true for every tensor while a dispatch mode is on
    (docs/instruments.md): ``reshape`` of a viewable slice is ``view`` there and
    ``_reshape_alias`` without a mode, as on CUDA; backward sums a gradient out of place
    there and in place without."""

    def program() -> None:
        x = torch.randn(4, 6, device=SIM, requires_grad=True)
        x[:, :4].reshape(4, 2, 2)
        h = x.exp()
        (h * 2 + h * 3).sum().backward()

    by_mode, by_recorder, _ = _both(monkeypatch, program)
    mode_names = [e.name for e in by_mode.events]
    names = [e.name for e in by_recorder.events]
    assert (mode_names[2], names[2]) == ("view", "_reshape_alias")
    assert (mode_names[12], names[12]) == ("add", "add_")
    differ = [i for i, (a, b) in enumerate(zip(mode_names, names, strict=True)) if a != b]
    assert differ == [2, 12]


@needs_sim
@needs_recorder
def test_common_ops_stay_in_cpp_and_the_rest_goes_to_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A training loop's repeated steps: every op but the copies (the model's and the data's
    to the device), scalar reads and each FLOPs formula's first call with new shapes is a
    C++ row."""
    monkeypatch.setenv("PERF_GPU_MODEL_RECORDER", "1")
    with model_gpu_time(SIM) as t:
        _iris_training(steps=20, log_every=10)
    fast, python = native.module().rec_counts()
    assert fast > 10 * python, (fast, python)
    assert t.launches > 0


@needs_sim
@needs_recorder
def test_a_block_inside_a_recorded_one_uses_the_mode_and_both_agree(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PERF_GPU_MODEL_RECORDER", "1")
    a = torch.randn(16, 16, device=SIM)
    with model_gpu_time(SIM) as outer:
        a.sin()
        with model_gpu_time(SIM) as inner:
            assert isinstance(inner._mode, gpu_model.GpuModelMode)
            assert not isinstance(inner._mode, gpu_model.NativeGpuModel)
            a @ a
        a.cos()
    assert isinstance(outer._mode, gpu_model.NativeGpuModel)
    assert [e.name for e in inner.events] == ["mm"]
    assert [e.name for e in outer.events] == ["sin", "mm", "cos"]


@needs_sim
@needs_recorder
def test_an_error_in_the_block_stops_the_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERF_GPU_MODEL_RECORDER", "1")
    a = torch.randn(4, 4, device=SIM)
    shapes = "mat1 and mat2 shapes cannot be multiplied"
    with pytest.raises(RuntimeError, match=shapes), model_gpu_time(SIM) as t:
        a.sin()
        a @ torch.randn(3, 3, device=SIM)
    assert [e.name for e in t.events if e.kind == "kernel"] == ["sin", "randn"]
    mod = native.module()
    assert mod.rec_include(False) is False  # the thread's dispatch keys are as before
    with perf.count_ops() as ops:  # nothing is recorded any more
        a.cos()
    assert ops.count == 1
    assert gpu_model._recorder("sim") is mod


def test_the_recorder_is_sims_only_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpu_model._recorder("cuda") is None
    monkeypatch.setenv("PERF_GPU_MODEL_RECORDER", "0")
    assert gpu_model._recorder("sim") is None


@needs_sim
@needs_recorder
def test_compiled_code_recompiles_for_the_recorder_and_count_compiles_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dynamo's tensor guards read the thread's dispatch keys, to which the recorder adds its
    own: code compiled outside the block compiles again inside it. ``count_compiles``
    reports that compile as perf's, not the program's; the events are the mode's."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() * 2).sum()

    x = torch.randn(64, device=SIM)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(f, backend="eager")
        compiled(x)
        monkeypatch.setenv("PERF_GPU_MODEL_RECORDER", "0")
        with model_gpu_time(SIM) as by_mode:
            compiled(x)
        monkeypatch.setenv("PERF_GPU_MODEL_RECORDER", "1")
        with perf.count_compiles() as cc, model_gpu_time(SIM) as by_recorder:
            compiled(x)
            compiled(x)
    finally:
        torch._dynamo.reset()
    assert [e.name for e in by_mode.events] == ["sin", "mul", "sum"]
    assert by_recorder.events == by_mode.events * 2
    assert (cc.recompiles, cc.graphs, cc.frames) == (0, 0, 0)
    assert [fn for fn, _ in cc.instrument_recompiles] == ["f"]


@needs_sim
@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo (sim's process group rides it)",
)
def test_ddps_all_reduce_is_a_collective_event_both_ways(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """``sim``'s process group is Python and dispatches no ``c10d`` op, so neither the mode
    nor the recorder saw DDP's bucket all-reduce: the model left it out. It now hears of
    each collective from the group: one all-reduce of the bucket's bytes a step, ring-timed
    (one rank: the minimum kernel time, under the host's launch cost)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perf.instruments.gpu_targets import get_target

    dist.init_process_group(init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        runs = {}
        for recorder in ("0", "1"):
            monkeypatch.setenv("PERF_GPU_MODEL_RECORDER", recorder)
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to(SIM)
            ddp = DDP(model, device_ids=[0], bucket_cap_mb=1)
            x = torch.randn(4, 8, device=SIM)
            for _ in range(2):  # the reducer rebuilds its buckets at the second step
                ddp(x).sum().backward()
            with model_gpu_time(SIM) as t:
                ddp(x).sum().backward()
            runs[recorder] = t
    finally:
        dist.destroy_process_group()
    by_mode, by_recorder = runs["0"], runs["1"]
    assert by_recorder.events == by_mode.events
    coll = [e for e in by_recorder.events if e.kind == "collective"]
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert [(e.name, e.nbytes, e.world_size) for e in coll] == [("allreduce", n_bytes, 1)]
    h100 = get_target("H100 SXM")
    assert by_recorder.result().by_op["allreduce"] == h100.host_op_s  # launch-bound


@needs_sim
def test_a_taken_dispatch_key_falls_back_to_the_mode_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch 2.13 registers nothing at the recorder's key; a later torch might (its C++ fake
    tensors). Registration then fails, and the model runs as a dispatch mode, once warned."""

    class Taken:
        def rec_register(self) -> None:
            raise RuntimeError("another fallback is registered at the Fake dispatch key")

    monkeypatch.setenv("PERF_GPU_MODEL_RECORDER", "1")
    monkeypatch.setattr(native, "module", lambda: Taken())
    monkeypatch.setattr(gpu_model, "_unavailable", None)
    a = torch.randn(4, 4, device=SIM)
    unavailable = "recorder is unavailable .*another fallback"
    with pytest.warns(RuntimeWarning, match=unavailable), model_gpu_time(SIM) as t:
        a @ a
    assert type(t._mode) is gpu_model.GpuModelMode
    assert [e.name for e in t.events] == ["mm"]
    with model_gpu_time(SIM) as t:  # once: no second warning (pytest's -W error would raise)
        a @ a
    assert type(t._mode) is gpu_model.GpuModelMode


@needs_sim
@needs_recorder
def test_what_dynamo_runs_while_it_recompiles_for_the_recorder_is_no_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inductor's compile copies a constant to the device and clones and lifts tensors on it
    (a sync and eight ops here), which no step of the program runs; Dynamo takes dispatch
    modes off the stack while it compiles, and the recorder pauses. A recompile inside the
    block (the recorder's key) therefore adds nothing to the model; the next block
    compiles nothing."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.register_buffer("mask", torch.tril(torch.ones(4, 4)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scale = torch.tensor(0.5, device=x.device)
            return self.lin(x).softmax(-1) * scale + self.mask.sum()

    x = torch.randn(4, 8, device=SIM)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(Net().to(SIM).eval())
        with torch.no_grad():
            compiled(x)
            monkeypatch.setenv("PERF_GPU_MODEL_RECORDER", "0")
            with model_gpu_time(SIM) as by_mode:
                compiled(x)
            monkeypatch.setenv("PERF_GPU_MODEL_RECORDER", "1")
            with perf.count_compiles() as first, model_gpu_time(SIM) as by_recorder:
                compiled(x)
            with perf.count_compiles() as second, model_gpu_time(SIM) as again:
                compiled(x)
    finally:
        torch._dynamo.reset()
    assert by_recorder.events == by_mode.events == again.events
    assert "addmm" in [e.name for e in by_mode.events]
    assert (len(first.instrument_recompiles), first.recompiles) == (1, 0)
    assert (len(second.instrument_recompiles), second.recompiles, second.frames) == (0, 0, 0)
