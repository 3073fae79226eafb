"""Harness-wide setup."""

from __future__ import annotations

# perf's plugin no longer imports torch, numpy or scipy at load. pytester's in-process runs
# remove the modules an inner run imported, and these extension modules cannot be imported a
# second time in one process (segfault, "cannot load module more than once per process"):
# import them once here, before any inner run, so every inner run shares them.
import os
import socket
from collections.abc import Iterator

import numpy  # noqa: F401
import pytest
import scipy.stats  # noqa: F401
import torch  # noqa: F401

# Likewise perf's simulated device: its installed state lives in this module, and the
# PrivateUse1 backend it registers cannot be registered twice in one process. Imported here,
# the module outlives pytester's in-process runs, so a second run finds the device installed.
import perf.sim.device  # noqa: F401


@pytest.fixture(scope="session")
def torch_profiler_loaded() -> None:
    """torch.profiler's first use imports torch._inductor and sympy (seconds), and some of
    those modules register operator libraries that cannot be registered twice in a process.
    Profiled once here, before any pytester snapshot, they outlive pytester's in-process runs:
    the trace tests run their inner pytest in-process instead of paying a fresh interpreter,
    torch and this import in a child each time."""
    import torch.profiler

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        torch.ones(1).sum()


@pytest.fixture
def writes_a_trace() -> None:
    """Skip a test that needs a trace written when this run rehearses CUDA: tracing starts
    torch.profiler's CUDA activity there, a real CUDA call (perf notes "not traced")."""
    from perf.core import rehearse

    if rehearse.active():
        pytest.skip(
            "CUDA rehearsal: a trace starts torch.profiler's CUDA activity, a real CUDA call; "
            "only a GPU (or a CPU-only run) writes one (docs/gpu.md)"
        )


#: What xdist sets in each worker; an inner pytest run (pytester's, or a child) inherits them.
_XDIST_VARS = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID", "PYTEST_XDIST_WORKER_COUNT")


@pytest.fixture(scope="session", autouse=True)
def _inner_runs_are_not_xdist_workers() -> Iterator[None]:
    """The pytest runs these tests start are not xdist workers. pytest-benchmark 5.2 takes an
    inherited ``PYTEST_XDIST_WORKER`` for one and disables itself, with a warning that is an
    error under ``-W error`` (seen on a GPU runner: an inner run saved no baseline). Each
    worker also gets its own torchrun port (``PET_MASTER_PORT``, torchrun's environment form
    of ``--master-port``): two workers' launchers both took 29500 and one failed (EADDRINUSE)."""
    saved = {k: os.environ.get(k) for k in (*_XDIST_VARS, "PET_MASTER_PORT")}
    for k in _XDIST_VARS:
        os.environ.pop(k, None)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        os.environ["PET_MASTER_PORT"] = str(s.getsockname()[1])
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
