"""``nn.DataParallel``'s device-to-device primitives on ``sim``: ``torch._C._broadcast``,
``_broadcast_coalesced``, ``_scatter``, ``_gather`` and their ``out=`` forms.

Why: ``torch.nn.parallel.comm`` calls them, and they are compiled only into CUDA builds
(``torch/csrc/cuda/comm.cpp``, bound in ``torch/csrc/cuda/python_comm.cpp``), so on a CPU build
``nn.DataParallel`` over several ``sim`` devices failed in its first scatter ("module
'torch._C' has no attribute '_scatter'"). These follow ``comm.cpp`` op for op, with copies
between ``sim`` devices (device-to-device transfers, no sync, as CUDA's peer copies on the
stream): the source device keeps its own tensor, every other device gets a copy; coalesced
broadcasts flatten each bucket of ``buffer_size`` bytes on the source device and unflatten
it on the others (NCCL's broadcast where CUDA has it moves the same bytes). Streams are
accepted and ignored: ``sim`` has one stream per device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._utils import (
    _flatten_dense_tensors,
    _reorder_tensors_as,
    _take_tensors,
    _unflatten_dense_tensors,
)

from perf.sim import ordinals
from perf.sim.tensors import NAME, is_sim

__all__ = ["install"]


def _device(index: int) -> torch.device:
    return torch.device(NAME, index)


def _index(t: torch.Tensor) -> int:
    return (t.device.index or 0) if is_sim(t) else -1


def _broadcast_out(tensor: torch.Tensor, out: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``comm.cpp`` ``_broadcast_out_impl``: each output gets a copy (non-blocking)."""
    for i, o in enumerate(out):
        if not is_sim(o):
            raise RuntimeError(
                f"Expected all output tensors to be {NAME} tensors, but output tensor at index "
                f"{i} has device '{o.device}'"
            )
        if o.shape != tensor.shape:
            raise RuntimeError(
                f"Expected all output tensors to have same shape as the source tensor "
                f"{tuple(tensor.shape)}, but output tensor has shape {tuple(o.shape)}"
            )
        o.copy_(tensor, non_blocking=True)
    return list(out)


def _broadcast(tensor: torch.Tensor, devices: Sequence[int]) -> list[torch.Tensor]:
    """``comm.cpp`` ``broadcast``: the source device (first in ``devices``) keeps ``tensor``."""
    if is_sim(tensor) and _index(tensor) != devices[0]:
        raise RuntimeError("device of broadcasted tensor must appear as the first on devices list")
    others = [torch.empty_like(tensor, device=_device(d)) for d in devices if d != _index(tensor)]
    _broadcast_out(tensor, others)
    copies = iter(others)
    return [tensor if d == _index(tensor) else next(copies) for d in devices]


def _broadcast_coalesced(
    tensors: Sequence[torch.Tensor], devices: Sequence[int], buffer_size: int
) -> list[list[torch.Tensor]]:
    """``comm.cpp`` ``broadcast_coalesced``: buckets of at most ``buffer_size`` bytes,
    flattened on the source device, broadcast, unflattened on each other device (detached
    tensors, as ``make_variable(var.tensor_data(), false)``); the source device keeps the
    inputs."""
    for t in tensors:
        if _index(t) != devices[0]:
            raise RuntimeError("All tensors must be on devices[0]: " + str(devices[0]))
    outputs: list[list[torch.Tensor]] = [list(tensors)] + [[] for _ in devices[1:]]
    dtypes = set()
    for chunk in _take_tensors(list(tensors), buffer_size):
        dtypes.add(chunk[0].dtype)
        if chunk[0].is_sparse:
            raise NotImplementedError(
                f"perf's simulated device does not broadcast sparse tensors between {NAME} "
                "devices (nn.DataParallel of a model with sparse parameters): count it on CUDA"
            )
        flat = _broadcast(_flatten_dense_tensors(chunk), devices)
        for i in range(1, len(devices)):
            outputs[i].extend(t.detach() for t in _unflatten_dense_tensors(flat[i], chunk))
    if len(dtypes) > 1:  # take_tensors grouped by type: put them back in order
        outputs = [list(_reorder_tensors_as(o, tensors)) for o in outputs]
    return outputs


def _scatter(
    tensor: torch.Tensor,
    devices: Sequence[int],
    chunk_sizes: Sequence[int] | None = None,
    dim: int = 0,
    streams: Any = None,
) -> list[torch.Tensor]:
    """``comm.cpp`` ``scatter``: chunks along ``dim``, each moved to its device
    (non-blocking; a chunk already there stays a view)."""
    if chunk_sizes is not None:
        chunks = list(tensor.split_with_sizes(list(chunk_sizes), dim))
    else:
        chunks = list(tensor.chunk(len(devices), dim))
    for i, d in enumerate(devices[: len(chunks)]):
        if d != _index(tensor):
            chunks[i] = chunks[i].to(_device(d), non_blocking=True)
    return chunks


def _scatter_out(
    tensor: torch.Tensor, out: Sequence[torch.Tensor], dim: int = 0, streams: Any = None
) -> list[torch.Tensor]:
    sizes = [o.size(dim) for o in out]
    if sum(sizes) != tensor.size(dim):
        raise RuntimeError(
            f"Total size for output tensors along scatter dim {dim} does not match the source "
            f"tensor size at dim {dim}: expected {tensor.size(dim)}, got {sum(sizes)}"
        )
    for o, chunk in zip(out, tensor.split_with_sizes(sizes, dim), strict=True):
        o.copy_(chunk, non_blocking=True)
    return list(out)


def _gather_out(tensors: Sequence[torch.Tensor], out: torch.Tensor, dim: int) -> torch.Tensor:
    """``comm.cpp`` ``_gather_out_impl``: each tensor copied into its slice (non-blocking)."""
    offset = 0
    for t in tensors:
        if not is_sim(t):
            raise RuntimeError(
                f"Expected all input tensors to be {NAME} tensors, but tensor has device "
                f"'{t.device}'"
            )
        out.narrow(dim, offset, t.size(dim)).copy_(t, non_blocking=True)
        offset += t.size(dim)
    return out


def _gather(tensors: Sequence[torch.Tensor], dim: int, destination: int | None) -> torch.Tensor:
    """``comm.cpp`` ``gather``: a new tensor on ``destination`` (None: the current device;
    -1: the host), the inputs concatenated along ``dim``."""
    first = tensors[0]
    size = list(first.shape)
    size[dim] = sum(t.size(dim) for t in tensors)
    if destination == -1:
        device = torch.device("cpu")
    else:
        device = _device(ordinals.current() if destination is None else destination)
    out = torch.empty(size, dtype=first.dtype, device=device)
    return _gather_out(tensors, out, dim)


_FUNCTIONS = {
    "_broadcast": _broadcast,
    "_broadcast_out": _broadcast_out,
    "_broadcast_coalesced": _broadcast_coalesced,
    "_scatter": _scatter,
    "_scatter_out": _scatter_out,
    "_gather": _gather,
    "_gather_out": _gather_out,
}


def install() -> None:
    """Give ``torch._C`` the functions a CPU build lacks (a CUDA build keeps its own)."""
    for name, fn in _FUNCTIONS.items():
        if not hasattr(torch._C, name):
            setattr(torch._C, name, fn)
