"""P4: host-to-device transfers. Data is moved to the device once, not every step; pinned memory
with ``non_blocking=True`` copies faster than pageable memory and overlaps compute on a side
stream (CUDA only)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from suite_support import require, transfer_target
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import perf
from perf.workloads.data import load_iris
from perf.workloads.models import mlp

STEPS = 10


def _train(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    target: torch.device,
    *,
    move_every_step: bool,
) -> perf.TransferCount:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with perf.count_transfers() as t:
        if not move_every_step:
            x, y = x.to(target), y.to(target)
        for _ in range(STEPS):
            xb, yb = (x.to(target), y.to(target)) if move_every_step else (x, y)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
    return t.result()  # type: ignore[no-any-return]


def test_transfer_data_moved_once_not_every_step(device: torch.device, perf_metrics) -> None:
    """Iris full-batch training, 10 steps: the loop that moves X, y every step makes 10x the
    host-to-device copies and bytes of the loop that moves them once before the loop.

    On a CPU-only box the ``meta`` device stands in for the accelerator (see conftest): the
    copies are the same ops with the same byte counts, only no data is computed.
    """
    target = transfer_target(device)
    x, y = load_iris()
    once = _train(mlp().to(target), x, y, target, move_every_step=False)
    every = _train(mlp().to(target), x, y, target, move_every_step=True)
    data_bytes = x.numel() * x.element_size() + y.numel() * y.element_size()
    perf_metrics.record("h2d_copies_move_once", once.h2d_copies, "count")
    perf_metrics.record("h2d_copies_move_every_step", every.h2d_copies, "count")
    perf_metrics.record("h2d_bytes_move_once", once.h2d_bytes, "bytes")
    perf_metrics.record("h2d_bytes_move_every_step", every.h2d_bytes, "bytes")
    assert once.h2d_copies == 2 and once.h2d_bytes == data_bytes, once
    assert every.h2d_copies == STEPS * once.h2d_copies, every
    assert every.h2d_bytes == STEPS * once.h2d_bytes, every
    assert once.d2h_copies == every.d2h_copies == 0


def test_transfer_pinned_loader_batches_copy_pinned_non_blocking(
    device: torch.device, perf_metrics
) -> None:
    """A DataLoader with ``pin_memory=True`` yields pinned batches; ``.to(device,
    non_blocking=True)`` then makes pinned, asynchronous copies, and no pageable one (on CUDA,
    and on the simulated device of CPU-only boxes)."""
    if device.type == "cpu":
        pytest.skip(
            "a host-to-device copy needs a device: the CPU is the host (this runs on "
            "the `sim` and `cuda` parametrizations)"
        )
    ds = TensorDataset(torch.randn(256, 64), torch.randint(0, 3, (256,)))
    loader = DataLoader(ds, batch_size=64, pin_memory=True)
    with perf.count_transfers() as t:
        for xb, yb in loader:
            xb.to(device, non_blocking=True)
            yb.to(device, non_blocking=True)
    perf_metrics.record("pinned_h2d_copies", t.pinned_h2d_copies, "count")
    perf_metrics.record("pageable_h2d_copies", t.pageable_h2d_copies, "count")
    assert t.pinned_h2d_copies == 8 and t.pageable_h2d_copies == 0, t.result()
    assert t.non_blocking_h2d_copies == 8


@pytest.mark.perf_cuda
@pytest.mark.perf_timing
def test_transfer_pinned_non_blocking_faster_than_pageable(
    device: torch.device, perf_metrics
) -> None:
    """64 MiB host-to-device: pageable ``.to(device)`` / pinned ``.to(device, non_blocking=True)``
    > 1 with 95% confidence (the pageable copy is staged through a pinned bounce buffer)."""
    n = 16 * 1024 * 1024  # float32 -> 64 MiB
    pageable = torch.randn(n)
    pinned = pageable.pin_memory()
    dst = torch.empty(n, device=device)
    cmp = perf.compare(
        lambda: dst.copy_(pageable),
        lambda: dst.copy_(pinned, non_blocking=True),
        device=device,
        pairs=15,
        labels=("pageable", "pinned_non_blocking"),
    )
    perf_metrics.record("pageable_over_pinned_copy_time", cmp, "ratio", higher_is_better=True)
    gbps = n * 4 / cmp.b.median_s / 1e9
    perf_metrics.record("pinned_h2d_gb_per_s", gbps, "1")
    require(cmp.decide_a_slower(1.0))


#: The overlap test's claim: the side-stream copy hides at least this share of the shorter of
#: (copy, compute). Perfect overlap hides all of it (1.0); no overlap hides none.
MIN_HIDDEN_SHARE = 0.5


def overlap_bound(copy_s: float, compute_s: float, hidden_share: float = MIN_HIDDEN_SHARE) -> float:
    """serial / overlapped time when ``hidden_share`` of the shorter part is hidden."""
    lo, hi = sorted((copy_s, compute_s))
    return (copy_s + compute_s) / (hi + (1.0 - hidden_share) * lo)


@pytest.mark.perf_cuda
@pytest.mark.perf_timing
def test_transfer_copy_overlaps_compute_on_side_stream(device: torch.device, perf_metrics) -> None:
    """Copy the next batch on a side stream while the current one computes (the seeds' point
    of ``non_blocking=True``): the copy hides at least half of the shorter of copy and compute,
    with 95% confidence.

    The compute is sized from measurements to last about as long as the copy, so perfect
    overlap would halve the time (serial / overlapped ~2) and the asserted bound (hiding half:
    ~1.33 when balanced) sits well below it. The earlier fixed workload (128 MiB, 4 matmuls
    of 4096) predicted 1.21-1.25 on an H100 against an asserted 1.2: a coin flip. Not yet
    measured on a GPU.
    """
    n = 32 * 1024 * 1024  # 128 MiB pinned
    host = torch.randn(n).pin_memory()
    dst = torch.empty(n, device=device)
    a = torch.randn(4096, 4096, device=device)
    side = torch.cuda.Stream(device)
    main = torch.cuda.current_stream(device)

    def copy() -> None:
        dst.copy_(host, non_blocking=True)

    copy_s = perf.measure(copy, device=device, samples=7).median_s
    mm_s = perf.measure(lambda: a @ a, device=device, samples=7).median_s
    reps = max(1, min(64, round(copy_s / mm_s)))

    def compute() -> None:
        for _ in range(reps):
            a @ a

    compute_s = perf.measure(compute, device=device, samples=7).median_s

    def serial() -> None:
        copy()
        compute()

    def overlapped() -> None:
        side.wait_stream(main)  # dst is free again once earlier work on main is done
        with torch.cuda.stream(side):
            copy()
        compute()
        main.wait_stream(side)

    cmp = perf.compare(serial, overlapped, device=device, pairs=15, labels=("serial", "overlapped"))
    bound = overlap_bound(copy_s, compute_s)
    hidden = (cmp.a.median_s - cmp.b.median_s) / min(copy_s, compute_s)
    perf_metrics.record("serial_over_overlapped_time", cmp, "ratio", higher_is_better=True)
    perf_metrics.record(
        "overlap_hidden_share",
        hidden,
        "1",
        copy_s=copy_s,
        compute_s=compute_s,
        matmuls=reps,
        bound=bound,
    )
    d = cmp.decide_a_slower(bound)
    require(
        replace(
            d,
            reason=f"{d.reason}; bound {bound:.3f} (copy {copy_s:.4g} s, "
            f"compute {compute_s:.4g} s, {reps} matmuls)",
        )
    )


def test_transfer_overlap_bound_arithmetic() -> None:
    """The bound used above: no overlap gives 1, perfect overlap of equal parts 2."""
    assert overlap_bound(1.0, 1.0, hidden_share=0.0) == 1.0
    assert overlap_bound(1.0, 1.0, hidden_share=1.0) == 2.0
    assert overlap_bound(1.0, 1.0) == pytest.approx(2 / 1.5)
    assert overlap_bound(0.3, 1.0) == overlap_bound(1.0, 0.3) == pytest.approx(1.3 / 1.15)


def _modelled_steps(device: torch.device, target, *, pinned: bool, non_blocking: bool) -> Any:
    """Four steps of: copy a 1 MiB batch to the device, four 512x512 matmuls on it."""
    from perf.instruments.gpu_model import model_gpu_time

    w = torch.randn(512, 512, device=device)
    batches = [torch.randn(512, 512) for _ in range(4)]
    if pinned:
        batches = [b.pin_memory() for b in batches]
    with model_gpu_time(device, target) as t:
        for b in batches:
            h = b.to(device, non_blocking=non_blocking)
            for _ in range(4):
                h = h @ w
    return t.result()


def test_transfer_modelled_pinned_non_blocking_beats_pageable(
    device: torch.device, perf_gpu_target, perf_metrics
) -> None:
    """On CPU-only CI, modelled on ``--perf-gpu-target``: pinned + ``non_blocking`` copies run
    on a copy engine while the host queues compute, pageable ones block the host until the
    device drains and then copy at the pageable rate. Modelled: the pinned non-blocking loop
    never waits, pinned non-blocking < pinned blocking < pageable, the pageable loop at least
    1.5x the pinned non-blocking one (an H200 runner measured 1.8x and 2.8x:
    docs/measurements.md). At the measured host cost the loop's 512x512 matmuls are
    launch-bound, so the device has drained by each blocking copy: it costs its transfer."""
    if device.type == "cpu":
        pytest.skip(
            "a host-to-device copy needs a device: the CPU is the host (this runs on "
            "the `sim` and `cuda` parametrizations)"
        )
    fast = _modelled_steps(device, perf_gpu_target, pinned=True, non_blocking=True)
    pinned_blocking = _modelled_steps(device, perf_gpu_target, pinned=True, non_blocking=False)
    pageable = _modelled_steps(device, perf_gpu_target, pinned=False, non_blocking=False)
    for name, r in (
        ("pinned_non_blocking", fast),
        ("pinned_blocking", pinned_blocking),
        ("pageable", pageable),
    ):
        perf_metrics.record(f"{name}_gpu_time", r.total_s, "modelled_s", **r.metric_extra)
    assert fast.sync_wait_s == 0.0
    assert fast.transfer_s < pageable.transfer_s  # the pageable rate
    assert fast.total_s < pinned_blocking.total_s < pageable.total_s
    assert pageable.total_s >= 1.5 * fast.total_s, (fast.summary(), pageable.summary())
