"""CPU share of other processes, from /proc/stat minus our own process tree."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from perf.core import contention as c

STAT = """cpu  1000 50 200 9000 30 5 15 100 0 0
cpu0 500 25 100 4500 15 2 7 50 0 0
intr 12345
"""


def test_parse_proc_stat_aggregate_line() -> None:
    busy, steal = c.parse_proc_stat(STAT, 100.0)
    assert busy == pytest.approx((1000 + 50 + 200 + 5 + 15) / 100)
    assert steal == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no aggregate"):
        c.parse_proc_stat("intr 1\n", 100.0)


def test_share_subtracts_own_time_and_counts_steal() -> None:
    a = c.CpuSnapshot(wall_s=0.0, busy_s=100.0, steal_s=1.0, own_s=5.0, cpus=2)
    # 10 s wall on 2 CPUs = 20 CPU-s capacity; everybody used 12, we used 8, 2 stolen
    b = c.CpuSnapshot(wall_s=10.0, busy_s=112.0, steal_s=3.0, own_s=13.0, cpus=2)
    s = c.share(a, b)
    assert s.others_fraction == pytest.approx((12 - 8 + 2) / 20)
    assert s.steal_fraction == pytest.approx(2 / 20)
    # counters that disagree (coarse ticks) are clamped, never negative or above 1
    assert c.share(a, c.CpuSnapshot(10.0, 100.0, 1.0, 20.0, 2)).others_fraction == 0.0
    assert c.share(a, c.CpuSnapshot(10.0, 999.0, 1.0, 5.0, 2)).others_fraction == 1.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux-only")
def test_a_cpu_bound_neighbour_is_seen() -> None:
    """A spinning process (not yet reaped, so not ours by getrusage) shows up as at least
    ~0.6 CPUs' worth of other load; our own spinning does not."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        a = c.snapshot()
        time.sleep(1.5)
        b = c.snapshot()
    finally:
        hog.kill()
        hog.wait()
    assert a is not None and b is not None
    assert c.share(a, b).others_fraction * a.cpus >= 0.6
    a = c.snapshot()
    t0 = time.process_time()
    while time.process_time() - t0 < 0.5:
        pass
    b = c.snapshot()
    assert a is not None and b is not None
    assert b.own_s - a.own_s >= 0.45


def test_snapshot_is_none_without_proc_stat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c, "_PROC_STAT", "/nonexistent/stat")
    assert c.snapshot() is None
