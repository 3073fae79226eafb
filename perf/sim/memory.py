"""CUDA's memory figures on ``sim``: the caching-allocator model driven by sim storages.

Why: ``torch.cuda.memory_allocated()`` and friends are decided by the program's allocations
and frees; on a CPU-only box the ``sim`` device makes the same ones, so feeding them to
:class:`perf.sim.allocator.CachingAllocator` answers CUDA's questions with CUDA's answers.

Wiring (the hooks the rest of ``perf.sim`` calls):

- allocation: :func:`_on_host_storage`, called where a sim storage gets its host storage
  (``perf.sim.tensors._repoint``). The allocation is the *host storage* (sim views share it);
  its free is a weak-reference callback when the last sim storage holding it dies (CPython
  frees by reference count: in program order). A host storage that was resized in place
  (``resize_``) is a free of the old block and an allocation of the new size, as on CUDA.
- cuBLAS / cuBLASLt workspaces (``aten/src/ATen/cuda/CublasHandlePool.cpp``,
  ``setWorkspaceForHandle`` / ``getCUDABlasLtWorkspace``): the first BLAS op allocates the
  cuBLAS workspace (``getChosenWorkspaceSize``: 32 MiB on sm90, else 4096 KiB * 2 + 16 KiB * 8,
  or ``CUBLAS_WORKSPACE_CONFIG``); the first ``addmm`` with a bias vector (the
  ``gemm_and_bias`` cuBLASLt path) also the cuBLASLt workspace (``CUBLASLT_WORKSPACE_SIZE``,
  1024 KiB, at most the cuBLAS size). Both live for the process, as the per-(handle, stream)
  maps keep them; ``configure()`` changes the assumption.
- autocast's weight-cast cache (``cached_cast`` in ``aten/src/ATen/autocast_mode.cpp``): casts
  of fp32 leaf tensors that require grad to the autocast dtype are cached while autocast is
  on and dropped at the outermost region's exit (``torch.clear_autocast_cache``).
- the memory API (``torch.sim.memory_*``, ``torch.accelerator.memory_*``):
  :mod:`perf.sim.memory_api`.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import perf.sim.kernels as kernels
import perf.sim.tensors as tensors
from perf.sim.allocator import Block, CachingAllocator, Frame
from perf.sim.kernel_syncs import SIM_CAPABILITY

NAME = tensors.NAME
_BLOCK = "_perf_sim_block"  # attribute of a host storage's Python object: [its Block | None]
_lock = threading.RLock()


@dataclass(frozen=True)
class MemoryModelConfig:
    """The assumptions of the memory model (defaults: what an H100, sm90, gets)."""

    #: cuBLAS workspace per handle and stream (``getChosenWorkspaceSize``)
    cublas_workspace_bytes: int = 32 << 20
    #: cuBLASLt workspace (``getCUDABlasLtWorkspaceSize``); 0: unified with cuBLAS's
    cublaslt_workspace_bytes: int = 1 << 20
    #: ``PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb`` in bytes; None: no limit (default)
    max_split_size_bytes: int | None = None
    #: device memory; None: unbounded (no out-of-memory errors)
    capacity_bytes: int | None = None

    @staticmethod
    def for_arch(major: int, minor: int = 0) -> MemoryModelConfig:
        """The defaults torch picks on compute capability ``major.minor``, with the
        ``CUBLAS_WORKSPACE_CONFIG`` / ``CUBLASLT_WORKSPACE_SIZE`` environment applied."""
        sm90 = (major, minor) == (9, 0)
        cublas = 4096 * 8 * 1024 if sm90 else 4096 * 1024 * 2 + 16 * 1024 * 8
        env = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        if env:
            pairs = re.findall(r":([0-9]+):([0-9]+)", env)
            if pairs:
                cublas = sum(int(s) * 1024 * int(c) for s, c in pairs)
        lt = int(os.environ.get("CUBLASLT_WORKSPACE_SIZE", "1024")) * 1024
        if os.environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "") in ("1", "true", "TRUE"):
            lt = 0
        return MemoryModelConfig(cublas_workspace_bytes=cublas, cublaslt_workspace_bytes=lt)


class _State:
    def __init__(self, config: MemoryModelConfig) -> None:
        self.config = config
        #: the model behind sim:0 (``sim:i``'s: :meth:`device`)
        self.allocator = self._new_allocator()
        self.devices: dict[int, CachingAllocator] = {0: self.allocator}
        #: (kind, device index) -> the BLAS workspace block (one per device, as per handle)
        self.workspaces: dict[tuple[str, int], Block | None] = {}
        self.frames = False  # capture stacks for each allocation (history / leak sites)

    def _new_allocator(self) -> CachingAllocator:
        return CachingAllocator(
            max_split_size=self.config.max_split_size_bytes,
            capacity_bytes=self.config.capacity_bytes,
        )

    def device(self, index: int) -> CachingAllocator:
        """The model behind ``sim:index``: each device has its own caching allocator and
        statistics, as each CUDA device has its ``DeviceCachingAllocator``."""
        _replay()
        return self._device(index)

    def _device(self, index: int) -> CachingAllocator:
        alloc = self.devices.get(index)
        if alloc is None:
            alloc = self.devices[index] = self._new_allocator()
        return alloc


_state = _State(MemoryModelConfig.for_arch(*SIM_CAPABILITY))
#: the weak references whose callbacks free the blocks of live host storages (module-wide:
#: they must outlive a model replaced by ``configure``)
_refs: dict[int, weakref.ref[Any]] = {}


def allocator(index: int = 0) -> CachingAllocator:
    """The model behind ``sim:index`` (default ``sim:0``). With ``sim``'s C++ path the model
    catches up with the program when read: this call replays what happened since, so take the
    figures from a new call (a ``stats`` dict kept from an earlier one shows that moment)."""
    return _state.device(index)


def configure(config: MemoryModelConfig, *, forget_live: bool = False) -> None:
    """Replace the model's assumptions; only while no sim storage is alive (the figures of
    live storages would otherwise be wrong). ``forget_live=True`` starts a fresh model anyway:
    storages alive now are not counted by it (for tests that want a new process's view)."""
    global _state
    with _lock:
        _replay()
        live = sum(a.allocated_bytes for a in _state.devices.values())
        if not forget_live and live - _workspace_bytes() > 0:
            raise RuntimeError(
                "perf.sim.memory.configure(): sim tensors are alive; configure the memory model "
                "before creating any (e.g. in conftest.py)"
            )
        _state = _State(config)
        _native_eager()
        _refresh_native_ops()


def reset(*, forget_live: bool = False) -> None:
    """A fresh model with the same assumptions (see :func:`configure`)."""
    configure(_state.config, forget_live=forget_live)


def state() -> _State:
    """The model's current state (its config, allocator and workspaces)."""
    _replay()
    return _state


# -- the C++ path's event log (perf.sim.native) -----------------------------------------------

#: block id of the C++ log -> (its Block, or None for 0 bytes; the allocator that holds it)
_native_blocks: dict[int, tuple[Block | None, CachingAllocator]] = {}
#: events drained from the C++ log and not applied yet (an out-of-memory error stops a replay)
_pending: list[tuple[int, int, int, int]] = []


def _replay() -> None:
    """Apply the C++ path's allocations and frees to the model, in program order (a no-op
    without it).

    Why lazily: the model's malloc and free cost about 8 us of Python each; the C++ path logs
    them and the model catches up whenever it is read (every figure of the memory API, the
    snapshot, a BLAS workspace), so what it answers is what it would have answered op by op.
    Out-of-memory errors and stack capture need the model at the allocation itself: then the
    C++ path replays after every allocation (:func:`_native_eager`)."""
    nat = tensors.native
    if nat is None:
        return
    with _lock:
        events = _pending + nat.drain() if _pending else nat.drain()
        _pending.clear()
        devices, frames = _state.devices, _state.frames
        blocks = _native_blocks
        i = 0
        try:
            for kind, bid, n, dev in events:
                i += 1
                if kind:
                    alloc = devices.get(dev) or _state._device(dev)
                    blocks[bid] = (alloc.malloc(n, _stack(2) if frames else ()), alloc)
                else:
                    entry = blocks.pop(bid, None)
                    if entry is not None and entry[0] is not None and entry[0].allocated:
                        entry[1].free(entry[0])
        finally:
            if i < len(events):  # an out-of-memory error: the rest waits for the next read
                _pending.extend(events[i:])


def _native_eager() -> None:
    """Replay at each allocation when the model must see it then: stacks are captured, or the
    device has a capacity (its out-of-memory error belongs to the op that allocates)."""
    if tensors.native is not None:
        tensors.native.set_eager(bool(_state.frames or _state.config.capacity_bytes is not None))


def _workspace_bytes() -> int:
    return sum(b.size for b in _state.workspaces.values() if b is not None)


def capture_frames(enabled: bool) -> bool:
    """Turn stack capture per allocation on or off; returns the previous setting."""
    prev = _state.frames
    if tensors.native is not None and enabled != prev:
        _replay()  # what was allocated before has no stack
    _state.frames = enabled
    _native_eager()
    return prev


def _stack(depth: int = 2) -> tuple[Frame, ...]:
    # the C++ path replays from autograd's device thread too, where the replay's own frame may
    # be the only one: then the stack is empty (as a backward's allocations have no user frame)
    try:
        f = sys._getframe(depth)
    except ValueError:
        return ()
    out = []
    while f is not None:
        out.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back  # type: ignore[assignment]
    return tuple(out)


# -- the allocation hook ----------------------------------------------------------------------

#: a host storage's size: the C method itself (``UntypedStorage.nbytes`` is patched to answer
#: for sim storages, a Python frame more on every allocation)
_nbytes = torch._C.StorageBase.nbytes  # type: ignore[attr-defined]


def _on_host_storage(host: Any, index: int = 0) -> None:
    """A sim storage now holds ``host``: a new allocation unless it is known at its size."""
    holder = getattr(host, _BLOCK, None)
    n = _nbytes(host)
    if holder is not None:
        old, owner = holder
        if (old.requested_size if old is not None else 0) == n:
            return
        with _lock:  # resized in place: CUDA allocates the new block, then frees the old
            alloc = owner
            holder[:] = [alloc.malloc(n, _stack() if _state.frames else ()), alloc]
            if old is not None and old.allocated:
                owner.free(old)
        return
    with _lock:
        alloc = _state.device(index)
        holder = [alloc.malloc(n, _stack() if _state.frames else ()), alloc]
        setattr(host, _BLOCK, holder)

        def dead(r: Any, holder: list[Any] = holder) -> None:
            _refs.pop(id(r), None)
            b, owner = holder
            if b is not None and b.allocated:
                with _lock:
                    owner.free(b)

        r = weakref.ref(host, dead)
        _refs[id(r)] = r


# -- cuBLAS / cuBLASLt workspaces -------------------------------------------------------------


def _workspace(kind: str, size: int, index: int) -> None:
    if (kind, index) in _state.workspaces:
        return
    with _lock:
        frames = _stack() if _state.frames else ()
        block = _state.device(index).malloc(size, frames) if size else None
        _state.workspaces[kind, index] = block
    _refresh_native_ops()


def _refresh_native_ops() -> None:
    """The C++ path leaves an op with an after-op hook to Python until the hook has nothing
    left to do (its workspaces exist on ``sim:0``)."""
    if tensors.native is None:
        return
    ws = _state.workspaces
    done = {
        _after_blas: ("cublas", 0) in ws,
        _after_addmm: ("cublas", 0) in ws and ("cublaslt", 0) in ws,
    }
    kernels.set_native_python_ops(op for op, h in kernels.after_op.items() if not done.get(h))


def _index_of(args: tuple[Any, ...]) -> int:
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == NAME:
            return a.device.index or 0
    return 0


def _after_blas(op: Any, args: tuple[Any, ...]) -> None:
    _workspace("cublas", _state.config.cublas_workspace_bytes, _index_of(args))


def _after_addmm(op: Any, args: tuple[Any, ...]) -> None:
    index = _index_of(args)
    _workspace("cublas", _state.config.cublas_workspace_bytes, index)
    if ("cublaslt", index) in _state.workspaces or len(args) < 3:
        return
    bias, m1, m2 = args[0], args[1], args[2]
    if (
        isinstance(bias, torch.Tensor)
        and bias.dim() == 1
        and m1.dim() == 2
        and m2.dim() == 2
        and min(*m1.shape, *m2.shape) > 1
        and bias.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    ):
        lt = min(_state.config.cublaslt_workspace_bytes, _state.config.cublas_workspace_bytes)
        _workspace("cublaslt", lt, index)


_aten = torch.ops.aten
#: op -> called after it ran on sim (the BLAS handles' workspaces)
AFTER_OP: dict[Any, Callable[[Any, tuple[Any, ...]], None]] = {
    **{
        getattr(getattr(_aten, n), o): _after_blas
        for n in ("mm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot")
        for o in ("default", "out")
    },
    _aten.addmm.default: _after_addmm,
    _aten.addmm.out: _after_addmm,
    # with out_dtype (CUDA-only kernels, perf.sim.cuda_ops): Blas.cpp runs them through
    # addmm_out_cuda_impl, on the same handles
    **{
        getattr(getattr(_aten, n), o): _after_addmm if n == "addmm" else _after_blas
        for n in ("mm", "bmm", "addmm", "baddbmm")
        for o in ("dtype", "dtype_out")
        if hasattr(getattr(_aten, n), o)
    },
}


# -- autocast's weight-cast cache -------------------------------------------------------------

_cast_cache: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}


def cached_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``at::autocast::cached_cast``: fp32 leaf weights cast to the autocast dtype once per
    autocast region."""
    can_cache = (
        dtype == torch.get_autocast_dtype(NAME)
        and x.dtype == torch.float32
        and x.requires_grad
        and x.is_leaf
        and not x._is_view()
        and torch.is_autocast_cache_enabled()
    )
    if not can_cache:
        return torch.ops.aten._to_copy.default(x, dtype=dtype)
    hit = _cast_cache.get(id(x))
    if hit is not None and hit[0]() is x:
        return hit[1]
    out = torch.ops.aten._to_copy.default(x, dtype=dtype)
    _cast_cache[id(x)] = (weakref.ref(x), out)
    return out


def clear_cast_cache() -> None:
    _cast_cache.clear()


def install() -> None:
    """Connect the model to the sim device (called once by ``simulated_device()``, which also
    installs :func:`perf.sim.memory_api.patch_accelerator`)."""
    tensors.storage_hook = _on_host_storage
    kernels.set_after_op(AFTER_OP)
    if tensors.native is not None:
        tensors.native.set_replay(_replay)
        _native_eager()
        _refresh_native_ops()


def set_tracking(enabled: bool) -> None:
    """Connect (default) or disconnect the model. Disconnected, new storages are not seen and
    the figures stop being CUDA's: for measuring the model's own overhead only."""
    tensors.storage_hook = _on_host_storage if enabled else None
    kernels.set_after_op(AFTER_OP if enabled else {})
    if tensors.native is not None:
        _replay()
        tensors.native.set_tracking(enabled)
        _refresh_native_ops()


def live_blocks(index: int = 0) -> list[Block]:
    """The allocated blocks of ``sim:index``'s model now (address order)."""
    out = []
    alloc = _state.device(index)
    for ptr in sorted(alloc._segments):
        b: Block | None = alloc._segments[ptr]
        while b is not None:
            if b.allocated:
                out.append(b)
            b = b.next
    return out


def workspace_blocks() -> set[int]:
    """ids of the BLAS workspace blocks (not the program's tensors)."""
    return {id(b) for b in _state.workspaces.values() if b is not None}
