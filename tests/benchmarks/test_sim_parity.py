"""Parity: the simulated device counts what ``cuda:0`` does, for the same training loops.

On a CUDA machine each loop runs on ``cuda:0`` under ``count_syncs``, ``count_transfers`` and
``torch.cuda.set_sync_debug_mode("warn")`` (CUDA's own sync detector), and the same loops run on
the simulated device in a child process (the simulated device is for processes without a real
accelerator). Sync counts, sync kinds, transfer counts and bytes must be identical, and the CUDA
count must equal the debug mode's, for each loop and for each habit on its own (``HABITS``: a
loop's total can hide two errors that cancel). On a CPU-only box the test skips, naming CUDA;
the loops themselves run on the simulated device in tests/harness/test_sim_training_patterns.py,
the habits in tests/harness/test_sim_sync_cases.py.

Calls whose kernel torch picks by device (``KERNEL_PATHS``: attention's backend, RMSNorm's
fused kernel) are compared by their op stream.

Run by hand on a GPU box to see the numbers: ``python tests/benchmarks/test_sim_parity.py cuda``
(``cuda-paths`` for the kernel choices; ``sim`` / ``sim-paths`` for the simulated device's
side).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from suite_support import cuda_debug_syncs
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import perf

Loop = Callable[[torch.device], Callable[[], Any]]


def _mlp(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(
        device
    )


def _data(device: torch.device, n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)  # host data, identical on every device
    return torch.randn(n, 8, generator=g).to(device), torch.randint(0, 3, (n,), generator=g).to(
        device
    )


def log_every_k(device: torch.device) -> Callable[[], Any]:
    model, (X, y) = _mlp(device), _data(device)
    opt = torch.optim.Adam(model.parameters())

    def run() -> None:
        for step in range(1, 21):
            opt.zero_grad()
            loss = F.cross_entropy(model(X), y)
            loss.backward()
            opt.step()
            if step % 5 == 0:
                f"{loss.item():.4f}"

    return run


def clip_adamw(device: torch.device) -> Callable[[], Any]:
    model, (X, y) = _mlp(device), _data(device)
    opt = torch.optim.AdamW(model.parameters())

    def run() -> None:
        for _ in range(5):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(X), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

    return run


def nanogpt_batches(device: torch.device) -> Callable[[], Any]:
    data = np.random.default_rng(0).integers(0, 64, 2048).astype(np.uint16)

    def run() -> None:
        torch.manual_seed(0)
        for _ in range(5):
            ix = torch.randint(len(data) - 16, (4,))
            x = torch.stack([torch.from_numpy(data[i : i + 16].astype(np.int64)) for i in ix])
            x.pin_memory().to(device, non_blocking=True)

    return run


def loader_epoch(pin: bool, workers: int) -> Loop:
    def make(device: torch.device) -> Callable[[], Any]:
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(50, 8, generator=g), torch.randint(0, 3, (50,), generator=g))
        loader = DataLoader(ds, batch_size=10, shuffle=True, pin_memory=pin, num_workers=workers)
        model = _mlp(device)

        def run() -> None:
            for xb, yb in loader:
                xb, yb = xb.to(device, non_blocking=pin), yb.to(device, non_blocking=pin)
                F.cross_entropy(model(xb), yb).backward()

        return run

    return make


def eval_per_batch_item(device: torch.device) -> Callable[[], Any]:
    model = _mlp(device).eval()
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(
        TensorDataset(torch.randn(40, 8, generator=g), torch.randint(0, 3, (40,), generator=g)),
        batch_size=8,
    )

    def run() -> None:
        with torch.no_grad():
            for xb, yb in loader:
                out = model(xb.to(device))
                F.cross_entropy(out, yb.to(device)).item()
                (out.argmax(1) == yb.to(device)).sum().item()

    return run


def amp_grad_scaler(device: torch.device) -> Callable[[], Any]:
    model, (X, y) = _mlp(device), _data(device)
    opt = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler(device.type)

    def run() -> None:
        for step in range(1, 9):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.float16):
                loss = F.cross_entropy(model(X), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            if step % 4 == 0:
                loss.item()

    return run


def lstm_dropout(device: torch.device) -> Callable[[], Any]:
    """cuDNN's RNN with dropout: its dropout state is made on the first training call after
    a reseed, from a seed read off the device (1 sync), then 1 ``loss.item()`` per step."""
    torch.manual_seed(0)
    model = torch.nn.LSTM(8, 16, num_layers=2, dropout=0.5).to(device)
    x = torch.randn(6, 4, 8, generator=torch.Generator().manual_seed(0)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def run() -> None:
        for _ in range(3):
            loss = model(x)[0].pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()

    return run


def _vec(device: torch.device) -> torch.Tensor:
    return torch.linspace(-1, 1, 16).to(device)


def _mask_backward(device: torch.device) -> Callable[[], Any]:
    w = torch.linspace(-1, 1, 16).to(device).requires_grad_()
    return lambda: w[w > 0].sum().backward()


def _ctc(reduction: str) -> Loop:
    """A CTC loss's forward and backward with list lengths: the copies inside CUDA's kernels
    (``_ctc_loss``, ``_ctc_loss_backward``: three each), and the mean's copy of the lengths.
    (With device length tensors the composite's path depends on whether a dispatch mode is
    on, which ``count_syncs`` on CUDA is and on ``sim`` is not: docs/sim.md.)"""

    def make(device: torch.device) -> Callable[[], Any]:
        g = torch.Generator().manual_seed(0)
        lp = torch.randn(12, 3, 6, generator=g).log_softmax(2).to(device).requires_grad_()
        targets = torch.randint(1, 6, (3, 4), generator=g).to(device)
        return lambda: F.ctc_loss(
            lp, targets, [12, 12, 10], [4, 3, 2], reduction=reduction
        ).backward()

    return make


def _event_sync(device: torch.device) -> Callable[[], Any]:
    mod = torch.get_device_module(device)
    return lambda: (lambda e: (e.record(), e.synchronize()))(mod.Event())


#: one habit each: compared on its own, so two errors cannot cancel in a loop's total
#: (tests/harness/test_sim_sync_cases.py derives each count from the CUDA source)
HABITS: dict[str, Loop] = {
    "float": lambda d: (lambda t: lambda: float(t.sum()))(_vec(d)),
    "bool": lambda d: (lambda t: lambda: bool(t.sum() > 0))(_vec(d)),
    "tolist": lambda d: (lambda t: lambda: t.tolist())(_vec(d)),
    "cpu": lambda d: (lambda t: lambda: t.cpu())(_vec(d)),
    "nonzero": lambda d: (lambda t: lambda: t.nonzero())(_vec(d)),
    "bool_mask_index": lambda d: (lambda t: lambda: t[t > 0])(_vec(d)),
    "masked_select": lambda d: (lambda t: lambda: t.masked_select(t > 0))(_vec(d)),
    "unique": lambda d: (lambda t: lambda: t.unique())(_vec(d)),
    "repeat_interleave": lambda d: (lambda c: lambda: torch.repeat_interleave(c))(
        torch.tensor([1, 2, 3]).to(d)
    ),
    "repeat_interleave_output_size": lambda d: (
        lambda c: lambda: torch.repeat_interleave(c, output_size=6)
    )(torch.tensor([1, 2, 3]).to(d)),
    "equal_alias": lambda d: (lambda t: lambda: torch.equal(t, t))(_vec(d)),
    "equal_copy": lambda d: (lambda t: lambda: torch.equal(t, t.clone()))(_vec(d)),
    "torch_tensor": lambda d: lambda: torch.tensor([1.0, 2.0], device=d),
    "pinned_non_blocking_d2h": lambda d: (
        lambda t: lambda: torch.empty(16).pin_memory().copy_(t, non_blocking=True)
    )(_vec(d)),
    "pageable_non_blocking_d2h": lambda d: (
        lambda t: lambda: torch.empty(16).copy_(t, non_blocking=True)
    )(_vec(d)),
    "pageable_d2h": lambda d: (lambda t: lambda: torch.empty(16).copy_(t))(_vec(d)),
    "to_cpu_non_blocking": lambda d: (lambda t: lambda: t.to("cpu", non_blocking=True))(_vec(d)),
    "mask_setitem_scalar": lambda d: (lambda t: lambda: t.__setitem__(t > 0, 0.0))(_vec(d)),
    "mask_setitem_tensor": lambda d: (lambda t: lambda: t.__setitem__(t > 0, t[t > 0] * 2))(
        _vec(d)
    ),
    "index_setitem_scalar": lambda d: (lambda t, i: lambda: t.__setitem__(i, 0.0))(
        _vec(d), torch.tensor([0, 2]).to(d)
    ),
    "mask_index_backward": _mask_backward,
    "bincount": lambda d: (lambda x: lambda: torch.bincount(x))(torch.tensor([0, 1, 1]).to(d)),
    "histc": lambda d: (lambda t: lambda: torch.histc(t))(_vec(d)),
    "histc_range": lambda d: (lambda t: lambda: torch.histc(t, min=-1, max=1))(_vec(d)),
    "multinomial": lambda d: (lambda p: lambda: torch.multinomial(p, 2))(torch.ones(4).to(d)),
    "linalg_cholesky": lambda d: (lambda a: lambda: torch.linalg.cholesky(a))(torch.eye(3).to(d)),
    "linalg_cholesky_ex_check_errors": lambda d: (
        lambda a: lambda: torch.linalg.cholesky_ex(a, check_errors=True)
    )(torch.eye(3).to(d)),
    "stream_synchronize": lambda d: (
        lambda: torch.get_device_module(d).current_stream().synchronize()
    ),
    "event_synchronize": _event_sync,
    "device_synchronize": lambda d: lambda: torch.get_device_module(d).synchronize(),
    "accelerator_synchronize": lambda d: lambda: torch.accelerator.synchronize(),
    "ctc_loss_mean": _ctc("mean"),
    "ctc_loss_sum": _ctc("sum"),
    "distribution_validation": lambda d: (
        lambda x, a: (
            lambda: torch.distributions.Categorical(logits=x, validate_args=True).log_prob(a)
        )
    )(_vec(d).view(4, 4), torch.zeros(4, dtype=torch.long).to(d)),
}


LOOPS: dict[str, Loop] = {
    "log_every_k": log_every_k,
    "clip_adamw": clip_adamw,
    "nanogpt_batches": nanogpt_batches,
    "loader_pageable": loader_epoch(False, 0),
    "loader_pinned_workers": loader_epoch(True, 2),
    "eval_per_batch_item": eval_per_batch_item,
    "amp_grad_scaler": amp_grad_scaler,
    "lstm_dropout": lstm_dropout,
    **{f"habit_{name}": make for name, make in HABITS.items()},
}


def _qkv(device: torch.device, dtype: torch.dtype, heads: tuple[int, int] = (4, 4)) -> list[Any]:
    g = torch.Generator().manual_seed(0)
    shapes = [(2, heads[0], 16, 32), (2, heads[1], 16, 32), (2, heads[1], 16, 32)]
    return [torch.randn(s, generator=g).to(device, dtype).requires_grad_() for s in shapes]


def _attention(dtype: torch.dtype, heads: tuple[int, int] = (4, 4), **kw: Any) -> Loop:
    def make(device: torch.device) -> Callable[[], Any]:
        q, k, v = _qkv(device, dtype, heads)
        args = dict(kw)
        if args.get("attn_mask") == "bool":
            args["attn_mask"] = (torch.arange(16)[:, None] >= torch.arange(16)).to(device)
        return lambda: F.scaled_dot_product_attention(q, k, v, **args).float().sum().backward()

    return make


def _attention_strided(device: torch.device) -> Callable[[], Any]:
    """A last dimension of stride 16: both fused kernels refuse it; math."""
    q, k, v = (
        t.detach().transpose(-1, -2).contiguous().transpose(-1, -2)
        for t in _qkv(device, torch.float32)
    )
    q.requires_grad_()
    return lambda: F.scaled_dot_product_attention(q, k, v).sum().backward()


def _attention_value_head(device: torch.device) -> Callable[[], Any]:
    """Query and key heads of 32, value heads of 16 (multi-head latent attention's shape):
    flash needs one head dim; memory-efficient takes it."""
    q, k, v = _qkv(device, torch.bfloat16)
    v = v.detach()[..., :16].contiguous().requires_grad_()
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum().backward()


def _rms_norm(device: torch.device) -> Callable[[], Any]:
    """``nn.RMSNorm``'s call: CUDA's fused kernel forward and backward."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=g).to(device, torch.bfloat16).requires_grad_()
    w = torch.ones(64, device=device, dtype=torch.bfloat16, requires_grad=True)
    return lambda: F.rms_norm(x, (64,), w, 1e-6).float().sum().backward()


#: calls whose kernel torch picks by device, as models make them: the kernels CUDA's SDPA picks
#: and RMSNorm's fused kernel (the op stream, forward and backward), which ``sim`` must pick alike
KERNEL_PATHS: dict[str, Loop] = {
    "fp16_causal": _attention(torch.float16, is_causal=True),
    "bf16_grouped_query": _attention(torch.bfloat16, (4, 2), is_causal=True, enable_gqa=True),
    "fp32_causal": _attention(torch.float32, is_causal=True),
    "fp32_bool_mask_dropout": _attention(torch.float32, attn_mask="bool", dropout_p=0.1),
    "fp32_grouped_query": _attention(torch.float32, (4, 2), enable_gqa=True),
    "fp32_last_dim_strided": _attention_strided,
    "bf16_value_head_dim_of_its_own": _attention_value_head,
    "bf16_rms_norm": _rms_norm,
}


def path_ops(device: torch.device) -> dict[str, dict[str, int]]:
    """Each :data:`KERNEL_PATHS` call's ops by name, as ``count_ops`` counts them (plain JSON)."""
    out = {}
    for name, make in KERNEL_PATHS.items():
        run = make(device)
        with perf.count_ops(device) as ops:
            run()
        out[name] = dict(sorted(ops.by_op.items()))
    return out


def count(device: torch.device, name: str, debug_mode: bool = False) -> dict[str, Any]:
    """Counts of one loop on ``device`` (plain JSON); with ``debug_mode`` (CUDA) also the
    number of syncs ``torch.cuda.set_sync_debug_mode("warn")`` reports."""
    run = LOOPS[name](device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if debug_mode:
            torch.cuda.synchronize(device)
            torch.cuda.set_sync_debug_mode("warn")
        try:
            with perf.count_syncs(device) as s, perf.count_transfers() as t:
                run()
        finally:
            if debug_mode:
                torch.cuda.set_sync_debug_mode("default")
    out: dict[str, Any] = {
        "syncs": s.count,
        "by_op": s.by_op,
        "h2d_copies": t.h2d_copies,
        "h2d_bytes": t.h2d_bytes,
        "d2h_copies": t.d2h_copies,
        "d2h_bytes": t.d2h_bytes,
        "pinned_h2d_copies": t.pinned_h2d_copies,
    }
    if debug_mode:
        out["debug_mode_syncs"] = cuda_debug_syncs(caught)
    return out


def _sim_side(mode: str) -> dict[str, Any]:
    """This script's ``mode`` (``sim``, ``sim-paths``) in a CPU-only child: the simulated
    device is for processes without a real accelerator."""
    proc = subprocess.run(
        [sys.executable, __file__, mode],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.perf_cuda
def test_sim_counts_equal_cuda_counts(device: torch.device, perf_metrics) -> None:
    sim = _sim_side("sim")
    mismatches = []
    for name in LOOPS:
        cuda = count(device, name, debug_mode=True)
        debug = cuda.pop("debug_mode_syncs")
        perf_metrics.record(f"{name}_syncs", cuda["syncs"], "syncs")
        if cuda != sim[name] or debug != cuda["syncs"]:
            mismatches.append((name, {"cuda": cuda, "debug_mode": debug, "sim": sim[name]}))
    assert not mismatches, mismatches


@pytest.mark.perf_cuda
def test_sim_runs_the_kernels_cuda_picks(device: torch.device) -> None:
    """``sim`` runs CUDA's SDPA composite (its choice of flash, memory-efficient or math
    attention, derived from ``sdp_utils.cpp``) and RMSNorm's fused kernel; on a GPU the op
    streams must be equal. A torch build that prefers cuDNN's attention on this GPU (cuDNN
    newer than 9.15 on sm90 / sm100) shows here as a mismatch naming
    ``_scaled_dot_product_cudnn_attention``."""
    sim = _sim_side("sim-paths")
    cuda = path_ops(device)
    mismatches = {n: {"cuda": cuda[n], "sim": sim[n]} for n in KERNEL_PATHS if cuda[n] != sim[n]}
    assert not mismatches, mismatches


def main(argv: list[str]) -> int:
    which = argv[0] if argv else "sim"
    on_sim = which.startswith("sim")
    device = perf.simulated_device() if on_sim else torch.device("cuda:0")
    if which.endswith("paths"):
        print(json.dumps(path_ops(device), indent=1))
        return 0
    debug = device.type == "cuda"
    print(json.dumps({name: count(device, name, debug) for name in LOOPS}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
