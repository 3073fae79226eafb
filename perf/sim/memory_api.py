"""The memory API on ``sim``: ``torch.sim.memory_*`` and ``torch.accelerator.memory_*``.

``torch.get_device_module("sim")`` is the backend module; :class:`MemoryAPI` is mixed into it
so it answers ``torch.cuda``'s memory functions from the allocator model. The
``torch.accelerator.memory_*`` functions call ``torch._C._accelerator_*`` functions that ask the
C++ device allocator, which a Python backend cannot register: those are wrapped here to
answer for ``sim`` while it is the current accelerator (a monkeypatch; every other device type
reaches the original). ``torch.clear_autocast_cache`` is wrapped to drop ``sim``'s cast cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from perf.sim import ordinals
from perf.sim.allocator import CachingAllocator
from perf.sim.memory import state


def _model(device: Any) -> CachingAllocator:
    """The allocator model of the sim device ``device`` names (None: the current one);
    CUDA's "invalid device ordinal" past the device count."""
    return state().device(ordinals.index_of(device))


class MemoryAPI:
    """The ``torch.cuda`` memory functions, for ``torch.sim`` (``torch.get_device_module``)."""

    @staticmethod
    def memory_stats(device: Any = None) -> OrderedDict[str, Any]:
        return OrderedDict(_model(device).memory_stats())

    @staticmethod
    def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
        return _model(device).stats_nested()

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return _model(device).allocated_bytes

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return _model(device).stats["allocated_bytes"][0].peak

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        return _model(device).reserved_bytes

    @staticmethod
    def max_memory_reserved(device: Any = None) -> int:
        return _model(device).stats["reserved_bytes"][0].peak

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        _model(device).reset_peak_stats()

    @staticmethod
    def reset_accumulated_memory_stats(device: Any = None) -> None:
        _model(device).reset_accumulated_stats()

    @staticmethod
    def empty_cache() -> None:
        # every device's, as NativeCachingAllocator::emptyCache loops over device_allocator
        for alloc in list(state().devices.values()):
            alloc.empty_cache()

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        total = total_memory()
        return total - _model(device).reserved_bytes, total

    @classmethod
    def reset_max_memory_allocated(cls, device: Any = None) -> None:
        """As CUDA's (deprecated) alias: resets every peak statistic."""
        cls.reset_peak_memory_stats(device)

    @staticmethod
    def get_allocator_backend() -> str:
        return "native"  # the model is of CUDA's native caching allocator


def total_memory() -> int:
    """The device memory ``sim`` reports: the model's ``capacity_bytes``, else 80 GiB."""
    return state().config.capacity_bytes or 80 * (1 << 30)


def _is_sim_current() -> bool:
    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == ordinals.NAME


def patch_accelerator(clear_cast_cache: Callable[[], None]) -> None:
    """``torch.accelerator.memory_*`` go through ``torch._C._accelerator_*``, which ask the
    C++ device allocator a Python backend cannot register: answer for ``sim`` here."""
    c = torch._C
    if getattr(c, "_perf_sim_memory_patched", False):
        return
    answers: dict[str, Callable[..., Any]] = {
        "_accelerator_isAllocatorInitialized": lambda: True,
        "_accelerator_getDeviceStats": lambda i=None: _model(i).stats_nested(),
        "_accelerator_emptyCache": MemoryAPI.empty_cache,
        "_accelerator_resetPeakStats": lambda i=None: MemoryAPI.reset_peak_memory_stats(i),
        "_accelerator_resetAccumulatedStats": lambda i=None: (
            MemoryAPI.reset_accumulated_memory_stats(i)
        ),
        "_accelerator_getMemoryInfo": lambda i=None: MemoryAPI.mem_get_info(i),
    }
    for name, answer in answers.items():
        original = getattr(c, name, None)
        if original is None:
            continue

        def wrapper(*a: Any, _o: Any = original, _a: Any = answer) -> Any:
            return _a(*a) if _is_sim_current() else _o(*a)

        setattr(c, name, wrapper)
    plain_clear = torch.clear_autocast_cache

    def clear_autocast_cache() -> None:
        plain_clear()
        clear_cast_cache()

    torch.clear_autocast_cache = clear_autocast_cache
    c._perf_sim_memory_patched = True  # type: ignore[attr-defined]
