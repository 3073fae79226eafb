"""The simulated accelerator ``sim``: a real torch device whose tensors live in host memory, so
that a CPU-only box counts what the same code causes on ``cuda:0``.

:func:`simulated_device` is the way in (also :func:`perf.simulated_device`).
"""

from __future__ import annotations

from perf.sim.device import (
    NAME,
    SimulatedDeviceError,
    host_view,
    simulated_device,
    storage_of,
    unavailable_reason,
)

__all__ = [
    "NAME",
    "SimulatedDeviceError",
    "host_view",
    "simulated_device",
    "storage_of",
    "unavailable_reason",
]
