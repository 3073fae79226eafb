"""How much of the machine's CPU other processes used while we measured (Linux).

The timing gate needs to know whether a slow measurement is the code or a neighbour. A proxy
workload (the reference step in :mod:`perf.gate.compare`) only sees neighbours that hurt *it*: on a
2-core VM a busy neighbour slowed a 1-thread Python loop 1.4-1.9x while the reference moved
under 2%. So we also ask the kernel directly: ``/proc/stat`` gives the CPU time every process
used (and the time the hypervisor gave our vCPUs to other guests, ``steal``); subtracting our
own process tree's CPU time (``getrusage``) leaves what everybody else used.

Elsewhere (no ``/proc/stat``), :func:`snapshot` returns None and the check is skipped.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from typing import Any

_PROC_STAT = "/proc/stat"


@dataclass(frozen=True)
class CpuSnapshot:
    """Cumulative counters at one instant (seconds)."""

    wall_s: float
    #: CPU time spent by every process on the machine (user+nice+system+irq+softirq).
    busy_s: float
    #: CPU time the hypervisor gave our vCPUs to someone else.
    steal_s: float
    #: CPU time of this process and its reaped children (their own child processes included).
    own_s: float
    cpus: int


@dataclass(frozen=True)
class CpuShare:
    """What other processes (and other guests, via steal) used between two snapshots."""

    wall_s: float
    #: fraction of the machine's CPU capacity (cpus x wall) used by others, 0..1
    others_fraction: float
    #: fraction of capacity stolen by the hypervisor, 0..1 (included in ``others_fraction``)
    steal_fraction: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "others_fraction": self.others_fraction,
            "steal_fraction": self.steal_fraction,
        }


def parse_proc_stat(text: str, ticks_per_s: float) -> tuple[float, float]:
    """(busy_s, steal_s) from the aggregate ``cpu`` line of ``/proc/stat``."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            v = [float(x) for x in parts[1:]] + [0.0] * 10
            user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
            # guest time is already part of user/nice on Linux
            return (user + nice + system + irq + softirq) / ticks_per_s, steal / ticks_per_s
    raise ValueError("no aggregate 'cpu' line in /proc/stat")


#: CPU of descendants that a child of ours reaped and that we have not reaped yet (the gate's
#: children forked by its warm starter, :mod:`perf.gate.processes`).
_unreaped_descendants_cpu_s = 0.0


def count_descendant_cpu(seconds: float) -> None:
    """Count ``seconds`` of a descendant reaped by a child of ours as this process tree's own
    (``RUSAGE_CHILDREN`` holds them only once that child is reaped: then count them back out
    with a negative figure), so that the gate's own children never look like a neighbour."""
    global _unreaped_descendants_cpu_s
    _unreaped_descendants_cpu_s += seconds


def _own_cpu_s() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime + _unreaped_descendants_cpu_s


def snapshot() -> CpuSnapshot | None:
    """The counters now, or None where ``/proc/stat`` cannot be read (not Linux)."""
    try:
        with open(_PROC_STAT, encoding="ascii") as fh:
            text = fh.read()
        busy, steal = parse_proc_stat(text, float(os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError):
        return None
    return CpuSnapshot(time.monotonic(), busy, steal, _own_cpu_s(), os.cpu_count() or 1)


def share(a: CpuSnapshot, b: CpuSnapshot) -> CpuShare:
    """Others' share of the machine between ``a`` and ``b`` (clamped to 0..1).

    ``/proc/stat`` ticks at 100 Hz, so over short spans the estimate is coarse; callers use
    spans of a second or more.
    """
    wall = max(b.wall_s - a.wall_s, 1e-9)
    cap = wall * max(a.cpus, 1)
    others = (b.busy_s - a.busy_s) - (b.own_s - a.own_s) + (b.steal_s - a.steal_s)
    steal = b.steal_s - a.steal_s
    return CpuShare(
        wall_s=wall,
        others_fraction=min(max(others / cap, 0.0), 1.0),
        steal_fraction=min(max(steal / cap, 0.0), 1.0),
    )
