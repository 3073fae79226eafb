"""Harness-wide setup."""

from __future__ import annotations

# perf's plugin no longer imports torch, numpy or scipy at load. pytester's in-process runs
# remove the modules an inner run imported, and these extension modules cannot be imported a
# second time in one process (segfault, "cannot load module more than once per process"):
# import them once here, before any inner run, so every inner run shares them.
import numpy  # noqa: F401
import scipy.stats  # noqa: F401
import torch  # noqa: F401

# Likewise perf's simulated device: its installed state lives in this module, and the
# PrivateUse1 backend it registers cannot be registered twice in one process. Imported here,
# the module outlives pytester's in-process runs, so a second run finds the device installed.
import perf.sim.device  # noqa: F401
