"""The reference workload: a small fixed torch step timed at session start and end, whose
speed now against then says whether the machine is in the state it was in (see
:mod:`perf.gate.compare`, guard 1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from perf.store.runs import Run


def _quantile(xs: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs, dtype=float), q))


def reference_factor(new: Run, old: Run, q: float = 0.25) -> float | None:
    """How much longer the reference workload took now than in the baseline.

    The factor compares the *quickest* bracket of each run (session start, end; or a
    re-measuring child's), i.e. the machine at its best then and now. Measured on the 2-core
    dev VM with nothing else running in it: one 0.15 s bracket of a 5 s session ran 39% slower
    than the other (host-level interference the guest cannot see; steal time ~0), so any
    single bracket is a poor picture of the machine, while a machine that is uniformly slower
    today is slower in every bracket. None when either run has no reference samples.
    """
    old_locs = [_quantile(v, q) for v in old.reference.values() if len(v) >= 3]
    new_locs = [_quantile(v, q) for v in new.reference.values() if len(v) >= 3]
    if not old_locs or not new_locs or min(old_locs) <= 0:
        return None
    if reference_mismatch(new, old) is not None:
        return None
    return min(new_locs) / min(old_locs)


def reference_mismatch(new: Run, old: Run) -> str | None:
    """Why the two runs' reference timings cannot be divided (None: they can).

    The reference's speed depends on its thread count; runs stored before it was pinned
    (schema_version <= 2) do not say which count they used.
    """
    if not new.reference or not old.reference:
        return None
    a, b = old.reference_threads, new.reference_threads
    if a is None or b is None:
        return (
            "reference workload not comparable: its thread count is unknown for "
            + ("the baseline" if a is None else "this run")
            + " (stored before it was pinned); times are judged raw"
        )
    if a != b:
        return (
            f"reference workload not comparable: {a} threads in the baseline, {b} now; "
            "times are judged raw"
        )
    return None


#: Intra-op threads the reference workload always runs with. One: independent of the core
#: count, of OMP_NUM_THREADS, of xdist core sharing and of tests that change the session's
#: threads, and no OpenMP barrier waiting for a preempted thread on a busy box.
REFERENCE_THREADS = 1


def reference_samples(min_run_time_s: float = 0.15) -> list[float]:
    """Time a small fixed torch training step (seconds per call); used to normalise times.

    A 64x256 linear layer forward + backward exercises what perf tests usually spend time on
    (dispatcher, elementwise kernels, BLAS calls), so a machine or a neighbour that slows
    those down slows this too. The backward is written out, without autograd: nothing perf
    runs on its own may start autograd's engine before a test installs the simulated device.
    It runs on :data:`REFERENCE_THREADS` threads and restores the session's count afterwards,
    so the session's thread state neither changes it nor is changed by it. Imports torch
    lazily.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(REFERENCE_THREADS)
    try:
        return _reference_step_samples(min_run_time_s)
    finally:
        torch.set_num_threads(before)


def _reference_step_samples(min_run_time_s: float) -> list[float]:
    import torch

    from perf.instruments.timing import measure

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g)
    w = torch.randn(256, 256, generator=g)

    def step() -> None:
        # The backward written out (what autograd would run: threshold_backward, then the
        # weight-gradient matmul), not loss.backward(): autograd fixes its devices at the
        # process's first backward, so a reference that ran one before the tests would make
        # a simulated device installed by a test unusable.
        y = x @ w
        mask = (y > 0).to(y.dtype)
        y.relu().sum()
        torch.mm(x.t(), mask)

    t = measure(
        step,
        warmup=5,
        min_sample_time_s=0.005,
        min_samples=15,
        min_run_time_s=min_run_time_s,
        label="perf-reference",
    )
    return list(t.samples_s)
