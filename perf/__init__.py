"""perf: performance regression tests for PyTorch training code.

Public API (a contract; see README): counters (``count_syncs``, ``count_ops``,
``count_transfers``, ``count_flops``, ``count_compiles``), memory meters
(``saved_activations``, ``peak_memory``),
device-correct timing (``measure``, ``compare``), the machine ``fingerprint`` and the
simulated accelerator of CPU-only boxes (``simulated_device``).

The names are imported on first use (module ``__getattr__``): the pytest plugin lives in this
package and loads in every pytest run, so ``import perf`` must not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perf.core.devices import available_devices, fingerprint
    from perf.core.verdicts import Reason, TimedVerdict, Verdict
    from perf.instruments.compiles import count_compiles
    from perf.instruments.counters import count_flops, count_ops, count_syncs, count_transfers
    from perf.instruments.gpu_model import model_gpu_time
    from perf.instruments.gpu_timeline import GpuTime
    from perf.instruments.leaks import memory_growth
    from perf.instruments.memory import peak_memory, saved_activations
    from perf.instruments.memviz import memory_snapshot, write_memviz
    from perf.instruments.timing import Comparison, Decision, Timing, compare, measure
    from perf.sim.device import simulated_device

#: public name -> module that defines it
_EXPORTS = {
    "count_compiles": "perf.instruments.compiles",
    "count_flops": "perf.instruments.counters",
    "count_ops": "perf.instruments.counters",
    "count_syncs": "perf.instruments.counters",
    "count_transfers": "perf.instruments.counters",
    "available_devices": "perf.core.devices",
    "model_gpu_time": "perf.instruments.gpu_model",
    "GpuTime": "perf.instruments.gpu_timeline",
    "fingerprint": "perf.core.devices",
    "peak_memory": "perf.instruments.memory",
    "memory_growth": "perf.instruments.leaks",
    "memory_snapshot": "perf.instruments.memviz",
    "write_memviz": "perf.instruments.memviz",
    "saved_activations": "perf.instruments.memory",
    "simulated_device": "perf.sim.device",
    "Reason": "perf.core.verdicts",
    "TimedVerdict": "perf.core.verdicts",
    "Verdict": "perf.core.verdicts",
    "Comparison": "perf.instruments.timing",
    "Decision": "perf.instruments.timing",
    "Timing": "perf.instruments.timing",
    "compare": "perf.instruments.timing",
    "measure": "perf.instruments.timing",
}
#: modules reachable as attributes after a plain ``import perf`` (``perf.stats.median``): the
#: short names of the modules a script most often needs, wherever they live in the tree
_SUBMODULES = {
    "baseline": "perf.store.baseline",
    "counters": "perf.instruments.counters",
    "devices": "perf.core.devices",
    "gate": "perf.gate",
    "memory": "perf.instruments.memory",
    "metrics": "perf.store.metrics",
    "report": "perf.report.text",
    "sim": "perf.sim",
    "simulated": "perf.sim.device",
    "stats": "perf.core.stats",
    "timing": "perf.instruments.timing",
    "workloads": "perf.workloads",
}

__all__ = [
    "Comparison",
    "Decision",
    "GpuTime",
    "Reason",
    "TimedVerdict",
    "Timing",
    "Verdict",
    "available_devices",
    "compare",
    "count_compiles",
    "count_flops",
    "count_ops",
    "count_syncs",
    "count_transfers",
    "fingerprint",
    "measure",
    "memory_growth",
    "memory_snapshot",
    "model_gpu_time",
    "peak_memory",
    "saved_activations",
    "simulated_device",
    "write_memviz",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Not cached in globals(): resolved through sys.modules each time, so the name stays the
    # object of the module that is loaded now (pytester drops modules imported by an inner
    # run; a cached perf.Timing would then be another class than perf.timing.Timing).
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'perf' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))
