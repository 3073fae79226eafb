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
import time
from collections.abc import Iterator
from typing import Any

import torch

from perf.sim import ordinals
from perf.sim.kernels import notify
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


class SimStream(torch.Stream):
    """A ``sim`` stream: ``synchronize()`` is one sync, as on CUDA, where
    ``CUDAStream::synchronize`` -> ``c10::cuda::stream_synchronize`` (``CUDAFunctions.h``)
    calls ``warn_or_error_on_sync``."""

    def synchronize(self) -> None:
        notify("stream_synchronize")
        return super().synchronize()

    def record_event(self, event: Any = None) -> torch.Event:
        """A ``SimEvent`` (torch's own would be its base class, which cannot synchronize)."""
        if event is None:
            event = SimEvent(device=self.device)
        event.record(self)
        return event


class SimEvent(torch.Event):
    """A ``sim`` event: ``synchronize()`` waits for nothing (all work is done) and is no
    sync, as on CUDA (``CUDAEvent.h``: ``cudaEventSynchronize``, not flagged).
    ``elapsed_time(end)`` is the host's time between the two records, in milliseconds: ``sim``
    runs each op when it is called, so that is the time the work between them took here (the
    CPU kernels and ``sim``'s own cost, not a GPU's); CUDA's errors for events made without
    ``enable_timing=True`` or not recorded."""

    def __init__(
        self,
        device: Any = None,
        *,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
    ) -> None:
        self._perf_timing = enable_timing
        self._perf_recorded_s: float | None = None

    def record(self, stream: Any = None) -> None:
        if stream is None:
            super().record()
        else:
            super().record(stream)
        self._perf_recorded_s = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event: Any) -> float:
        timing = getattr(end_event, "_perf_timing", False)
        if not (self._perf_timing and timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        end_s = getattr(end_event, "_perf_recorded_s", None)
        if self._perf_recorded_s is None or end_s is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_s - self._perf_recorded_s) * 1e3


def _as_sim_stream(s: torch.Stream) -> torch.Stream:
    if s.device.type != NAME:
        return s
    return SimStream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def install_accelerator() -> None:
    acc = torch.accelerator
    plain_sync, plain_cap = acc.synchronize, acc.get_device_capability
    plain_stream = acc.current_stream

    def current_stream(device: Any = None, /) -> torch.Stream:
        return _as_sim_stream(plain_stream(device))

    current_stream.__doc__ = plain_stream.__doc__
    acc.current_stream = current_stream

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
    _install_device_index()


def _exchange(index: int) -> int:
    prev = ordinals.current()
    if index >= 0:
        ordinals.set_current(index)
    return prev


def _install_device_index() -> None:
    """``torch.accelerator.current_device_index`` / ``set_device_index`` / ``device_index``
    ask the C++ device guard, whose Python-backend version knows one device (index 0, setting
    ignored): answer from :mod:`perf.sim.ordinals` while ``sim`` is the current accelerator."""
    c = torch._C
    if getattr(c, "_perf_sim_index_patched", False):
        return
    answers: dict[str, Any] = {
        "_accelerator_getDeviceIndex": ordinals.current,
        "_accelerator_setDeviceIndex": lambda i: _exchange(i) and None,
        "_accelerator_exchangeDevice": _exchange,
        "_accelerator_maybeExchangeDevice": _exchange,
    }
    for name, answer in answers.items():
        original = getattr(c, name, None)
        if original is None:
            continue

        def wrapper(*a: Any, _o: Any = original, _a: Any = answer) -> Any:
            return _a(*a) if _is_sim(None) else _o(*a)

        setattr(c, name, wrapper)
    c._perf_sim_index_patched = True  # type: ignore[attr-defined]


class DeviceContext:
    """``torch.sim.device(i)``: as ``torch.cuda.device``, makes ``sim:i`` current inside."""

    def __init__(self, device: Any) -> None:
        if device is None or (isinstance(device, int) and device < 0):
            self.index = -1
        else:
            self.index = ordinals.index_of(device)
        self.prev = -1

    def __enter__(self) -> None:
        self.prev = _exchange(self.index)

    def __exit__(self, *exc: object) -> None:
        if self.index >= 0:
            ordinals.set_current(self.prev)


class SimStreamContext:
    """``torch.sim.StreamContext(stream)``: one stream, so entering it changes nothing."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def __enter__(self) -> Any:
        return self.stream

    def __exit__(self, *exc: object) -> None:
        return None


@contextlib.contextmanager
def sim_stream(stream: Any = None) -> Iterator[None]:
    """``torch.sim.stream(s)``: one stream, so entering it changes nothing."""
    yield


def sim_current_stream(device: Any = None) -> torch.Stream:
    return _as_sim_stream(torch.accelerator.current_stream())


def sim_device_name(device: Any = None) -> str:
    return "perf simulated accelerator (host memory, CPU kernels)"
