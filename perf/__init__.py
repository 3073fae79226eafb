"""perf: performance regression tests for PyTorch training code.

This module is the public surface, and ``_EXPORTS`` below is its one list: the instruments
(``count_syncs``, ``count_ops``, ``count_transfers``, ``count_flops``, ``count_compiles``,
``saved_activations``, ``peak_memory``, ``memory_growth``), the results they return
(``SyncCount``, ``PeakMemory``, ...), device-correct timing (``measure``, ``compare``), the
machine ``fingerprint`` and the simulated accelerator of CPU-only boxes
(``simulated_device``). ``docs/api.md`` documents exactly these names (a test checks it).
Everything else is importable by its module path (``perf.core.stats``) and may change.

The names are imported on first use (module ``__getattr__``): the pytest plugin lives in this
package and loads in every pytest run, so ``import perf`` must not import torch. The
``TYPE_CHECKING`` imports mirror ``_EXPORTS`` for type checkers only (a test keeps them equal).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perf.core.devices import available_devices as available_devices
    from perf.core.devices import fingerprint as fingerprint
    from perf.core.verdicts import Reason as Reason
    from perf.core.verdicts import TimedVerdict as TimedVerdict
    from perf.core.verdicts import Verdict as Verdict
    from perf.instruments.compiles import CompileCount as CompileCount
    from perf.instruments.compiles import count_compiles as count_compiles
    from perf.instruments.flops import FlopCount as FlopCount
    from perf.instruments.flops import count_flops as count_flops
    from perf.instruments.gpu_model import model_gpu_time as model_gpu_time
    from perf.instruments.gpu_timeline import GpuTime as GpuTime
    from perf.instruments.leaks import LeakSite as LeakSite
    from perf.instruments.leaks import MemoryGrowth as MemoryGrowth
    from perf.instruments.leaks import memory_growth as memory_growth
    from perf.instruments.memory import PeakMemory as PeakMemory
    from perf.instruments.memory import SavedActivations as SavedActivations
    from perf.instruments.memory import peak_memory as peak_memory
    from perf.instruments.memory import saved_activations as saved_activations
    from perf.instruments.memviz import memory_snapshot as memory_snapshot
    from perf.instruments.memviz import write_memviz as write_memviz
    from perf.instruments.ops import OpCount as OpCount
    from perf.instruments.ops import count_ops as count_ops
    from perf.instruments.syncs import SyncCount as SyncCount
    from perf.instruments.syncs import count_syncs as count_syncs
    from perf.instruments.timing import Comparison as Comparison
    from perf.instruments.timing import Decision as Decision
    from perf.instruments.timing import Timing as Timing
    from perf.instruments.timing import compare as compare
    from perf.instruments.timing import measure as measure
    from perf.instruments.transfers import TransferCount as TransferCount
    from perf.instruments.transfers import count_transfers as count_transfers
    from perf.sim.device import SimulatedDeviceError as SimulatedDeviceError
    from perf.sim.device import simulated_device as simulated_device

#: the public surface: name -> the module that defines it
_EXPORTS = {
    # instruments: context managers that count or meter a block
    "count_syncs": "perf.instruments.syncs",
    "count_ops": "perf.instruments.ops",
    "count_transfers": "perf.instruments.transfers",
    "count_flops": "perf.instruments.flops",
    "count_compiles": "perf.instruments.compiles",
    "saved_activations": "perf.instruments.memory",
    "peak_memory": "perf.instruments.memory",
    "memory_growth": "perf.instruments.leaks",
    "memory_snapshot": "perf.instruments.memviz",
    "write_memviz": "perf.instruments.memviz",
    "model_gpu_time": "perf.instruments.gpu_model",
    # what they return
    "SyncCount": "perf.instruments.syncs",
    "OpCount": "perf.instruments.ops",
    "TransferCount": "perf.instruments.transfers",
    "FlopCount": "perf.instruments.flops",
    "CompileCount": "perf.instruments.compiles",
    "SavedActivations": "perf.instruments.memory",
    "PeakMemory": "perf.instruments.memory",
    "MemoryGrowth": "perf.instruments.leaks",
    "LeakSite": "perf.instruments.leaks",
    "GpuTime": "perf.instruments.gpu_timeline",
    # timing and its verdicts
    "measure": "perf.instruments.timing",
    "compare": "perf.instruments.timing",
    "Timing": "perf.instruments.timing",
    "Comparison": "perf.instruments.timing",
    "Decision": "perf.instruments.timing",
    "Verdict": "perf.core.verdicts",
    "Reason": "perf.core.verdicts",
    "TimedVerdict": "perf.core.verdicts",
    # the machine and its devices
    "simulated_device": "perf.sim.device",
    "SimulatedDeviceError": "perf.sim.device",
    "fingerprint": "perf.core.devices",
    "available_devices": "perf.core.devices",
}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Not cached in globals(): resolved through sys.modules each time, so the name stays the
    # object of the module that is loaded now (pytester drops modules imported by an inner
    # run; a cached perf.Timing would then be another class than perf.instruments.timing's).
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(
        f"module 'perf' has no attribute {name!r}; the public names are perf.__all__, "
        f"everything else is imported by its module path (e.g. perf.core.stats)"
    )


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
