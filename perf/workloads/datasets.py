"""A latency-bound Dataset: each item waits like a disk or network read would.

``time.sleep`` releases the GIL and burns no CPU, so worker processes overlap their waits and
loading speeds up past the number of cores — exactly what ``num_workers`` is for (P5).
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset


class SleepyDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``n`` deterministic items of ``features`` floats, each taking ``delay_s`` to fetch."""

    def __init__(self, n: int = 64, delay_s: float = 0.005, features: int = 8) -> None:
        self.n = n
        self.delay_s = delay_s
        self.features = features

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        x = torch.full((self.features,), float(i))
        return x, torch.tensor(i % 3)
