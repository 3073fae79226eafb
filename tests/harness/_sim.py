"""The simulated device for harness modules that use it at import, on every box.

On a box with CUDA (or under the CUDA rehearsal) the simulated device cannot be installed in
the test process: ``needs_sim`` skips, naming the reason, instead of failing the module's
collection; ``SIM`` is then the ``meta`` device, which no skipped test touches and any other
use fails loudly on.
"""

from __future__ import annotations

import os

import pytest
import torch

import perf
from perf.instruments.syncs import dispatch_side
from perf.sim.device import unavailable_reason

REASON = unavailable_reason()
needs_sim = pytest.mark.skipif(
    REASON is not None, reason=f"needs the simulated device in this process: {REASON}"
)
SIM: torch.device = perf.simulated_device() if REASON is None else torch.device("meta")


def native_functions() -> list[dict]:
    """ATen's operator table as torchgen ships it (skips where the wheel lacks it)."""
    yaml = pytest.importorskip("yaml", reason="PyYAML reads native_functions.yaml")
    import torchgen

    path = os.path.join(
        os.path.dirname(torchgen.__file__), "packaged", "ATen", "native", "native_functions.yaml"
    )
    if not os.path.exists(path):
        pytest.skip(f"this torch wheel ships no native_functions.yaml ({path})")
    with open(path) as f:
        return yaml.safe_load(f)


#: ``count_syncs``' CUDA side on sim tensors (perf.instruments.syncs.dispatch_side)
counted_as_on_cuda = dispatch_side
