"""Deterministic runs for the store/gate/report tests (no clocks involved)."""

from __future__ import annotations

from typing import Any

import numpy as np

from perf.store.runs import Run, make_run

FP: dict[str, Any] = {
    "cpu_model": "Test CPU",
    "cpu_count": 2,
    "machine": "x86_64",
    "system": "Linux",
    "python": "3.11.7",
    "torch": "2.13.0",
    "torch_threads": 2,
    "cuda": None,
    "cudnn": None,
    "gpus": [],
    "driver": None,
}
COMMIT = {"id": "abc123", "branch": "main", "dirty": False}
#: The options of a gate run in these tests: no cache, one process (the gate swaps modules of
#: this process), every neighbour's CPU tolerated, no reference workload.
GATE_RUN_ARGS = (
    "-p",
    "no:cacheprovider",
    "-p",
    "no:xdist",
    "-o",
    "perf_busy_cpu_fraction=1",
    "--perf-no-reference",
)


def samples(center: float, n: int = 30, spread: float = 0.02, seed: int = 0) -> list[float]:
    """Right-skewed timing samples around ``center`` (interference only adds time)."""
    rng = np.random.default_rng(seed)
    return [float(center * (1 + abs(x))) for x in rng.normal(0, spread, n)]


def metric(name: str, value: float, unit: str, **kw: Any) -> dict[str, Any]:
    from perf.store.metrics import make_metric

    return make_metric(name, value, unit=unit, **kw).to_dict()


def timed(name: str, center: float, seed: int = 0, **kw: Any) -> dict[str, Any]:
    s = samples(center, seed=seed)
    return metric(name, float(np.median(s)), "s", samples=s, **kw)


def run(
    tests: dict[str, list[dict[str, Any]]],
    *,
    fp: dict[str, Any] | None = None,
    name: str = "run",
    reference: float | None = 1e-3,
    workers: int = 0,
    outcome: str = "passed",
    others: float | None = 0.01,
    reference_threads: int | None = 1,
    partial: str | None = None,
) -> Run:
    ref = (
        {}
        if reference is None
        else {"start": samples(reference, 15, seed=99), "end": samples(reference, 15, seed=98)}
    )
    return make_run(
        {k: {"outcome": outcome, "metrics": v} for k, v in tests.items()},
        name=name,
        machine="Linux-CPython-3.11-64bit",
        fingerprint=fp or FP,
        commit=COMMIT,
        reference=ref,
        workers=workers,
        partial=partial,
        reference_threads=reference_threads if ref else None,
        cpu=None
        if others is None
        else {"wall_s": 10.0, "others_fraction": others, "steal_fraction": 0.0},
    )
