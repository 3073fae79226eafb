"""The simulated-device scripts run as documented (on CPU: the simulated side only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_parity_child_side_counts_the_derived_truth():
    """What test_sim_parity.py compares with cuda:0, as its child process runs it."""
    proc = _run("tests/benchmarks/test_sim_parity.py", "sim")
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout)
    assert counts["log_every_k"]["by_op"] == {"item": 4}  # 20 steps, every 5th
    assert counts["clip_adamw"]["syncs"] == 0
    assert counts["nanogpt_batches"]["pinned_h2d_copies"] == 5
    assert counts["loader_pageable"]["by_op"] == {"h2d_copy": 10}
    assert counts["loader_pinned_workers"]["syncs"] == 0
    assert counts["eval_per_batch_item"]["by_op"] == {"h2d_copy": 15, "item": 10}
    assert counts["amp_grad_scaler"]["by_op"] == {"item": 10}  # 8 scaler steps + 2 logs
    assert counts["habits"]["syncs"] == 12 and counts["habits"]["d2h_copies"] == 5


def test_counter_overhead_on_sim_prints_its_table():
    proc = _run("benchmarks/counter_overhead.py", "--device", "sim", "--steps", "2",
                "--pairs", "6")
    assert proc.returncode == 0, proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| iris") or
            ln.startswith("| mlp")]
    assert len(rows) == 10 and all("x | [" in r for r in rows), proc.stdout


def test_nanogpt_script_without_a_checkout_prints_its_usage():
    proc = _run("benchmarks/nanogpt_sim.py")
    assert proc.returncode == 2 and "nanoGPT" in proc.stdout


def test_vcpu_speed_trace_prints_a_letter_per_window_and_a_summary():
    proc = _run("benchmarks/vcpu_speed_trace.py", "--seconds", "0.5", "--window", "0.05")
    assert proc.returncode == 0, proc.stderr
    trace, summary = proc.stdout.splitlines()
    assert set(trace) <= {"F", "S"} and "F" in trace and 5 <= len(trace) <= 11
    assert f"slow windows {trace.count('S')}/{len(trace)}" in summary
