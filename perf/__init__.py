"""perf: performance regression tests for PyTorch training code.

Public API (a contract; see README): counters (``count_syncs``, ``count_ops``,
``count_transfers``, ``count_flops``), memory meters (``saved_activations``, ``peak_memory``),
device-correct timing (``measure``, ``compare``), the machine ``fingerprint`` and the
simulated accelerator of CPU-only boxes (``simulated_device``).
"""

from __future__ import annotations

from perf.counters import count_flops, count_ops, count_syncs, count_transfers
from perf.devices import available_devices, fingerprint
from perf.memory import peak_memory, saved_activations
from perf.simulated import simulated_device
from perf.timing import Comparison, Timing, compare, measure

__all__ = [
    "Comparison",
    "Timing",
    "available_devices",
    "compare",
    "count_flops",
    "count_ops",
    "count_syncs",
    "count_transfers",
    "fingerprint",
    "measure",
    "peak_memory",
    "saved_activations",
    "simulated_device",
]
__version__ = "0.1.0"
