"""Trace this machine's speed over time, in 0.1 s windows, on one CPU (a diagnostic, not a test).

Why: on the 2-core dev VM, pairs of *identical* code measured in fresh processes gave ratios
from 0.48 to 2.1 on an otherwise idle box. This trace showed the cause: each vCPU flips
between two speeds about 2x apart, in runs of 0.1-2 s, with nothing in ``/proc/stat`` to show
it (a neighbour on the host, most likely). A 0.2 s measurement then lands wholly in one state
or the other. Run it on a runner before trusting timing verdicts there::

    python benchmarks/vcpu_speed_trace.py --seconds 20 --cpu 1

Prints one letter per window: ``F`` (within ``--slow`` of the fastest window) or ``S``, and the
share of slow windows and the longest slow run.
"""

from __future__ import annotations

import argparse
import os
import time


def window_time(window_s: float) -> float:
    """25th percentile of a fixed pure-Python loop's time within one window."""

    def loop() -> None:
        for _ in range(20):
            sum(range(400))

    xs = []
    end = time.perf_counter() + window_s
    while time.perf_counter() < end:
        t = time.perf_counter()
        loop()
        xs.append(time.perf_counter() - t)
    xs.sort()
    return xs[len(xs) // 4]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--window", type=float, default=0.1)
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU (Linux)")
    ap.add_argument("--slow", type=float, default=1.3, help="slow = this factor above fastest")
    ns = ap.parse_args(argv)
    if ns.cpu is not None:
        os.sched_setaffinity(0, {ns.cpu})
    times = []
    end = time.perf_counter() + ns.seconds
    while time.perf_counter() < end:
        times.append(window_time(ns.window))
    fastest = min(times)
    trace = "".join("S" if t > ns.slow * fastest else "F" for t in times)
    longest = max((len(run) for run in trace.split("F")), default=0)
    print(trace)
    print(
        f"fastest window {fastest * 1e6:.1f} us, slowest {max(times) * 1e6:.1f} us; "
        f"slow windows {trace.count('S')}/{len(trace)}; longest slow run "
        f"{longest * ns.window:.1f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
