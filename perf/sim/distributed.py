"""Collectives on ``sim``: a ``torch.distributed`` process-group backend for the simulated
device, and the count of the collectives it ran (``count_collectives``).

Why: data-parallel training code (DDP, with ``no_sync``, gradient bucketing and
``broadcast_buffers``) must run unchanged with 2+ processes on a CPU-only box, where gloo
refuses ``sim`` tensors ("unsupported device type sim") and ``init_process_group()`` has no
default backend for ``sim``; and the collectives it makes (how many all-reduces, how many
bytes) are what a regression test wants to pin, as NCCL would make them.

How: backend ``"sim"`` is registered for the ``sim`` and ``cpu`` devices
(``torch.distributed.Backend.register_backend``), so ``init_process_group()`` without a
backend (the default backend of the current accelerator, ``sim``) and
``get_default_backend_for_device("sim")`` pick it. Its process group is a Python
``ProcessGroup`` riding gloo: each collective hands gloo the *host views* of its ``sim``
tensors (the CPU tensors over the same bytes), so results land in the ``sim`` tensors in place,
and CPU tensors go to gloo as they are. Each call runs to completion before it returns (``sim``
has no streams); its ``Work`` and future are complete and carry the caller's tensors, which is
what DDP's reducer and communication hooks read.

Counted (:func:`count_collectives`, this process's calls through the ``sim`` backend): one
call per collective the program (or DDP's C++ reducer) issues, as NCCL gets one
``ncclAllReduce`` per bucket; its bytes are those of the call's input tensors on this rank
(``count * sizeof(dtype)`` of NCCL's call: for all-reduce the bucket, for all-gather the
shard sent, for reduce-scatter the full input).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from perf.sim.kernels import collective_listeners
from perf.sim.tensors import NAME, host_view

__all__ = [
    "BACKEND",
    "COLLECTIVES_ENV",
    "CollectiveCount",
    "SimProcessGroup",
    "count_collectives",
    "register_backend",
]

#: the backend's name (``init_process_group("sim")``, ``"cpu:gloo,sim:sim"``)
BACKEND = "sim"

#: environment variable: a folder where each process writes its collective counts at exit
COLLECTIVES_ENV = "PERF_SIM_COLLECTIVES"

_counters: list[tuple[Counter[str], Counter[str]]] = []
_lock = threading.Lock()


@dataclass(frozen=True)
class CollectiveCount:
    """Collectives run through the ``sim`` backend in a block: calls and input bytes per
    collective (``"allreduce"``, ``"broadcast"``, ``"allgather"``, ...)."""

    calls: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    @property
    def allreduce_calls(self) -> int:
        return self.calls.get("allreduce", 0) + self.calls.get("allreduce_coalesced", 0)

    @property
    def allreduce_bytes(self) -> int:
        return self.bytes.get("allreduce", 0) + self.bytes.get("allreduce_coalesced", 0)


@contextlib.contextmanager
def count_collectives() -> Iterator[CollectiveCount]:
    """Count this process's collectives through the ``sim`` backend inside the block.

    The yielded object is filled in when the block ends (read it after the ``with``)::

        with count_collectives() as c:
            loss.backward()  # DDP all-reduces its gradient buckets
        c.allreduce_calls, c.allreduce_bytes
    """
    calls: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    out = CollectiveCount({}, {})
    pair = (calls, nbytes)
    with _lock:
        _counters.append(pair)
    try:
        yield out
    finally:
        with _lock:
            _counters.remove(pair)
        out.calls.update(calls)
        out.bytes.update(nbytes)


def report_at_exit(folder: str) -> None:
    """Count this process's collectives from now on and write them at exit to
    ``folder/collectives-rank{RANK}.json`` (``RANK`` as ``torchrun`` sets it, else the pid):
    how an unmodified script launched by ``python -m perf sim --collectives DIR`` is counted."""
    calls: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    with _lock:
        _counters.append((calls, nbytes))
    name = f"rank{os.environ['RANK']}" if "RANK" in os.environ else f"pid{os.getpid()}"

    def write() -> None:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"collectives-{name}.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({"calls": dict(calls), "bytes": dict(nbytes)}, fh)

    atexit.register(write)


def _record(name: str, tensors: list[torch.Tensor]) -> None:
    if not _counters:
        return
    n = sum(t.numel() * t.element_size() for t in tensors)
    with _lock:
        for calls, nbytes in _counters:
            calls[name] += 1
            nbytes[name] += n


@contextlib.contextmanager
def _no_python_modes() -> Iterator[None]:
    """The thread's Python dispatch and function modes off while gloo runs a collective.

    Why: gloo's work keeps the thread's state (its modes, Python objects) and may be freed on
    gloo's own thread, which then needs the GIL to release them; at the group's teardown the
    main thread joins that thread holding the GIL, and the process hangs (found with DDP
    under ``model_gpu_time``'s dispatch mode). gloo runs on host views: no mode of perf's
    counts what it does."""
    from torch.utils._python_dispatch import _disable_current_modes

    c = torch._C
    functions = [c._pop_torch_function_stack() for _ in range(c._len_torch_function_stack())]
    try:
        with _disable_current_modes():
            yield
    finally:
        for mode in reversed(functions):
            c._push_on_torch_function_stack(mode)


def _host(x: Any) -> Any:
    """Host views for ``sim`` tensors, in (nested) lists; everything else as it is."""
    if isinstance(x, torch.Tensor):
        return host_view(x) if x.device.type == NAME else x
    if isinstance(x, list):
        return [_host(v) for v in x]
    return x


def _flat(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat(v)]
    return []


class _DoneWork(dist.Work):
    """A collective that has completed; its future holds ``result`` (the caller's tensors)."""

    def __init__(self, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        return self._future


class _NoSplit:
    """A backend, as seen by Python callers that would split it or connect it eagerly."""

    supports_splitting = False

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


#: the base class, untyped: torch's stubs give the Python-facing signatures, while a Python
#: process group is called by the C++ trampoline as (tensors, options)
_ProcessGroup: Any = dist.ProcessGroup


class SimProcessGroup(_ProcessGroup):
    """The ``sim`` backend's process group: gloo over host views (see the module doc)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._gloo: Any = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._rank, self._size = rank, size
        # A process group keeps its name on its backends (ProcessGroup::setGroupName), so one
        # without any has none: DeviceMesh (FSDP2, DTensor) reads ``group_name``. The gloo
        # backend, registered for CPU tensors, carries it; sim tensors still come to the
        # methods below.
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)

    def getBackendName(self) -> str:
        return BACKEND

    def _get_backend(self, device: Any) -> Any:
        """The backend for ``device``: for ``sim`` the gloo backend under a view that says it
        cannot split. ``init_process_group(..., device_id=torch.device("sim", rank))`` (as
        PyTorch's FSDP2 example calls it) asks for the device's backend and, where it can
        split, connects it eagerly to that device, which gloo cannot do for ``sim``."""
        if torch.device(device).type == NAME:
            return _NoSplit(self._gloo)
        return super()._get_backend(device)

    def getRank(self) -> int:
        return self._rank

    def getSize(self) -> int:
        return self._size

    def _run(self, name: str, counted: Any, result: Any, *args: Any) -> _DoneWork:
        _record(name, _flat(counted))
        for listener in list(collective_listeners):
            listener(name, _flat(counted), self._size)
        with _no_python_modes():
            getattr(self._gloo, name)(*(_host(a) for a in args)).wait()
        return _DoneWork(_flat(result))

    # the collectives torch calls on a process group (C++ callers: DDP's reducer, its
    # parameter check and module-state broadcast; Python callers: torch.distributed.*)
    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> _DoneWork:
        return self._run("allreduce", tensors, tensors, tensors, opts)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> _DoneWork:
        return self._run("allreduce_coalesced", tensors, tensors, tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> _DoneWork:
        return self._run("broadcast", tensors, tensors, tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> _DoneWork:
        return self._run("reduce", tensors, tensors, tensors, opts)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any) -> _DoneWork:  # fmt: skip
        return self._run("allgather", inputs, outputs, outputs, inputs, opts)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> _DoneWork:
        return self._run("_allgather_base", input, output, output, input, opts)

    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> _DoneWork:
        return self._pairs("allgather_into_tensor_coalesced", "_allgather_base", outputs, inputs,
                           opts)  # fmt: skip

    def _pairs(self, name: str, each: str, outputs: list[torch.Tensor],
               inputs: list[torch.Tensor], opts: Any) -> _DoneWork:  # fmt: skip
        """A coalesced collective: one call (as NCCL's group), run by gloo pair by pair."""
        _record(name, list(inputs))
        with _no_python_modes():
            for out, inp in zip(outputs, inputs, strict=True):
                getattr(self._gloo, each)(_host(out), _host(inp), opts).wait()
        return _DoneWork(list(outputs))

    # torch >= 2.13's names for the single-tensor forms (all_gather_into_tensor and
    # reduce_scatter_tensor call these)
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any) -> _DoneWork:  # fmt: skip
        return self._run("_allgather_base", input, output, output, input, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any) -> _DoneWork:  # fmt: skip
        return self._run("_reduce_scatter_base", input, output, output, input, opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_splits: list[int], input_splits: list[int],
                          opts: Any) -> _DoneWork:  # fmt: skip
        return self._run(
            "alltoall_base", input, output, output, input, output_splits, input_splits, opts
        )

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> _DoneWork:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> _DoneWork:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any) -> _DoneWork:  # fmt: skip
        return self._run("gather", inputs, outputs, outputs, inputs, opts)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any) -> _DoneWork:  # fmt: skip
        return self._run("scatter", inputs, outputs, outputs, inputs, opts)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any) -> _DoneWork:  # fmt: skip
        return self._run("reduce_scatter", inputs, outputs, outputs, inputs, opts)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: Any) -> _DoneWork:  # fmt: skip
        return self._run("_reduce_scatter_base", input, output, output, input, opts)

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> _DoneWork:
        return self._pairs("reduce_scatter_tensor_coalesced", "_reduce_scatter_base", outputs,
                           inputs, opts)  # fmt: skip

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                      input_splits: list[int], opts: Any) -> _DoneWork:  # fmt: skip
        return self._run(
            "alltoall_base", input, output, output, input, output_splits, input_splits, opts
        )

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any) -> _DoneWork:  # fmt: skip
        return self._run("alltoall", inputs, outputs, outputs, inputs, opts)

    def barrier(self, opts: Any) -> _DoneWork:
        with _no_python_modes():
            self._gloo.barrier(opts).wait()
        return _DoneWork([])

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> _DoneWork:
        return self._run("send", tensors, [], tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> _DoneWork:
        return self._run("recv", [], tensors, tensors, src, tag)


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> SimProcessGroup:
    return SimProcessGroup(store, rank, size, timeout)


def register_backend() -> None:
    """Register backend ``"sim"`` for the ``sim`` device (and CPU tensors in its groups);
    called by ``simulated_device()``. Idempotent; a no-op without ``torch.distributed``."""
    if not dist.is_available() or not dist.is_gloo_available():
        return
    if BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _create, devices=[NAME, "cpu"])
