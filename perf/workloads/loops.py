"""Training-step and loop builders the suite measures.

Each builder returns plain callables, so the same step runs under a counter, a memory meter or
``perf.compare`` unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def train_loop(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    X: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    log_every: int,
    *,
    loss_fn: LossFn = F.cross_entropy,
) -> list[float]:
    """Full-batch training for ``steps`` steps, logging ``loss.item()`` every ``log_every``-th.

    Returns the logged losses: ``steps // log_every`` values, one host-device sync each (P2).
    ``log_every <= 0`` never logs.
    """
    logged: list[float] = []
    for i in range(1, steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(X), y)
        loss.backward()
        opt.step()
        if log_every > 0 and i % log_every == 0:
            logged.append(loss.item())
    return logged


def make_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    loss_fn: LossFn = F.cross_entropy,
    autocast_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> Callable[[], torch.Tensor]:
    """One full-batch step as a closure returning the (unsynced) loss tensor.

    With ``autocast_dtype`` only the forward pass and the loss run under
    ``torch.autocast(device_type=...)``; backward and the optimizer step run outside it (one
    seed gets this wrong). ``scaler`` is a ``torch.amp.GradScaler("cuda")`` for fp16.
    """
    device_type = X.device.type

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        if autocast_dtype is not None:
            with torch.autocast(device_type=device_type, dtype=autocast_dtype):
                loss = loss_fn(model(X), y)
        else:
            loss = loss_fn(model(X), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        return loss.detach()

    return step


def accumulate_gradients(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    micro_batches: int,
    *,
    loss_fn: LossFn = F.cross_entropy,
) -> None:
    """Gradient accumulation: ``micro_batches`` equal chunks, each loss scaled by 1/k.

    With a mean-reduced loss and equal chunks, the accumulated gradient equals the gradient of
    the full batch (P10).
    """
    n = X.shape[0]
    if n % micro_batches:
        raise ValueError(f"batch {n} does not split into {micro_batches} equal micro-batches")
    for xb, yb in zip(X.chunk(micro_batches), y.chunk(micro_batches), strict=True):
        (loss_fn(model(xb), yb) / micro_batches).backward()


def make_eval_step(
    model: nn.Module, X: torch.Tensor, *, no_grad: bool = True
) -> Callable[[], torch.Tensor]:
    """An evaluation forward pass, under ``torch.no_grad()`` or with autograd recording (P11)."""

    def step() -> torch.Tensor:
        if no_grad:
            with torch.no_grad():
                return model(X)
        return model(X)

    return step


def grads(model: nn.Module) -> list[torch.Tensor]:
    """Detached copies of every parameter's gradient (zeros where none), in parameter order."""
    return [
        torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
        for p in model.parameters()
    ]
