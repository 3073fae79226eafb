"""Leaks named by their line: the four classic patterns are caught on ``sim``, a clean loop
reports 0 growth over 100 steps."""

from __future__ import annotations

import gc
import inspect

import pytest
import torch
from _sim import needs_sim

import perf
from perf.instruments.leaks import memory_growth
from perf.sim import memory as simmem


@pytest.fixture
def sim():
    d = perf.simulated_device()
    gc.collect()
    simmem.reset(forget_live=True)  # a new process's view
    return d


def _line(fn, marker: str) -> str:
    """``path:line`` of the line of ``fn``'s source that holds ``marker``."""
    lines, start = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if marker in text:
            return f"{inspect.getsourcefile(fn)}:{start + i}"
    raise AssertionError(marker)


def _site_paths(g):
    import os

    return [
        os.path.abspath(s.site.rsplit(":", 1)[0]) + ":" + s.site.rsplit(":", 1)[1] for s in g.sites
    ]


def _model(sim):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    ).to(sim)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32, device=sim)
    return model, opt, x


@needs_sim
def test_clean_training_loop_grows_zero_over_100_steps(sim):
    model, opt, x = _model(sim)
    logged = []

    def step():
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        logged.append(loss.item())  # a Python float: no device memory kept

    g = memory_growth(step, sim, steps=100, warmup=2)
    assert g.growth_bytes == 0 and g.growth_bytes_per_step == 0
    assert g.sites == () and set(g.per_step_bytes) == {0}


@needs_sim
def test_loss_history_append_keeps_each_loss(sim):
    model, opt, x = _model(sim)
    history = []

    def step():
        opt.zero_grad()
        loss = model(x).pow(2).mean()  # LOSS
        loss.backward()
        opt.step()
        history.append(loss)  # the bug: loss.item() was meant

    g = memory_growth(step, sim, steps=10)
    assert g.per_step_bytes == (512,) * 10  # one 4-byte scalar: a 512-byte block each step
    assert _site_paths(g) == [_line(step, "# LOSS")]
    s = g.sites[0]
    assert (s.function, s.code, s.grown_bytes, s.grown_blocks) == (
        "step",
        "loss = model(x).pow(2).mean()  # LOSS",
        5120,
        10,
    )


@needs_sim
def test_total_loss_plus_equals_keeps_every_graph(sim):
    model, _, x = _model(sim)
    total = {"loss": 0.0}

    def step():  # an evaluation loop without torch.no_grad()
        loss = model(x).pow(2).mean()  # FORWARD
        total["loss"] += loss  # the bug: keeps every step's graph and its activations

    g = memory_growth(step, sim, steps=10)
    # each graph keeps what autograd saved: ReLU's output (16x64 fp32, 4 KiB, saved by ReLU
    # and as Linear 2's input) and Linear 2's output (16x1: a 512 B block, saved by pow)
    assert g.per_step_bytes == (4096 + 512,) * 10
    assert _site_paths(g) == [_line(step, "# FORWARD")]
    assert "+=" not in g.sites[0].code


@needs_sim
def test_cache_dict_of_device_tensors(sim):
    model, _, x = _model(sim)
    cache = {}
    n = {"i": 0}

    def step():
        with torch.no_grad():
            n["i"] += 1
            cache[n["i"]] = model[0](x) * 2  # CACHE

    g = memory_growth(step, sim, steps=5)
    assert g.per_step_bytes == (4096,) * 5
    assert _site_paths(g) == [_line(step, "# CACHE")]


@needs_sim
def test_hook_list_that_grows(sim):
    model, opt, x = _model(sim)
    means = []

    def step():
        opt.zero_grad()
        model.register_forward_hook(lambda m, i, o: means.append(o.mean()))  # HOOK
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()

    g = memory_growth(step, sim, steps=4, warmup=1)
    # step k runs k + 1 hooks: each keeps a 512-byte scalar (and its graph of one view)
    assert g.per_step_bytes == (1024, 1536, 2048, 2560)
    assert _site_paths(g) == [_line(step, "# HOOK")]


@needs_sim
def test_sites_reach_metric_extra_and_describe(sim):
    keep = []

    def step():
        keep.append(torch.ones(10, device=sim))  # KEEP

    g = memory_growth(step, sim, steps=3, warmup=0)
    assert g.growth_bytes_per_step == 512
    (site,) = g.sites_extra.values()
    assert site == {
        "n": 1536,
        "function": "step",
        "code": "keep.append(torch.ones(10, device=sim))  # KEEP",
    }
    assert "+1536 bytes in 3 blocks" in g.describe()


def test_memory_growth_refuses_cpu():
    with pytest.raises(ValueError, match="simulated_device"):
        memory_growth(lambda: None, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the real allocator)")
def test_memory_growth_on_cuda_names_the_line():
    keep = []

    def step():
        keep.append(torch.ones(10, device="cuda"))  # KEEP

    g = memory_growth(step, "cuda", steps=3, warmup=0)
    assert g.growth_bytes_per_step == 512
    assert _site_paths(g) == [_line(step, "# KEEP")]


@needs_sim
def test_memory_growth_leaves_a_running_history_recording_running(sim):
    """The failure-snapshot plugin records the history while a perf_memory test runs; a
    memory_growth inside it must not stop (or cut) that recording."""
    from perf.instruments.memviz import memory_snapshot, recording, stop_recording

    keep = []
    with recording(sim):
        torch.ones(4, device=sim)
        before = len(memory_snapshot(sim)["device_traces"][0])
        memory_growth(lambda: keep.append(torch.ones(10, device=sim)), sim, steps=2, warmup=0)
        during = len(memory_snapshot(sim)["device_traces"][0])
        keep.append(torch.ones(10, device=sim))  # still recorded afterwards
        after = len(memory_snapshot(sim)["device_traces"][0])
    stop_recording(sim)
    assert before < during < after


def _seg(device, blocks):
    return {"device": device, "blocks": blocks}


def _blk(size, state="active_allocated", line=7):
    return {
        "size": size,
        "state": state,
        "frames": [{"filename": "/x/train.py", "line": line, "name": "step"}],
    }


def test_census_reads_only_the_measured_devices_segments():
    from perf.instruments.leaks import census_from_snapshot

    snap = {
        "segments": [
            _seg(0, [_blk(512), _blk(1024, "inactive")]),
            _seg(1, [_blk(2048), _blk(512, line=9)]),
            _seg(0, [_blk(512)]),
        ]
    }
    on0 = census_from_snapshot(snap, 0)
    on1 = census_from_snapshot(snap, 1)
    assert [v for v in on0.values()] == [[1024, 2]]  # device 1's blocks are not device 0's
    assert sorted(v[0] for v in on1.values()) == [512, 2048]
    assert census_from_snapshot(snap, 2) == {}


class _FakeHistory:
    """torch._C._cuda_isHistoryEnabled / torch.cuda.memory._record_memory_history."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.calls: list[dict] = []

    def is_enabled(self) -> bool:
        return self.enabled

    def record(self, **kw) -> None:
        self.calls.append(kw)
        self.enabled = kw.get("enabled", "all") is not None


def test_cuda_history_leaves_a_running_recording_alone():
    from perf.instruments.leaks import cuda_history

    h = _FakeHistory(enabled=True)
    with cuda_history(h.is_enabled, h.record) as started:
        assert not started
    assert h.calls == [] and h.enabled


def test_cuda_history_starts_and_stops_its_own_even_on_error():
    from perf.instruments.leaks import cuda_history

    h = _FakeHistory(enabled=False)
    with (
        pytest.raises(RuntimeError, match="step failed"),
        cuda_history(h.is_enabled, h.record) as started,
    ):
        assert started and h.enabled
        raise RuntimeError("step failed")
    assert h.calls == [{"max_entries": 1, "stacks": "python"}, {"enabled": None}]
    assert not h.enabled
