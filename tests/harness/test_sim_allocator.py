"""The allocator model alone: figures derived by hand from CUDACachingAllocator.cpp's rules."""

from __future__ import annotations

import base64
import pickle
import re

import pytest

from perf.sim.allocator import (
    AllocatorOutOfMemoryError,
    CachingAllocator,
    allocation_size,
    round_size,
)

KiB, MiB = 1 << 10, 1 << 20


def test_round_size_and_segment_size_rules():
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert allocation_size(round_size(MiB)) == 2 * MiB  # small pool up to and with 1 MiB
    assert allocation_size(round_size(MiB + 1)) == 20 * MiB  # large, below kMinLargeAlloc
    assert allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB  # from 10 MiB: rounded to 2 MiB
    assert allocation_size(10 * MiB + 512) == 12 * MiB


def test_zero_bytes_allocate_nothing():
    a = CachingAllocator()
    assert a.malloc(0) is None
    assert a.memory_stats()["allocation.all.allocated"] == 0


def test_pools_splits_frees_and_empty_cache_step_by_step():
    a = CachingAllocator()
    s = a.memory_stats
    x = a.malloc(1000)  # -> 1024 B in a new 2 MiB small segment
    assert (a.allocated_bytes, a.reserved_bytes) == (1024, 2 * MiB)
    y = a.malloc(MiB)  # still small: splits the same segment
    assert (a.allocated_bytes, a.reserved_bytes) == (1024 + MiB, 2 * MiB)
    z = a.malloc(MiB + 1)  # large: 1049088 B from a new 20 MiB segment, split (> 1 MiB left)
    assert a.allocated_bytes == 1024 + MiB + 1049088
    assert a.reserved_bytes == 22 * MiB
    assert s()["inactive_split_bytes.large_pool.current"] == 20 * MiB - 1049088
    # 19.5 MiB: the 18.99 MiB rest does not fit; >= 10 MiB, so a 20 MiB segment (2 MiB
    # rounding); only 0.5 MiB would remain, not more than 1 MiB: no split, the whole
    # segment counts as allocated
    w = a.malloc(19 * MiB + 512 * KiB)
    assert a.allocated_bytes == 1024 + MiB + 1049088 + 20 * MiB
    assert a.reserved_bytes == 42 * MiB
    peak = a.allocated_bytes
    a.free(w)
    assert (a.allocated_bytes, a.reserved_bytes) == (1024 + MiB + 1049088, 42 * MiB)
    a.empty_cache()  # w's segment is one free block: released; z's is split: kept
    assert a.reserved_bytes == 22 * MiB
    a.free(z)  # merges with the rest of its segment
    assert s()["inactive_split.large_pool.current"] == 0
    a.empty_cache()
    assert a.reserved_bytes == 2 * MiB
    a.free(x)
    a.free(y)
    a.empty_cache()
    st = s()
    assert (st["allocated_bytes.all.current"], st["reserved_bytes.all.current"]) == (0, 0)
    assert st["allocated_bytes.all.peak"] == peak
    assert st["reserved_bytes.all.peak"] == 42 * MiB
    assert st["allocation.all.allocated"] == st["allocation.all.freed"] == 4
    assert st["segment.all.allocated"] == 3 and st["num_device_free"] == 3
    assert st["requested_bytes.all.peak"] == 1000 + MiB + MiB + 1 + 19 * MiB + 512 * KiB


def test_best_fit_reuses_the_freed_block_and_merges_neighbours():
    a = CachingAllocator()
    b1 = a.malloc(4 * MiB)
    b2 = a.malloc(4 * MiB)
    b3 = a.malloc(4 * MiB)
    assert a.reserved_bytes == 20 * MiB  # all three split from one 20 MiB segment
    assert (b2.ptr - b1.ptr, b3.ptr - b2.ptr) == (4 * MiB, 4 * MiB)
    a.free(b2)
    b4 = a.malloc(3 * MiB)  # best fit: the freed 4 MiB hole (smaller than the 8 MiB rest)
    assert b4.ptr == b2.ptr and a.reserved_bytes == 20 * MiB
    # 1 MiB remains in the hole: not more than kSmallSize, so the block was not split
    assert b4.size == 4 * MiB
    a.free(b4)
    a.free(b1)
    a.free(b3)
    assert a.memory_stats()["inactive_split.all.current"] == 0  # one block again
    a.empty_cache()
    assert a.reserved_bytes == 0


def test_small_pool_splits_down_to_512_bytes():
    a = CachingAllocator()
    b = a.malloc(2 * MiB - 512)  # large pool (> 1 MiB): a 20 MiB segment
    assert not b.small
    blocks = [a.malloc(512 * KiB) for _ in range(4)]  # exactly fill one 2 MiB small segment
    assert a.memory_stats()["segment.small_pool.current"] == 1
    a.malloc(1)
    assert a.memory_stats()["segment.small_pool.current"] == 2
    assert blocks[3].next is None  # no 0-byte remainder block


def test_max_split_size_keeps_big_blocks_whole():
    a = CachingAllocator(max_split_size=4 * MiB)
    big = a.malloc(6 * MiB)  # >= max_split_size: never split, 20 MiB segment counted whole
    assert a.allocated_bytes == 20 * MiB
    st = a.memory_stats()
    assert st["oversize_allocations.current"] == 1 and st["oversize_segments.current"] == 1
    assert st["max_split_size"] == 4 * MiB
    a.free(big)
    small = a.malloc(2 * MiB)  # a small request does not take an oversized free block
    assert a.reserved_bytes == 40 * MiB and small.segment_ptr != big.segment_ptr


def test_reset_peak_and_accumulated():
    a = CachingAllocator()
    b = a.malloc(3 * MiB)
    a.free(b)
    a.reset_peak_stats()
    st = a.memory_stats()
    assert st["allocated_bytes.all.peak"] == 0 and st["reserved_bytes.all.peak"] == 20 * MiB
    a.reset_accumulated_stats()
    assert a.memory_stats()["allocation.all.allocated"] == 0


def test_out_of_memory_retries_after_releasing_the_cache():
    a = CachingAllocator(capacity_bytes=40 * MiB)
    b = a.malloc(12 * MiB)
    a.free(b)  # 12 MiB cached
    a.malloc(30 * MiB)  # 12 + 30 > 40: a retry after the cached segment is released
    st = a.memory_stats()
    assert st["num_alloc_retries"] == 1 and a.reserved_bytes == 30 * MiB
    with pytest.raises(AllocatorOutOfMemoryError, match="out of memory"):
        a.malloc(14 * MiB)
    assert a.memory_stats()["num_ooms"] == 1


def test_double_free_and_negative_size_are_errors():
    a = CachingAllocator()
    b = a.malloc(10)
    a.free(b)
    with pytest.raises(ValueError, match="double free"):
        a.free(b)
    with pytest.raises(ValueError, match=">= 0"):
        a.malloc(-1)


def test_snapshot_is_read_by_pytorchs_memory_viz():
    from torch.cuda import _memory_viz

    a = CachingAllocator()
    a.record_history(True)
    b = a.malloc(3 * MiB, (("train.py", 12, "step"),))
    a.malloc(100)
    a.free(b)
    snap = a.snapshot()
    assert [s["total_size"] for s in snap["segments"]] == [20 * MiB, 2 * MiB]
    assert [e["action"] for e in snap["device_traces"][0]][:2] == ["segment_alloc", "alloc"]
    summary = _memory_viz.segsum(snap)
    assert "segments: 2" in summary and "total_reserved: 22.0MiB" in summary
    assert "b = a[0:3.0MiB]" in _memory_viz.trace(snap)
    html = _memory_viz.trace_plot(snap)  # embeds the snapshot as a base64 pickle
    embedded = re.search(r'"base64": "([^"]+)"', html)
    assert embedded is not None
    assert pickle.loads(base64.b64decode(embedded.group(1))) == snap


@pytest.mark.parametrize("max_split_size", [None, 4 * MiB])
def test_statistics_always_equal_the_blocks_they_count(max_split_size):
    """A seeded trace of 1500 mallocs, frees and cache releases: after every step each
    statistic equals what the segments and blocks of the snapshot add up to, its peak is the
    highest value it has had, and allocated - freed is current (the hot path updates the
    figures incrementally; this recounts them from scratch)."""
    import random

    rng = random.Random(7)
    a = CachingAllocator(max_split_size=max_split_size)
    sizes = [1, 512, 513, 4 * KiB, 70 * KiB, MiB, MiB + 1, 3 * MiB, 12 * MiB]
    live: list = []
    peaks: dict[str, int] = {}
    for _ in range(1500):
        x = rng.random()
        if x < 0.55 or not live:
            b = a.malloc(rng.choice([*sizes, rng.randrange(1, 30 * MiB)]))
            live.append(b)
        elif x < 0.98:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            a.empty_cache()
        st, snap = a.memory_stats(), a.snapshot()
        for pool, small in (("all", None), ("small_pool", True), ("large_pool", False)):
            segs = [
                s
                for s in snap["segments"]
                if small is None or (s["segment_type"] == "small") == small
            ]
            blocks = [(b, len(s["blocks"]) > 1) for s in segs for b in s["blocks"]]
            used = [b for b, _ in blocks if b["state"] == "active_allocated"]
            split_free = [b for b, split in blocks if split and b["state"] == "inactive"]
            expect = {
                "allocation": len(used),
                "active": len(used),
                "allocated_bytes": sum(b["size"] for b in used),
                "active_bytes": sum(b["size"] for b in used),
                "requested_bytes": sum(b["requested_size"] for b in used),
                "segment": len(segs),
                "reserved_bytes": sum(s["total_size"] for s in segs),
                "inactive_split": len(split_free),
                "inactive_split_bytes": sum(b["size"] for b in split_free),
            }
            for name, value in expect.items():
                key = f"{name}.{pool}"
                assert st[f"{key}.current"] == value, key
                assert st[f"{key}.allocated"] - st[f"{key}.freed"] == value, key
                peaks[key] = max(peaks.get(key, 0), value)
                assert st[f"{key}.peak"] == peaks[key], key
