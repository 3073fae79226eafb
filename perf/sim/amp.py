"""CUDA-named AMP on ``sim``: ``torch.cuda.amp.autocast``, ``torch.cuda.amp.GradScaler``,
``torch.autocast("cuda")`` and ``torch.amp.GradScaler("cuda")`` act on ``sim`` where ``sim``
stands in for CUDA.

Why: training scripts written for a GPU name CUDA's AMP (a widely used reference
image-classification script builds ``torch.cuda.amp.GradScaler()``). On a CPU-only box torch
disables both ("CUDA is not available ... Disabling"), so on ``sim`` the step had no autocast
and no scaler, and the scaler's ``.item()`` per optimizer step (``GradScaler._maybe_opt_step``:
``sum(v.item() for v in found_inf_per_device.values())``) was missing from the counts (15 syncs
counted where CUDA makes 18).

Opt-in (``perf.simulated_device(as_cuda=True)`` or ``PERF_SIM_AS_CUDA=1``): with it, the device
type ``"cuda"`` given to ``torch.amp.autocast`` (``torch.autocast``) or ``torch.amp.GradScaler``
(and the ``torch.cuda.amp`` classes built on them) means ``sim``, when this process has no CUDA.
Not the default because it changes what code that names CUDA does with *host* tensors: a
scaler made for ``"cuda"`` in a CPU program is enabled instead of disabled.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from perf.sim.tensors import NAME

__all__ = ["ENV", "requested", "stand_in_for_cuda", "standing_in"]

#: the environment variable that asks ``simulated_device()`` for CUDA-named AMP on ``sim``
ENV = "PERF_SIM_AS_CUDA"
_patched = False


def requested(as_cuda: bool = False) -> bool:
    """Whether ``sim`` stands in for CUDA: ``as_cuda`` or ``PERF_SIM_AS_CUDA`` set (not 0)."""
    if as_cuda:
        return True
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError(f"{ENV}={os.environ[ENV]!r}: set it to 1 (sim stands in for CUDA) or 0")


def standing_in() -> bool:
    """Whether ``"cuda"`` in AMP's APIs means ``sim`` in this process now."""
    return (
        _patched
        and torch._C._get_privateuse1_backend_name() == NAME
        and not torch.cuda.is_available()
    )


def _device(device: Any) -> Any:
    return NAME if device == "cuda" and standing_in() else device


def stand_in_for_cuda() -> None:
    """Make ``"cuda"`` in ``torch.amp.autocast`` / ``torch.amp.GradScaler`` mean ``sim``;
    idempotent, and inert while this process has CUDA or ``sim`` is not installed."""
    global _patched
    if _patched:
        return
    autocast = torch.amp.autocast_mode.autocast
    scaler = torch.amp.grad_scaler.GradScaler
    plain_autocast, plain_scaler = autocast.__init__, scaler.__init__

    @functools.wraps(plain_autocast)
    def autocast_init(self: Any, device_type: Any = None, *args: Any, **kwargs: Any) -> None:
        if device_type is None:
            device_type = kwargs.pop("device_type")
        plain_autocast(self, _device(device_type), *args, **kwargs)

    @functools.wraps(plain_scaler)
    def scaler_init(self: Any, device: Any = "cuda", *args: Any, **kwargs: Any) -> None:
        plain_scaler(self, _device(device), *args, **kwargs)

    autocast.__init__ = autocast_init  # type: ignore[method-assign]
    scaler.__init__ = scaler_init  # type: ignore[method-assign]
    _patched = True
