"""Harness-wide setup."""

from __future__ import annotations

# perf's plugin no longer imports torch, numpy or scipy at load. pytester's in-process runs
# remove the modules an inner run imported, and these extension modules cannot be imported a
# second time in one process (segfault, "cannot load module more than once per process"):
# import them once here, before any inner run, so every inner run shares them.
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
