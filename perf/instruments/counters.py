"""Exact counters: host-device syncs, dispatched ops / kernel launches, transfers, FLOPs.

Counts are the backbone of the gate: the same code on the same torch version gives the same
count on every run and every machine, so a count gates with zero noise even on a CPU-only box.
One module per instrument (:mod:`~perf.instruments.syncs`, :mod:`~perf.instruments.ops`,
:mod:`~perf.instruments.transfers`, :mod:`~perf.instruments.flops`); this one gathers them.
"""

from __future__ import annotations

from perf.instruments.flops import FlopCount, count_flops
from perf.instruments.ops import OpCount, count_ops, kernel_devices
from perf.instruments.syncs import SyncCount, SyncCounter, count_syncs
from perf.instruments.transfers import TransferCount, count_transfers

__all__ = [
    "FlopCount",
    "OpCount",
    "SyncCount",
    "SyncCounter",
    "TransferCount",
    "count_flops",
    "count_ops",
    "count_syncs",
    "count_transfers",
    "kernel_devices",
]
