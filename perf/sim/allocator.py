"""A model of PyTorch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``).

Why: allocated / reserved / peak bytes on a GPU are decided by the program's allocations and
frees, in order, and by the allocator's rules, not by the GPU. Driving this model with the
storages a ``sim`` program allocates and frees gives, on a CPU-only box, the figures
``torch.cuda.memory_stats()`` reports on ``cuda:0``.

Modelled (``DeviceCachingAllocator``, torch 2.4-2.13, one device, one stream, the native
allocator with default ``PYTORCH_CUDA_ALLOC_CONF`` except ``max_split_size_mb``):

- ``round_size``: requests round up to multiples of ``kMinBlockSize`` (512 B); size 0
  allocates nothing (``NativeCachingAllocator::allocate``).
- pools: requests ``<= kSmallSize`` (1 MiB) use the small pool, others the large pool.
- ``get_allocation_size``: a new segment is ``kSmallBuffer`` (2 MiB) for small requests,
  ``kLargeBuffer`` (20 MiB) for requests below ``kMinLargeAlloc`` (10 MiB), else the request
  rounded up to ``kRoundLarge`` (2 MiB).
- ``get_free_block``: best fit (smallest size, then lowest address), with the two
  ``max_split_size`` refusals.
- ``should_split`` / ``alloc_found_block``: small blocks split when at least 512 B remain;
  large blocks when the request is below ``max_split_size`` and more than 1 MiB remains.
  The allocated part keeps the lower address.
- ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours.
- ``release_cached_blocks`` (``empty_cache``): segments that are one free block are released.
- the statistics of ``memory_stats`` (``allocation``, ``segment``, ``active``,
  ``inactive_split``, ``*_bytes`` for all / small_pool / large_pool with current / peak /
  allocated / freed; oversize counts; event counters) and ``reset_peak_memory_stats``.
- ``_snapshot()``'s format (segments with blocks and frames, the ``device_traces`` of
  ``_record_memory_history``), which ``torch.cuda._memory_viz`` reads.

Not modelled: several streams and their events (``record_stream``), expandable segments,
``roundup_power2_divisions``, garbage-collection threshold, CUDA graph private pools,
``per_process_memory_fraction``; out of memory only where ``capacity_bytes`` is set (then the
retry after releasing *all* cached blocks stands in for ``release_available_cached_blocks``).

Pure Python on purpose: no torch import, so the rules are testable in isolation. One piece:
the rules share the pools, the block links and the statistics; split apart they would only
pass those around.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20
#: std::numeric_limits<size_t>::max(): no max_split_size (``memory_stats`` shows it as -1)
NO_SPLIT_LIMIT = (1 << 64) - 1

_POOLS = ("all", "small_pool", "large_pool")
_STATS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
#: the statistics every malloc and free changes (``_alloc_found_block`` / ``free``)
_HOT = ("allocation", "allocated_bytes", "active", "active_bytes", "requested_bytes")
#: (filename, line, function) of one stack frame, innermost first
Frame = tuple[str, int, str]


class AllocatorOutOfMemoryError(MemoryError):
    """The model ran out of ``capacity_bytes`` (CUDA's ``OutOfMemoryError``)."""


def round_size(size: int) -> int:
    """``CUDACachingAllocator::round_size`` (no power-of-two divisions)."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment a (rounded) request of ``size`` gets from cudaMalloc."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


@dataclass(slots=True)
class Stat:
    """``c10::CachingDeviceAllocator::Stat``."""

    current: int = 0
    peak: int = 0
    allocated: int = 0
    freed: int = 0

    def increase(self, n: int) -> None:
        self.current += n
        self.peak = max(self.peak, self.current)
        self.allocated += n

    def decrease(self, n: int) -> None:
        self.current -= n
        self.freed += n


def _up(all_pools: Stat, pool: Stat, n: int) -> None:
    """``increase(n)`` of a statistic's "all" and per-pool figures, inlined: the allocator's
    hot path (each simulated op that makes a tensor runs it five times)."""
    cur = all_pools.current + n
    all_pools.current = cur
    if cur > all_pools.peak:
        all_pools.peak = cur
    all_pools.allocated += n
    cur = pool.current + n
    pool.current = cur
    if cur > pool.peak:
        pool.peak = cur
    pool.allocated += n


def _down(all_pools: Stat, pool: Stat, n: int) -> None:
    all_pools.current -= n
    all_pools.freed += n
    pool.current -= n
    pool.freed += n


@dataclass(eq=False, slots=True)
class Block:
    """One block of a segment (``Block`` in the source)."""

    size: int
    ptr: int
    small: bool
    segment_ptr: int
    allocated: bool = False
    requested_size: int = 0
    prev: Block | None = None
    next: Block | None = None
    frames: tuple[Frame, ...] = ()

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


@dataclass
class _Pool:
    """The free blocks of one pool in best-fit order: size, then address, as one int key
    ``size << 64 | ptr`` (one int compares faster than a tuple; addresses stay below 2**64)."""

    small: bool
    keys: list[int] = field(default_factory=list)
    blocks: dict[int, Block] = field(default_factory=dict)

    def insert(self, b: Block) -> None:
        k = (b.size << 64) | b.ptr
        bisect.insort(self.keys, k)
        self.blocks[k] = b

    def erase(self, b: Block) -> None:
        k = (b.size << 64) | b.ptr
        keys = self.keys
        del keys[bisect.bisect_left(keys, k)]
        del self.blocks[k]

    def lower_bound(self, size: int) -> Block | None:
        keys = self.keys
        i = bisect.bisect_left(keys, size << 64)
        return self.blocks[keys[i]] if i < len(keys) else None


class CachingAllocator:
    """One device's caching allocator (``DeviceCachingAllocator``), single stream.

    ``max_split_size``: ``PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb`` in bytes (None: no limit).
    ``capacity_bytes``: device memory for out-of-memory errors (None: unbounded).
    ``record_history``: keep a trace of alloc / free / segment events (the
    ``device_traces`` of a snapshot), at most ``max_entries``.
    """

    def __init__(
        self,
        *,
        max_split_size: int | None = None,
        capacity_bytes: int | None = None,
        base_address: int = 0x7F0000000000,
    ) -> None:
        self.max_split_size = NO_SPLIT_LIMIT if max_split_size is None else int(max_split_size)
        self.capacity_bytes = capacity_bytes
        self._next_address = base_address
        self._small = _Pool(small=True)
        self._large = _Pool(small=False)
        self._segments: dict[int, Block] = {}  # segment ptr -> its first block (address order)
        self._segment_size: dict[int, int] = {}
        self.stats: dict[str, list[Stat]] = {name: [Stat(), Stat(), Stat()] for name in _STATS}
        # the (all, pool) Stat pairs that every malloc and free updates, looked up once
        self._hot = {
            small: tuple(
                st for name in _HOT for st in (self.stats[name][0], self.stats[name][2 - small])
            )
            for small in (False, True)
        }
        self.oversize_allocations = Stat()
        self.oversize_segments = Stat()
        self.counters = dict.fromkeys(
            (
                "num_alloc_retries",
                "num_ooms",
                "num_sync_all_streams",
                "num_device_alloc",
                "num_device_free",
                "num_oom_rejections",
            ),
            0,
        )
        self.trace: list[dict[str, Any]] | None = None
        self.trace_max_entries = 0
        self._clock: Callable[[], int] = itertools.count().__next__

    # -- history ------------------------------------------------------------------------

    def record_history(self, enabled: bool, max_entries: int = 1_000_000) -> None:
        """Start (or stop) keeping the trace of events (``_record_memory_history``)."""
        self.trace = [] if enabled else None
        self.trace_max_entries = max_entries

    def _record(self, action: str, addr: int, size: int, frames: tuple[Frame, ...]) -> None:
        if self.trace is None:
            return
        if len(self.trace) >= self.trace_max_entries:
            del self.trace[0]
        self.trace.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": self._clock(),
                "frames": _frame_dicts(frames),
            }
        )

    # -- malloc / free --------------------------------------------------------------------

    def _bump(self, name: str, small: bool, n: int) -> None:
        # the statistics malloc and free change less often (segments, splits)
        s = self.stats[name]
        if n >= 0:
            _up(s[0], s[1] if small else s[2], n)
        else:
            _down(s[0], s[1] if small else s[2], -n)

    def malloc(self, orig_size: int, frames: tuple[Frame, ...] = ()) -> Block | None:
        """Allocate ``orig_size`` bytes; None for 0 bytes (CUDA hands out no block)."""
        if orig_size < 0:
            raise ValueError(f"allocation size must be >= 0, got {orig_size}")
        if orig_size == 0:
            return None
        size = round_size(orig_size)
        small = size <= K_SMALL_SIZE
        pool = self._small if small else self._large
        block = self._get_free_block(pool, size)
        if block is None:
            alloc_size = allocation_size(size)
            block = self._alloc_block(alloc_size, small, frames)
            if block is None:
                self.counters["num_alloc_retries"] += 1
                self.empty_cache()
                block = self._alloc_block(alloc_size, small, frames)
            if block is None:
                self.counters["num_ooms"] += 1
                self._record("oom", 0, alloc_size, frames)
                raise AllocatorOutOfMemoryError(
                    f"simulated CUDA out of memory: tried to allocate {alloc_size} bytes with "
                    f"{self.stats['reserved_bytes'][0].current} of {self.capacity_bytes} "
                    "bytes reserved"
                )
        return self._alloc_found_block(pool, block, size, orig_size, frames)

    def _get_free_block(self, pool: _Pool, size: int) -> Block | None:
        b = pool.lower_bound(size)
        if b is None:
            return None
        if size < self.max_split_size and b.size >= self.max_split_size:
            return None  # do not return an oversized block for a small request
        if size >= self.max_split_size and b.size >= size + K_LARGE_BUFFER:
            return None  # do not return an oversized block for a large request
        pool.erase(b)
        return b

    def _alloc_block(self, size: int, small: bool, frames: tuple[Frame, ...]) -> Block | None:
        reserved = self.stats["reserved_bytes"][0].current
        if self.capacity_bytes is not None and reserved + size > self.capacity_bytes:
            return None
        ptr = self._next_address
        self._next_address += size + (-size % K_SMALL_BUFFER)
        b = Block(size=size, ptr=ptr, small=small, segment_ptr=ptr)
        self._segments[ptr] = b
        self._segment_size[ptr] = size
        self._bump("segment", small, 1)
        self._bump("reserved_bytes", small, size)
        if size >= self.max_split_size:
            self.oversize_segments.increase(1)
        self.counters["num_device_alloc"] += 1
        self._record("segment_alloc", ptr, size, frames)
        return b

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.small:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.max_split_size and remaining > K_SMALL_SIZE

    def _alloc_found_block(
        self, pool: _Pool, block: Block, size: int, orig_size: int, frames: tuple[Frame, ...]
    ) -> Block:
        small = block.small
        already_split = block.is_split
        if self._should_split(block, size):
            remaining = block
            block = Block(
                size=size, ptr=remaining.ptr, small=small, segment_ptr=remaining.segment_ptr
            )
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            else:
                self._segments[block.segment_ptr] = block
            block.next = remaining
            remaining.prev = block
            remaining.ptr += size
            remaining.size -= size
            pool.insert(remaining)
            if already_split:
                self._bump("inactive_split_bytes", small, -block.size)
            else:
                self._bump("inactive_split_bytes", small, remaining.size)
                self._bump("inactive_split", small, 1)
        elif already_split:
            self._bump("inactive_split_bytes", small, -block.size)
            self._bump("inactive_split", small, -1)
        block.allocated = True
        block.requested_size = orig_size
        block.frames = frames
        n0, n1, b0, b1, a0, a1, ab0, ab1, r0, r1 = self._hot[small]
        size = block.size
        _up(n0, n1, 1)
        _up(b0, b1, size)
        _up(a0, a1, 1)
        _up(ab0, ab1, size)
        _up(r0, r1, orig_size)
        if block.size >= self.max_split_size:
            self.oversize_allocations.increase(1)
        if self.trace is not None:  # (a call saved per malloc and free)
            self._record("alloc", block.ptr, block.size, frames)
        return block

    def free(self, block: Block) -> None:
        """Return ``block`` to its pool (``free`` + ``free_block``), merging free neighbours."""
        if not block.allocated:
            raise ValueError("double free of a simulated allocator block")
        small = block.small
        block.allocated = False
        if self.trace is not None:  # (a call saved per malloc and free)
            self._record("free_requested", block.ptr, block.size, block.frames)
        n0, n1, b0, b1, a0, a1, ab0, ab1, r0, r1 = self._hot[small]
        _down(n0, n1, 1)
        _down(b0, b1, block.size)
        _down(r0, r1, block.requested_size)
        if block.size >= self.max_split_size:
            self.oversize_allocations.decrease(1)
        orig_ptr, orig_size, frames = block.ptr, block.size, block.frames
        pool = self._small if small else self._large
        net_blocks, net_bytes = 0, 0
        for cand in (block.prev, block.next):
            merged = self._try_merge(block, cand, pool)
            if merged:
                net_blocks -= 1
                net_bytes -= merged
        pool.insert(block)
        if block.is_split:
            net_blocks += 1
            net_bytes += block.size
        if net_blocks:
            self._bump("inactive_split", small, net_blocks)
        if net_bytes:
            self._bump("inactive_split_bytes", small, net_bytes)
        _down(a0, a1, 1)
        _down(ab0, ab1, orig_size)
        block.frames = ()
        if self.trace is not None:  # (a call saved per malloc and free)
            self._record("free_completed", orig_ptr, orig_size, frames)

    def _try_merge(self, dst: Block, src: Block | None, pool: _Pool) -> int:
        if src is None or src.allocated:
            return 0
        pool.erase(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
            else:
                self._segments[dst.segment_ptr] = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def empty_cache(self) -> None:
        """``release_cached_blocks``: free every segment that is one free block."""
        self.counters["num_sync_all_streams"] += 1
        for pool in (self._large, self._small):
            for b in [b for b in pool.blocks.values() if not b.is_split]:
                pool.erase(b)
                del self._segments[b.segment_ptr]
                del self._segment_size[b.segment_ptr]
                self._bump("segment", b.small, -1)
                self._bump("reserved_bytes", b.small, -b.size)
                if b.size >= self.max_split_size:
                    self.oversize_segments.decrease(1)
                self.counters["num_device_free"] += 1
                self._record("segment_free", b.ptr, b.size, ())

    # -- statistics -----------------------------------------------------------------------

    def reset_peak_stats(self) -> None:
        for stats in self.stats.values():
            for s in stats:
                s.peak = s.current
        for s in (self.oversize_allocations, self.oversize_segments):
            s.peak = s.current

    def reset_accumulated_stats(self) -> None:
        for stats in self.stats.values():
            for s in stats:
                s.allocated = s.freed = 0
        for s in (self.oversize_allocations, self.oversize_segments):
            s.allocated = s.freed = 0
        for k in ("num_alloc_retries", "num_ooms", "num_sync_all_streams"):
            self.counters[k] = 0
        self.counters["num_device_alloc"] = self.counters["num_device_free"] = 0

    def stats_nested(self) -> dict[str, Any]:
        """What ``torch._C._cuda_memoryStats`` returns (``memory_stats_as_nested_dict``)."""

        def one(s: Stat) -> dict[str, int]:
            return {
                "current": s.current,
                "peak": s.peak,
                "allocated": s.allocated,
                "freed": s.freed,
            }

        out: dict[str, Any] = dict(self.counters)
        for name, stats in self.stats.items():
            out[name] = {p: one(s) for p, s in zip(_POOLS, stats, strict=True)}
        out["oversize_allocations"] = one(self.oversize_allocations)
        out["oversize_segments"] = one(self.oversize_segments)
        out["max_split_size"] = -1 if self.max_split_size == NO_SPLIT_LIMIT else self.max_split_size
        return out

    def memory_stats(self) -> dict[str, Any]:
        """``torch.cuda.memory_stats()``: the nested figures flattened to ``"a.b.c"`` keys,
        sorted."""
        flat: list[tuple[str, Any]] = []

        def walk(prefix: str, v: Any) -> None:
            if isinstance(v, dict):
                for k, x in v.items():
                    walk(f"{prefix}.{k}" if prefix else k, x)
            else:
                flat.append((prefix, v))

        walk("", self.stats_nested())
        return dict(sorted(flat))

    @property
    def allocated_bytes(self) -> int:
        return self.stats["allocated_bytes"][0].current

    @property
    def reserved_bytes(self) -> int:
        return self.stats["reserved_bytes"][0].current

    # -- snapshot -------------------------------------------------------------------------

    def _blocks(self, first: Block) -> Iterator[Block]:
        b: Block | None = first
        while b is not None:
            yield b
            b = b.next

    def snapshot(self) -> dict[str, Any]:
        """``torch.cuda.memory._snapshot()``'s dict: segments (address order) with their
        blocks and frames, and the recorded trace (empty unless ``record_history``)."""
        segments = []
        for ptr in sorted(self._segments):
            blocks = list(self._blocks(self._segments[ptr]))
            small = blocks[0].small
            alloc = sum(b.size for b in blocks if b.allocated)
            segments.append(
                {
                    "device": 0,
                    "address": ptr,
                    "total_size": self._segment_size[ptr],
                    "allocated_size": alloc,
                    "active_size": alloc,
                    "requested_size": sum(b.requested_size for b in blocks if b.allocated),
                    "stream": 0,
                    "segment_type": "small" if small else "large",
                    "segment_pool_id": (0, 0),
                    "is_expandable": False,
                    "frames": [],
                    "blocks": [
                        {
                            "address": b.ptr,
                            "size": b.size,
                            "requested_size": b.requested_size if b.allocated else b.size,
                            "state": "active_allocated" if b.allocated else "inactive",
                            "frames": _frame_dicts(b.frames),
                        }
                        for b in blocks
                    ],
                }
            )
        return {
            "segments": segments,
            "device_traces": [list(self.trace or [])],
            "allocator_settings": {
                "PYTORCH_CUDA_ALLOC_CONF": "",
                "max_split_size": self.stats_nested()["max_split_size"],
                "garbage_collection_threshold": 0.0,
                "expandable_segments": False,
                "roundup_power2_divisions": {},
            },
        }


def _frame_dicts(frames: tuple[Frame, ...]) -> list[dict[str, Any]]:
    return [{"filename": f, "line": n, "name": fn} for f, n, fn in frames]
