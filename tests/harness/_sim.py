"""The simulated device for harness modules that use it at import, on every box.

On a box with CUDA (or under the CUDA rehearsal) the simulated device cannot be installed in
the test process: ``needs_sim`` skips, naming the reason, instead of failing the module's
collection; ``SIM`` is then the ``meta`` device, which no skipped test touches and any other
use fails loudly on.
"""

from __future__ import annotations

import pytest
import torch

import perf
from perf.sim.device import unavailable_reason

REASON = unavailable_reason()
needs_sim = pytest.mark.skipif(
    REASON is not None, reason=f"needs the simulated device in this process: {REASON}"
)
SIM: torch.device = perf.simulated_device() if REASON is None else torch.device("meta")
