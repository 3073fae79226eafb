"""Reference data: the real Fisher Iris table (shipped as CSV) and deterministic synthetic sets.

Iris is the seeds' "small problem": 150 rows, 4 features, 3 classes. Full-batch training on it
is dominated by launch and transfer overhead, which is why the CPU beats a GPU there (P1).
"""

from __future__ import annotations

import csv
from functools import lru_cache
from importlib import resources

import torch

IRIS_CLASSES: tuple[str, ...] = ("setosa", "versicolor", "virginica")
IRIS_FEATURES: tuple[str, ...] = ("sepal_length", "sepal_width", "petal_length", "petal_width")


@lru_cache(maxsize=1)
def _iris_rows() -> tuple[tuple[tuple[float, ...], ...], tuple[int, ...]]:
    text = resources.files("perf.workloads").joinpath("iris.csv").read_text(encoding="utf-8")
    feats: list[tuple[float, ...]] = []
    labels: list[int] = []
    for row in csv.DictReader(text.splitlines()):
        feats.append(tuple(float(row[k]) for k in IRIS_FEATURES))
        labels.append(IRIS_CLASSES.index(row["species"]))
    return tuple(feats), tuple(labels)


def load_iris(
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    standardize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """All 150 Iris rows as ``(X [150, 4], y [150] int64)``, features standardised by default."""
    feats, labels = _iris_rows()
    x = torch.tensor(feats, dtype=torch.float64)
    if standardize:
        x = (x - x.mean(0)) / x.std(0)
    return x.to(device=device, dtype=dtype), torch.tensor(labels, device=device)


def iris_split(
    *,
    train: int = 120,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deterministic shuffled split ``(X_train, y_train, X_test, y_test)``, 120/30 as in seeds."""
    x, y = load_iris(dtype=dtype)
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    x, y = x[perm].to(device), y[perm].to(device)
    return x[:train], y[:train], x[train:], y[train:]


def synthetic_classification(
    n: int,
    features: int,
    classes: int = 10,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic random ``(X [n, features], y [n])`` for sweeps where Iris is too small."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g, dtype=torch.float32)
    y = torch.randint(0, classes, (n,), generator=g)
    return x.to(device=device, dtype=dtype), y.to(device)
