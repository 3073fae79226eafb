"""Reference workloads: data, models, datasets and loops that the property suite measures.

Importable from plain scripts (no pytest): ``from perf.workloads import load_iris, mlp``.
"""

from __future__ import annotations

from perf.workloads.data import (
    IRIS_CLASSES,
    IRIS_FEATURES,
    iris_split,
    load_iris,
    synthetic_classification,
    synthetic_images,
)
from perf.workloads.datasets import SleepyDataset
from perf.workloads.loops import (
    accumulate_gradients,
    forward_backward,
    grads,
    make_eval_step,
    make_train_step,
    train_loop,
)
from perf.workloads.models import BlockMLP, SmallCNN, mlp, param_bytes, small_cnn

__all__ = [
    "IRIS_CLASSES",
    "IRIS_FEATURES",
    "BlockMLP",
    "SleepyDataset",
    "SmallCNN",
    "accumulate_gradients",
    "forward_backward",
    "grads",
    "iris_split",
    "load_iris",
    "make_eval_step",
    "make_train_step",
    "mlp",
    "param_bytes",
    "small_cnn",
    "synthetic_classification",
    "synthetic_images",
    "train_loop",
]
