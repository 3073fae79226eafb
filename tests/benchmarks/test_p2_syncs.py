"""P2: host-device syncs scale with logging frequency.

The seed logs ``loss.item()`` every 1000th of 20000 steps and wonders why the time barely moves.
The count is the exact part: ``floor(N / k)`` syncs for N steps logged every k-th, whatever the
optimizer implementation, on any accelerator: on CUDA, and on the simulated device of CPU-only
boxes (``sim``), which gives the same counts. The CPU itself is the host, where no host-device
sync exists: those parametrizations skip. On CUDA the time cost of logging every step is
measured as a paired ratio.
"""

from __future__ import annotations

import pytest
import torch
from suite_support import cuda_debug_syncs, require

import perf
from perf.workloads.data import iris_split
from perf.workloads.loops import train_loop
from perf.workloads.models import mlp

STEPS = 100
ADAM_VARIANTS = {
    "for_loop": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


HOST_SKIP_REASON = (
    "host-device syncs need a device: the CPU is the host (this property runs on the `sim` "
    "and `cuda` parametrizations)"
)


def _skip_host(device: torch.device) -> None:
    if device.type == "cpu":
        pytest.skip(HOST_SKIP_REASON)


def _iris_setup(device: torch.device, variant: str) -> tuple:
    X, y, _, _ = iris_split(device=device)
    model = mlp(4, 16, 1, 3).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, **ADAM_VARIANTS[variant])
    return model, opt, X, y


@pytest.mark.parametrize("variant", list(ADAM_VARIANTS))
@pytest.mark.parametrize("log_every", [1, 3, 7, 10, 33, 100, 1000])
def test_syncs_scale_with_logging_frequency(device, variant, log_every, perf_metrics):
    _skip_host(device)
    model, opt, X, y = _iris_setup(device, variant)
    train_loop(model, opt, X, y, steps=2, log_every=0)  # optimizer state exists before counting
    with perf.count_syncs(device) as syncs:
        logged = train_loop(model, opt, X, y, steps=STEPS, log_every=log_every)
    perf_metrics.record("syncs", syncs.count, "syncs", sync_sites=syncs.sites)
    assert len(logged) == STEPS // log_every
    assert syncs.count == STEPS // log_every, syncs.by_op
    assert set(syncs.by_op) <= {"item"}


def test_syncs_adam_step_bookkeeping_is_not_a_sync(device, perf_metrics):
    """Adam's for-loop/foreach keep ``step`` on the host and read it with ``.item()``: host
    reads, not device syncs."""
    _skip_host(device)
    model, opt, X, y = _iris_setup(device, "foreach")
    with perf.count_syncs(device) as syncs:
        train_loop(model, opt, X, y, steps=10, log_every=0)
    perf_metrics.record("syncs", syncs.count, "syncs")
    assert syncs.count == 0, syncs.by_op
    steps = [st["step"] for st in opt.state.values()]
    assert steps and all(st.device.type == "cpu" for st in steps)  # the reads were host reads


def test_syncs_hidden_in_habits_are_caught(device, perf_metrics):
    """Habits that read device data on the host, each counted as often as CUDA's kernel reads
    (docs/sim.md, "Syncs, case by case", cites each count)."""
    _skip_host(device)
    torch.manual_seed(0)
    t = torch.randn(64, device=device)
    counts = torch.tensor([1, 2, 3], device=device)
    copy = t.clone()
    habits = {
        "item": (lambda: t.sum().item(), 1),
        "float": (lambda: float(t.sum()), 1),
        "bool": (lambda: bool(t.sum() > 0), 1),  # `if loss < best:`
        "format": (lambda: f"{t.sum():.3f}", 1),  # f-string logging
        "tolist": (lambda: t.tolist(), 1),
        "nonzero": (lambda: t.nonzero(), 1),
        "bool_mask_index": (lambda: t[t > 0], 1),
        "masked_select": (lambda: t.masked_select(t > 0), 1),
        "unique": (lambda: t.unique(), 1),
        # Repeat.h: cumsum[-1].item() and (repeats >= 0).all().item()
        "repeat_interleave": (lambda: torch.repeat_interleave(counts), 2),
        # cuda/Equal.cpp: two distinct tensors are compared on the device and read once
        "equal": (lambda: torch.equal(t, copy), 1),
    }
    habits["cpu"] = (lambda: t.cpu(), 1)  # the blocking device-to-host copy
    for name, (fn, n) in habits.items():
        with perf.count_syncs(device) as s:
            fn()
        assert s.by_op == {name: n}, (name, s.by_op)
    # The sync-free forms of the same work count zero.
    free = {
        "repeat_interleave_output_size": lambda: torch.repeat_interleave(counts, output_size=6),
        "where_mask": lambda: torch.where(t > 0, t, 0.0),
        "argmax": lambda: t.argmax(),
        "nonzero_static": lambda: torch.nonzero_static(t > 0, size=64),
        # cuda/Equal.cpp: the alias fast path returns before any device read
        "equal_alias": lambda: torch.equal(t, t),
    }
    for name, fn in free.items():
        with perf.count_syncs(device) as s:
            fn()
        assert s.count == 0, (name, s.by_op)
    perf_metrics.record("habits_caught", len(habits), "count")


@pytest.mark.perf_cuda
def test_syncs_match_cuda_sync_debug_mode(device, perf_metrics):
    """Cross-check the counter with CUDA's own sync detector on a logging loop."""
    import warnings

    model, opt, X, y = _iris_setup(device, "fused")
    train_loop(model, opt, X, y, steps=2, log_every=0)
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with perf.count_syncs(device) as s:
                train_loop(model, opt, X, y, steps=20, log_every=5)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    cuda_syncs = cuda_debug_syncs(caught)
    perf_metrics.record("syncs", s.count, "syncs")
    perf_metrics.record("cuda_debug_syncs", cuda_syncs, "syncs")
    assert s.count == 4
    assert cuda_syncs == s.count, [str(w.message) for w in caught]


@pytest.mark.perf_cuda
@pytest.mark.perf_timing
def test_syncs_time_cost_of_logging_every_step(device, perf_metrics):
    """Logging every step vs every 1000th: the ratio of loop times, with confidence."""
    model, opt, X, y = _iris_setup(device, "fused")
    every = lambda: train_loop(model, opt, X, y, steps=200, log_every=1)  # noqa: E731
    rarely = lambda: train_loop(model, opt, X, y, steps=200, log_every=1000)  # noqa: E731
    cmp = perf.compare(every, rarely, device=device, pairs=15, labels=("log_every_1", "log_1000"))
    perf_metrics.record("every_step_vs_every_1000th", cmp)
    # Each `.item()` waits for the queued kernels and copies to the host: logging every step
    # must be slower, with 95% confidence (the whole interval of the paired ratio above 1).
    # Fails if logging is not measurably slower, i.e. if the counted syncs cost nothing.
    require(cmp.decide_a_slower(1.0))


def test_syncs_modelled_cost_of_logging_is_not_linear(device, perf_gpu_target, perf_metrics):
    """The notes' question, on CPU-only CI: what does ``loss.item()`` every k-th step cost on
    the GPU (``--perf-gpu-target``, modelled with ``perf.model_gpu_time``)? More logging never
    models faster; and in the Iris loop, launch-bound on any GPU, the host is behind the device
    when it syncs, so logging every step costs little (under 1.5x the loop that never logs,
    not 20 syncs' worth of queue drains)."""
    from perf.instruments.gpu_model import model_gpu_time

    _skip_host(device)
    model, opt, X, y = _iris_setup(device, "foreach")
    train_loop(model, opt, X, y, steps=2, log_every=0)
    times = {}
    for k in (1, 10, 0):
        with model_gpu_time(device, perf_gpu_target) as t:
            train_loop(model, opt, X, y, steps=20, log_every=k)
        name = f"log_every_{k}" if k else "never_log"
        times[k] = t.total_s
        perf_metrics.record(f"{name}_gpu_time", t.total_s, "modelled_s", **t.metric_extra)
        perf_metrics.record(f"{name}_sync_wait", t.sync_wait_s, "modelled_s", target=t.target)
    assert times[1] >= times[10] >= times[0], times
    assert times[1] < 1.5 * times[0], times
