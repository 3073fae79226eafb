"""Helpers shared by the property suite's modules.

A module of its own, not ``conftest``: pytest imports every non-package ``conftest.py`` under
the one name ``conftest`` (dropping the previous one from ``sys.modules``), so
``from conftest import ...`` reads whichever conftest was loaded last, e.g. the harness's when
``tests/harness/...`` comes first on the command line.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

import pytest
import torch

from perf.instruments.timing import Decision, Timing


def require(decision: Decision) -> None:
    """A timing claim as a test: pass when it holds with confidence, fail when the run shows
    it does not, skip (naming the claim and the measured figures) when this machine cannot
    decide it: an inconclusive comparison (dependent pairs on a loaded runner) or an interval
    that contains the claimed bound. A skip is the machine's limit, a failure is a finding."""
    if decision.holds is None:
        caller = sys._getframe(1).f_code.co_name  # -rs lists this file's line, not the test's
        pytest.skip(
            f"{caller}: undecidable on this machine ({decision.code.value}): "
            f"{decision.claim}: {decision.reason}"
        )
    assert decision.holds, f"{decision.claim}: {decision.reason}"


#: What ``torch.cuda.set_sync_debug_mode("warn")`` says at each sync (c10/cuda/CUDAFunctions.cpp).
#: The mode's first use also warns that it "is a prototype feature and does not yet detect all
#: synchronizing operations": matching "synchroniz" counted that notice as a sync (an H200 run,
#: torch 2.11: 5 against 4).
CUDA_SYNC_WARNING = "called a synchronizing CUDA operation"


def cuda_debug_syncs(caught: list[Any]) -> int:
    """The syncs CUDA's debug mode reported among ``warnings.catch_warnings(record=True)``."""
    return sum(CUDA_SYNC_WARNING in str(w.message) for w in caught)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a DDP rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def transfer_target(device: torch.device) -> torch.device:
    """The device side of a host-device copy: the device itself, or ``meta`` for the CPU.

    On a CPU-only box ``meta`` stands in for the accelerator: copies to it dispatch the same
    ``_to_copy`` ops with the same byte counts, so *how often* a loop moves data is exact.
    """
    return torch.device("meta") if device.type == "cpu" else device


def cpu_slower_than_modelled(cpu: Timing, modelled_s: float, factor: float, what: str) -> Decision:
    """Whether the measured CPU time of ``what`` exceeds ``factor`` x its *modelled* GPU time,
    decided on the 95% interval of the CPU's median (the modelled figure has no noise): holds
    when the interval lies above, fails when below, undecided (``require`` skips) when it
    contains the bound or has too few samples."""
    from perf.core.stats import median_ci
    from perf.core.verdicts import Reason

    lo, hi = median_ci(cpu.samples_s)
    bound = factor * modelled_s
    claim = f"{what}: measured CPU time > {factor:g}x the modelled GPU time ({bound:.3g} s)"
    why = f"CPU median {cpu.median_s:.3g} s, 95% interval [{lo:.3g}, {hi:.3g}] s"
    if lo > bound:
        return Decision(True, claim, why)
    if hi < bound:
        return Decision(False, claim, why)
    code = Reason.NO_INTERVAL if hi == float("inf") else Reason.STRADDLES
    return Decision(None, claim, why, code)
