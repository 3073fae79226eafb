"""P5: DataLoader. Worker processes hide per-item latency; ``persistent_workers`` removes the
per-epoch worker start; misconfigurations are caught the way torch documents."""

from __future__ import annotations

import multiprocessing
import time
import warnings

import pytest
import torch
from suite_support import require
from torch.utils.data import DataLoader, Dataset

import perf
from perf.workloads.datasets import SleepyDataset

#: 4 workers on a 2-core box on purpose: sleeping items need no CPU, so the win passes the
#: core count. torch warns about "excessive worker creation" then; that warning is expected.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def _epoch(loader: DataLoader) -> int:
    n = 0
    for xb, _ in loader:
        n += xb.shape[0]
    return n


@pytest.mark.perf_timing
def test_dataloader_workers_hide_item_latency(perf_metrics) -> None:
    """64 items x 5 ms of latency: 4 (persistent) workers load an epoch >= 2x faster than the
    main process alone, with 95% confidence; the measured speed-up is recorded."""
    ds = SleepyDataset(64, delay_s=0.005)
    serial = DataLoader(ds, batch_size=8, num_workers=0)
    workers = DataLoader(ds, batch_size=8, num_workers=4, persistent_workers=True)
    assert _epoch(serial) == _epoch(workers) == 64  # also starts the persistent workers
    cmp = perf.compare(
        lambda: _epoch(serial),
        lambda: _epoch(workers),
        pairs=8,
        warmup=1,
        labels=("num_workers=0", "num_workers=4"),
    )
    perf_metrics.record("workers0_over_workers4_epoch_time", cmp, "ratio", higher_is_better=True)
    perf_metrics.record("epoch_time_workers4_s", cmp.b, "s")
    require(cmp.decide_a_slower(2.0))


@pytest.mark.perf_timing
def test_dataloader_persistent_workers_remove_epoch_start_cost(perf_metrics) -> None:
    """Epochs 2..n: a non-persistent loader starts its worker processes every epoch, a persistent
    one keeps them. With cheap items the start cost dominates: persistent must be >= 2x faster."""
    ds = SleepyDataset(16, delay_s=0.0)
    fresh = DataLoader(ds, batch_size=8, num_workers=2)
    kept = DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    _epoch(kept)  # epoch 1 starts the persistent workers; epochs 2..n are measured
    cmp = perf.compare(
        lambda: _epoch(fresh),
        lambda: _epoch(kept),
        pairs=9,
        warmup=1,
        labels=("persistent_workers=False", "persistent_workers=True"),
    )
    perf_metrics.record("fresh_over_persistent_epoch_time", cmp, "ratio", higher_is_better=True)
    perf_metrics.record(
        "worker_start_cost_per_epoch_s", max(cmp.a.median_s - cmp.b.median_s, 0.0), "s"
    )
    require(cmp.decide_a_slower(2.0))


def test_dataloader_prefetch_factor_without_workers_raises(perf_metrics) -> None:
    """``prefetch_factor`` only means something for worker processes: torch raises ValueError."""
    with pytest.raises(ValueError, match="prefetch_factor") as exc:
        DataLoader(SleepyDataset(4, 0.0), num_workers=0, prefetch_factor=2)
    perf_metrics.record("raised", 1, "count", message=str(exc.value))


def test_dataloader_persistent_workers_without_workers_raises(perf_metrics) -> None:
    """``persistent_workers=True`` with ``num_workers=0`` raises ValueError as documented."""
    with pytest.raises(ValueError, match="persistent_workers option needs num_workers > 0") as e:
        DataLoader(SleepyDataset(4, 0.0), num_workers=0, persistent_workers=True)
    perf_metrics.record("raised", 1, "count", message=str(e.value))


def test_dataloader_pin_memory_without_accelerator_is_detected(perf_metrics) -> None:
    """``pin_memory=True`` on a machine without an accelerator: torch warns and the batches come
    back unpinned. With an accelerator, the batches are pinned and nothing warns."""
    loader = DataLoader(SleepyDataset(8, 0.0), batch_size=4, pin_memory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        xb, _ = next(iter(loader))
    pin_warnings = [w for w in caught if "pin_memory" in str(w.message)]
    has_accelerator = torch.accelerator.is_available()
    perf_metrics.record("pin_memory_warnings", len(pin_warnings), "count")
    perf_metrics.record("batch_pinned", int(xb.is_pinned()), "count")
    if has_accelerator:
        assert xb.is_pinned() and not pin_warnings
    else:
        assert not xb.is_pinned()
        assert pin_warnings, "pin_memory=True without an accelerator went undetected"
        assert "no accelerator is found" in str(pin_warnings[0].message)


class _CountingDataset(Dataset[torch.Tensor]):
    """Counts item loads across worker processes in shared memory."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.loaded = multiprocessing.Value("i", 0)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        with self.loaded.get_lock():
            self.loaded.value += 1
        return torch.tensor(float(i))


def test_dataloader_prefetch_bounds_items_in_flight(perf_metrics) -> None:
    """Workers run ahead by ``num_workers * prefetch_factor`` batches, no more: after the first
    batch is taken and the workers have had time to fill up, 2 workers x prefetch_factor=2 have
    loaded exactly 1 + 2*2 batches of 4 items out of 64 (counted in shared memory)."""
    ds = _CountingDataset(64)
    loader = DataLoader(ds, batch_size=4, num_workers=2, prefetch_factor=2)
    it = iter(loader)
    next(it)
    deadline = time.monotonic() + 10.0  # generous: worker start is slow on a busy box
    while ds.loaded.value < 5 * 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # would more arrive? (they must not)
    loaded = ds.loaded.value
    del it
    perf_metrics.record("items_loaded_after_first_batch", loaded, "count")
    assert loaded == (1 + 2 * 2) * 4, loaded


def test_dataloader_same_batches_with_and_without_workers(perf_metrics) -> None:
    """Workers change where items load, not what a batch holds: same batches, same order."""
    ds = SleepyDataset(24, delay_s=0.0)
    a = [xb for xb, _ in DataLoader(ds, batch_size=4, num_workers=0)]
    b = [xb for xb, _ in DataLoader(ds, batch_size=4, num_workers=2)]
    perf_metrics.record("batches", len(a), "count")
    assert len(a) == len(b) == 6
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
