"""CUDA-named device management and NCCL on ``sim``: ``torch.cuda.set_device``,
``current_device``, ``device_count``, ``init_process_group("nccl")`` and
``torch.load(map_location="cuda:N")`` act on ``sim`` where
``sim`` stands in for CUDA (the ``as_cuda`` opt-in of :mod:`perf.sim.amp`).

Why: the distributed training scripts people copy name CUDA and NCCL. PyTorch's own DDP
tutorial series (``multigpu.py``, ``multigpu_torchrun.py``) starts each rank with
``torch.cuda.set_device(rank)`` and ``init_process_group(backend="nccl")`` and sizes the job
with ``world_size = torch.cuda.device_count()``. On a CPU-only box the first raises
(``torch._C`` has no ``_cuda_setDevice``), the second has no NCCL, and the third is 0, so
``mp.spawn(..., nprocs=0)`` trains nothing and exits 0; resuming from a snapshot loads it
with ``map_location=f"cuda:{rank}"``. With ``sim`` standing in, the rank's
index selects ``sim:i``, NCCL's place is taken by the ``sim`` backend
(:mod:`perf.sim.distributed`, which counts all-reduce calls and bytes as NCCL gets them) and
the device count is ``sim``'s.

Not mapped: ``torch.cuda.is_available()`` stays False (code that branches on it takes its CPU
branch), and a tensor placed with a ``"cuda"`` string or device cannot be redirected (torch
parses it in C++): scripts that place by index (``.to(rank)``), as the tutorials do, run.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from perf.sim import amp, ordinals

__all__ = ["backend_for", "location_for", "patch"]

_patched = False


def _index(device: Any) -> int:
    """The ``sim`` index a CUDA device name stands for (``1``, ``"cuda:1"``,
    ``torch.device("cuda", 1)``; no index: the current device)."""
    if isinstance(device, int):
        return ordinals.check(device) if device >= 0 else ordinals.current()
    if device is None:
        return ordinals.current()
    d = torch.device(device)
    if d.type not in ("cuda", ordinals.NAME):
        raise ValueError(f"expected a cuda device (standing in: {ordinals.NAME}), got {d}")
    return ordinals.current() if d.index is None else ordinals.check(d.index)


def backend_for(backend: Any) -> Any:
    """``backend`` with NCCL's place given to ``sim`` (``"nccl"`` -> ``"sim"``,
    ``"cpu:gloo,cuda:nccl"`` -> ``"cpu:gloo,sim:sim"``) while ``sim`` stands in for CUDA;
    anything else as it is."""
    if not isinstance(backend, str) or not amp.standing_in():
        return backend
    if backend.lower() == "nccl":
        return ordinals.NAME
    parts = []
    for part in backend.split(","):
        dev, _, name = part.partition(":")
        if name.lower() == "nccl" and dev.strip().lower() == "cuda":
            part = f"{ordinals.NAME}:{ordinals.NAME}"
        parts.append(part)
    return ",".join(parts)


def location_for(where: Any) -> Any:
    """A ``torch.load`` ``map_location`` with CUDA's place given to ``sim`` (``"cuda:1"`` ->
    ``"sim:1"``, also as ``torch.device`` and as a dict's values) while ``sim`` stands in for
    CUDA; anything else (None, a function, ``"cpu"``) as it is."""
    if not amp.standing_in():
        return where
    if isinstance(where, dict):
        return {k: location_for(v) for k, v in where.items()}
    if isinstance(where, (str, torch.device)):
        try:
            d = torch.device(where)
        except (RuntimeError, ValueError):
            return where
        if d.type == "cuda":
            return torch.device(ordinals.NAME, d.index) if d.index is not None else ordinals.NAME
    return where


def patch() -> None:
    """Install the mappings (idempotent); each is inert unless ``sim`` stands in for CUDA
    in this process now (:func:`perf.sim.amp.standing_in`), so the real functions answer a
    process that has CUDA."""
    global _patched
    if _patched:
        return
    cuda = torch.cuda
    plain_set, plain_current, plain_count = cuda.set_device, cuda.current_device, cuda.device_count

    @functools.wraps(plain_set)
    def set_device(device: Any) -> None:
        if not amp.standing_in():
            return plain_set(device)
        ordinals.set_current(_index(device))

    @functools.wraps(plain_current)
    def current_device() -> int:
        return ordinals.current() if amp.standing_in() else plain_current()

    @functools.wraps(plain_count)
    def device_count() -> int:
        return ordinals.count if amp.standing_in() else plain_count()

    cuda.set_device, cuda.current_device, cuda.device_count = (
        set_device,
        current_device,
        device_count,
    )

    plain_load = torch.serialization.load

    @functools.wraps(plain_load)
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        return plain_load(f, location_for(map_location), *args, **kwargs)

    torch.serialization.load = load
    if torch.load is plain_load:
        torch.load = load

    import torch.distributed as dist

    if not dist.is_available():
        _patched = True
        return
    c10d = dist.distributed_c10d
    # where each function takes ``backend`` positionally
    for name, at in (("init_process_group", 0), ("new_group", 2)):
        plain = getattr(c10d, name)

        def mapped(*args: Any, __plain: Any = plain, __at: int = at, **kwargs: Any) -> Any:
            if "backend" in kwargs:
                kwargs["backend"] = backend_for(kwargs["backend"])
            elif len(args) > __at:
                args = (*args[:__at], backend_for(args[__at]), *args[__at + 1 :])
            return __plain(*args, **kwargs)

        functools.update_wrapper(mapped, plain)
        setattr(c10d, name, mapped)
        if getattr(dist, name, None) is plain:
            setattr(dist, name, mapped)
    _patched = True
