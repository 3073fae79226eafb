"""P8: the CUDA caching allocator keeps freed blocks reserved after ``del``;
``torch.accelerator.empty_cache()`` hands them back to the driver. On CUDA and on the simulated
device (its allocator model, CPU CI); the CPU allocator keeps no such statistics."""

from __future__ import annotations

import gc

import pytest
import torch

from perf.instruments.memory import memory_stats


@pytest.fixture
def device(device: torch.device) -> torch.device:
    if device.type not in ("cuda", "sim"):
        pytest.skip("needs allocator statistics: CUDA or perf's simulated device (sim)")
    return device


def _total_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory  # not `.total_mem`
    return torch.get_device_module(device.type).mem_get_info(device)[1]


def test_empty_cache_returns_reserved_memory(device: torch.device, perf_metrics) -> None:
    """Allocate ~256 MiB (at most 5% of the GPU's total_memory), ``del`` it: allocated drops back
    but reserved stays (the cache); ``empty_cache()``: reserved returns to its level before."""
    total = _total_memory(device)
    nbytes = min(256 * 2**20, total // 20)
    gc.collect()
    torch.get_device_module(device.type).synchronize(device)
    torch.accelerator.empty_cache()
    before = memory_stats(device)
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    held = memory_stats(device)
    del x
    torch.get_device_module(device.type).synchronize(device)
    after_del = memory_stats(device)
    torch.accelerator.empty_cache()
    after_empty = memory_stats(device)
    for name, snap in (
        ("before", before),
        ("held", held),
        ("after_del", after_del),
        ("after_empty_cache", after_empty),
    ):
        perf_metrics.record(f"reserved_{name}_bytes", snap["reserved_bytes"], "bytes")
    perf_metrics.record("allocated_after_del_bytes", after_del["allocated_bytes"], "bytes")
    assert held["allocated_bytes"] - before["allocated_bytes"] >= nbytes
    assert after_del["allocated_bytes"] == before["allocated_bytes"]
    assert after_del["reserved_bytes"] >= before["reserved_bytes"] + nbytes, "cache kept it"
    assert after_empty["reserved_bytes"] <= before["reserved_bytes"]


def test_empty_cache_cached_block_is_reused_without_new_reservation(
    device: torch.device, perf_metrics
) -> None:
    """Why the cache exists: after ``del``, an allocation of the same size reuses the cached
    block, so reserved memory does not grow a second time."""
    nbytes = 64 * 2**20
    torch.accelerator.empty_cache()
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    del x
    reserved = memory_stats(device)["reserved_bytes"]
    y = torch.empty(nbytes, dtype=torch.uint8, device=device)
    growth = memory_stats(device)["reserved_bytes"] - reserved
    del y
    torch.accelerator.empty_cache()
    perf_metrics.record("reserved_growth_on_reuse_bytes", growth, "bytes")
    assert growth == 0
