"""Fixtures of the property suite (its helpers are in ``suite_support``; the perf plugin
gives the rest)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Seed every test so workloads and inputs are reproducible run to run."""
    torch.manual_seed(0)
