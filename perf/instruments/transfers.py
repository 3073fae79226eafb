"""Copies between host and device memory (``perf.count_transfers``)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from perf.instruments.live import Live
from perf.instruments.modes import CountingDispatchMode, decomposed

aten = torch.ops.aten

# --------------------------------------------------------------------------------------------
# transfers


@dataclass(frozen=True)
class TransferCount:
    """Copies between host and device memory seen in the block."""

    h2d_copies: int
    h2d_bytes: int
    d2h_copies: int
    d2h_bytes: int
    pinned_h2d_copies: int
    pageable_h2d_copies: int
    non_blocking_h2d_copies: int
    #: copies from one device to another (``cuda:0`` -> ``cuda:1``, ``sim:0`` -> ``sim:1``)
    d2d_copies: int = 0
    d2d_bytes: int = 0


def _index(device: torch.device) -> int:
    """A device's index; none given means the current device of its type, as in a copy."""
    if device.index is not None:
        return device.index
    return torch.get_device_module(device.type).current_device()


class _TransferMode(CountingDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.c: Counter[str] = Counter()

    def _note(
        self,
        src: torch.Tensor,
        dst_dev: torch.device,
        non_blocking: bool,
        nbytes: int = -1,
        dst: tuple[int, torch.dtype] | None = None,
    ) -> None:
        """One host-device copy; ``dst`` is the destination's (numel, dtype) where known."""
        s, d = src.device.type, dst_dev.type
        # between meta tensors: no data, one "device" (FSDP2 shards a model built on meta with
        # copy_ between meta tensors; the meta device has no module to ask for an index)
        if s == d and (s in ("cpu", "meta") or _index(src.device) == _index(dst_dev)):
            return
        if nbytes < 0:
            numel, dtype = dst if dst is not None else (src.numel(), src.dtype)
            # cuda/Copy.cu copy_kernel_cuda: a copy needing a cast or a broadcast goes through
            # a contiguous temporary of the destination's size; the cast happens on the device
            # for host-to-device and non-blocking copies, on the host for blocking
            # device-to-host ones, so that many elements of that dtype cross the bus.
            on_device_cast = d != "cpu" or non_blocking
            nbytes = numel * (dtype if on_device_cast else src.dtype).itemsize
        if nbytes == 0:
            return  # Copy.cpp copy_impl returns before copy_stub: no cudaMemcpy
        if s == "cpu":
            self.c["h2d_copies"] += 1
            self.c["h2d_bytes"] += nbytes
            pinned = src.is_pinned()
            self.c["pinned_h2d_copies" if pinned else "pageable_h2d_copies"] += 1
            if non_blocking:
                self.c["non_blocking_h2d_copies"] += 1
        elif d == "cpu":
            self.c["d2h_copies"] += 1
            self.c["d2h_bytes"] += nbytes
        else:
            self.c["d2d_copies"] += 1
            self.c["d2d_bytes"] += nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = decomposed(self, func, args, kwargs)  # to() under inference_mode: its _to_copy
        if out is not NotImplemented:
            return out
        if func is aten._to_copy.default and kwargs.get("device") is not None:
            src = args[0]
            dtype = kwargs.get("dtype") or src.dtype
            nb = bool(kwargs.get("non_blocking"))
            dev = torch.device(kwargs["device"])
            if src.is_sparse:
                # TensorConversions.cpp _to_copy of a sparse COO tensor: its indices and its
                # values, each copied (no bytes for the dense size it describes)
                i, v = src._indices(), src._values()
                self._note(i, dev, nb, dst=(i.numel(), i.dtype))
                self._note(v, dev, nb, dst=(v.numel(), dtype))
            else:
                self._note(src, dev, nb, dst=(src.numel(), dtype))
        elif func is aten.lift_fresh.default and not args[0].is_cpu:
            # Python data made into a device tensor (torch.tensor(list, device=dev),
            # x.new_tensor(list), an index from a list or range: x[[0, 1]]): tensor_new.cpp
            # internal_new_from_data builds it on the host and copies it with non_blocking=False,
            # below the Python dispatch modes; lift_fresh of the result is what they see.
            host = torch.empty(0, dtype=args[0].dtype)  # a pageable, blocking source
            self._note(host, args[0].device, False, nbytes=args[0].nbytes)
        elif func is aten.copy_.default:
            nb = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            dst = args[0]
            self._note(args[1], dst.device, bool(nb), dst=(dst.numel(), dst.dtype))
        return func(*args, **kwargs)

    def result(self) -> TransferCount:
        return TransferCount(**{k: int(self.c[k]) for k in TransferCount.__dataclass_fields__})


class _TransferProxy(Live):
    def __init__(self, mode: _TransferMode) -> None:
        self._mode = mode

    def _snapshot(self) -> TransferCount:
        return self._final if self._final is not None else self._mode.result()


@contextlib.contextmanager
def count_transfers() -> Iterator[_TransferProxy]:
    """Count host-to-device and device-to-host copies and bytes (pinned vs pageable).

    The device side is any device but the CPU: ``cuda``, ``perf.simulated_device()`` (exactly
    the copies the same code makes on ``cuda:0``), and ``meta`` (bytes and copy counts without
    data). ``torch.tensor(data, device=dev)``, ``x.new_tensor(data)`` and an index built from
    a Python list or range (``x[[0, 1]]``) are each a pageable host-to-device copy.
    """
    mode = _TransferMode()
    proxy = _TransferProxy(mode)
    try:
        with mode:
            yield proxy
    finally:
        proxy._final = mode.result()
