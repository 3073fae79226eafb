"""Device-agnostic APIs on ``sim``: ``torch.accelerator.*`` and ``torch.get_device_module``.

Why: programs written against the modern device-agnostic APIs
(``torch.accelerator.current_accelerator()``, ``torch.accelerator.synchronize()``,
``torch.get_device_module(dev).device_count()``) must run unchanged on ``sim``. Most of
``torch.accelerator`` already works through the Python ``PrivateUse1`` hooks; two calls go to
C++ device-guard methods the Python backend cannot override and raise "Backend doesn't
support ...": they are answered here when the device in question is ``sim``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from perf.sim.tensors import NAME

#: torch.accelerator.get_device_capability's answer for sim: the dtypes its kernels take
_CAPABILITY: dict[str, Any] = {
    "supported_dtypes": [
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    ]
}


def _is_sim(device: Any) -> bool:
    if device is None or isinstance(device, int):
        acc = torch.accelerator.current_accelerator()
        return acc is not None and acc.type == NAME
    return torch.device(device).type == NAME


def _install_accelerator() -> None:
    acc = torch.accelerator
    plain_sync, plain_cap = acc.synchronize, acc.get_device_capability

    def synchronize(device: Any = None, /) -> None:
        if _is_sim(device):
            return None  # all simulated work is synchronous; CUDA's sync debug mode does not
            # flag cudaDeviceSynchronize (c10/cuda/CUDAFunctions.cpp device_synchronize)
        return plain_sync(device)

    def get_device_capability(device: Any = None, /) -> dict[str, Any]:
        if _is_sim(device):
            return {k: list(v) for k, v in _CAPABILITY.items()}
        return plain_cap(device)

    synchronize.__doc__, get_device_capability.__doc__ = plain_sync.__doc__, plain_cap.__doc__
    acc.synchronize = synchronize
    acc.get_device_capability = get_device_capability  # type: ignore[assignment]


class _DeviceContext:
    """``torch.sim.device(i)``: as ``torch.cuda.device``, for the one device there is."""

    def __init__(self, device: Any) -> None:
        index = device if isinstance(device, int) or device is None else torch.device(device).index
        if index not in (None, -1, 0):
            raise ValueError(f"{NAME} has one device, {NAME}:0; got {device!r}")

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@contextlib.contextmanager
def _stream(stream: Any = None) -> Iterator[None]:
    """``torch.sim.stream(s)``: one stream, so entering it changes nothing."""
    yield


def _current_stream(device: Any = None) -> torch.Stream:
    return torch.accelerator.current_stream()


def _get_device_name(device: Any = None) -> str:
    return "perf simulated accelerator (host memory, CPU kernels)"
