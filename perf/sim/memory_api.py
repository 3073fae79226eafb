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

from perf.sim.memory import state
from perf.sim.tensors import NAME


def _check_index(device: Any) -> None:
    if device is None:
        return
    if isinstance(device, int):
        idx = device
    else:
        d = torch.device(device)
        if d.type != NAME:
            raise ValueError(f"expected a {NAME} device, got {d}")
        idx = d.index if d.index is not None else 0
    if idx not in (0, -1):
        raise ValueError(f"the simulated device has one device, index 0; got {device!r}")


class MemoryAPI:
    """The ``torch.cuda`` memory functions, for ``torch.sim`` (``torch.get_device_module``)."""

    @staticmethod
    def memory_stats(device: Any = None) -> OrderedDict[str, Any]:
        _check_index(device)
        return OrderedDict(state().allocator.memory_stats())

    @staticmethod
    def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
        _check_index(device)
        return state().allocator.stats_nested()

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        _check_index(device)
        return state().allocator.allocated_bytes

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        _check_index(device)
        return state().allocator.stats["allocated_bytes"][0].peak

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        _check_index(device)
        return state().allocator.reserved_bytes

    @staticmethod
    def max_memory_reserved(device: Any = None) -> int:
        _check_index(device)
        return state().allocator.stats["reserved_bytes"][0].peak

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        _check_index(device)
        state().allocator.reset_peak_stats()

    @staticmethod
    def reset_accumulated_memory_stats(device: Any = None) -> None:
        _check_index(device)
        state().allocator.reset_accumulated_stats()

    @staticmethod
    def empty_cache() -> None:
        state().allocator.empty_cache()

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        _check_index(device)
        total = state().config.capacity_bytes or 80 * (1 << 30)
        return total - state().allocator.reserved_bytes, total


def _is_sim_current() -> bool:
    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == NAME


def patch_accelerator(clear_cast_cache: Callable[[], None]) -> None:
    """``torch.accelerator.memory_*`` go through ``torch._C._accelerator_*``, which ask the
    C++ device allocator a Python backend cannot register: answer for ``sim`` here."""
    c = torch._C
    if getattr(c, "_perf_sim_memory_patched", False):
        return
    answers: dict[str, Callable[..., Any]] = {
        "_accelerator_isAllocatorInitialized": lambda: True,
        "_accelerator_getDeviceStats": lambda i=None: state().allocator.stats_nested(),
        "_accelerator_emptyCache": MemoryAPI.empty_cache,
        "_accelerator_resetPeakStats": lambda i=None: MemoryAPI.reset_peak_memory_stats(),
        "_accelerator_resetAccumulatedStats": lambda i=None: (
            MemoryAPI.reset_accumulated_memory_stats()
        ),
        "_accelerator_getMemoryInfo": lambda i=None: MemoryAPI.mem_get_info(),
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
