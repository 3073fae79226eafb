"""Training-loop patterns from real code, counted on the simulated device.

Each expected number is the CUDA truth derived by reading the loop (the comments give the
derivation), by CUDA's rule: a host read of device memory or a copy between host and device
with ``non_blocking=False`` is a sync; host-only work never is; a non-blocking copy never is.
tests/benchmarks/test_sim_parity.py runs loops like these on ``cuda:0`` where one exists.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _sim import SIM, needs_sim
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import perf

pytestmark = needs_sim


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def test_gradient_clipping_is_sync_free():
    model = _mlp().to(SIM)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    X, y = torch.randn(32, 8).to(SIM), torch.randint(0, 3, (32,)).to(SIM)
    with perf.count_syncs() as s, perf.count_transfers() as t:
        for _ in range(10):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(X), y).backward()
            # clip_grad_norm_: foreach norms, a device-side clip coefficient, foreach mul_;
            # norm.to(first_device) is a same-device no-op. error_if_nonfinite=False reads
            # nothing. AdamW (foreach) reads only its host `step` tensors. CUDA: 0 syncs.
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    assert s.count == 0, s.result()
    assert (t.h2d_copies, t.d2h_copies) == (0, 0)


def _nanogpt_get_batch(data: np.ndarray, block: int, batch: int):
    # nanoGPT's get_batch, CUDA branch: host index tensor slicing a numpy array (host reads of
    # a host tensor: no sync), stacked on the host, pinned, copied without blocking.
    ix = torch.randint(len(data) - block, (batch,))
    x = torch.stack([torch.from_numpy(data[i : i + block].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block].astype(np.int64)) for i in ix])
    return x.pin_memory().to(SIM, non_blocking=True), y.pin_memory().to(SIM, non_blocking=True)


def test_nanogpt_style_loop_counts_only_the_logging_reads():
    torch.manual_seed(0)
    data = np.random.default_rng(0).integers(0, 64, 4096).astype(np.uint16)
    block, batch, steps, log_every = 16, 4, 20, 5
    emb = torch.nn.Embedding(64, 32).to(SIM)
    head = torch.nn.Linear(32, 64).to(SIM)
    params = [*emb.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    X, Y = _nanogpt_get_batch(data, block, batch)
    with perf.count_syncs() as s, perf.count_transfers() as t:
        for it in range(steps):
            logits = head(emb(X))
            loss = F.cross_entropy(logits.view(-1, 64), Y.view(-1))
            X, Y = _nanogpt_get_batch(data, block, batch)  # prefetch the next batch
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if it % log_every == 0:
                lossf = loss.item()  # the only device read: iterations 0, 5, 10, 15
                f"iter {it}: loss {lossf:.4f}"  # formats a Python float
    # CUDA: 4 syncs (20 iterations, logged when it % 5 == 0); 2 pinned non-blocking copies of
    # batch x block int64 per iteration.
    assert s.by_op == {"item": 4}, s.result()
    assert (t.h2d_copies, t.pinned_h2d_copies, t.non_blocking_h2d_copies) == (40, 40, 40)
    assert t.h2d_bytes == 40 * batch * block * 8 and t.d2h_copies == 0


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("pin", [False, True], ids=["pageable", "pinned"])
def test_shuffling_dataloader_epoch(workers, pin):
    ds = TensorDataset(torch.randn(50, 8), torch.randint(0, 3, (50,)))
    loader = DataLoader(ds, batch_size=10, shuffle=True, num_workers=workers, pin_memory=pin)
    model = _mlp().to(SIM)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with perf.count_syncs() as s, perf.count_transfers() as t:
        for xb, yb in loader:  # the sampler's randperm and seeds: host work, no syncs
            # Pageable: a blocking copy each, 2 per batch, 5 batches -> 10 syncs on CUDA.
            # Pinned + non_blocking=True: no sync.
            xb, yb = xb.to(SIM, non_blocking=pin), yb.to(SIM, non_blocking=pin)
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
    assert s.by_op == ({} if pin else {"h2d_copy": 10}), s.result()
    assert t.h2d_copies == 10 and t.pinned_h2d_copies == (10 if pin else 0)
    assert t.h2d_bytes == 50 * 8 * 4 + 50 * 8


def test_host_side_loss_buffer_formatted_and_compared():
    model = _mlp().to(SIM)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    X, y = torch.randn(16, 8).to(SIM), torch.randint(0, 3, (16,)).to(SIM)
    losses = torch.zeros(5)  # a host buffer
    best = float("inf")
    lines = []
    with perf.count_syncs() as s:
        for i in range(15):
            opt.zero_grad()
            loss = F.cross_entropy(model(X), y)
            loss.backward()
            opt.step()
            losses[i % 5] = loss.item()  # one device read per step: 15
            if i % 5 == 4:
                lines.append(f"mean loss {losses.mean():.4f}")  # host tensor: no sync
                if losses.mean() < best:  # host tensor: no sync
                    best = float(losses.mean())  # host tensor: no sync
    assert s.by_op == {"item": 15}, s.result()
    assert len(lines) == 3


@pytest.mark.parametrize("k", [1, 3, 7, 10])
def test_item_every_kth_step(k):
    model = _mlp().to(SIM)
    opt = torch.optim.Adam(model.parameters())
    X, y = torch.randn(16, 8).to(SIM), torch.randint(0, 3, (16,)).to(SIM)
    with perf.count_syncs() as s:
        for step in range(1, 31):
            opt.zero_grad()
            loss = F.cross_entropy(model(X), y)
            loss.backward()
            opt.step()
            if step % k == 0:
                print(f"step {step} loss {loss.item():.3f}")  # floor(30 / k) reads on CUDA
    assert s.by_op == {"item": 30 // k}


def test_eval_loop_with_per_batch_item():
    ds = TensorDataset(torch.randn(40, 8), torch.randint(0, 3, (40,)))
    loader = DataLoader(ds, batch_size=8)
    model = _mlp().to(SIM).eval()
    total, correct = 0.0, 0
    with perf.count_syncs() as s, torch.no_grad():
        for xb, yb in loader:  # 5 batches
            xb, yb = xb.to(SIM), yb.to(SIM)  # 2 blocking copies
            out = model(xb)
            total += F.cross_entropy(out, yb, reduction="sum").item()  # 1 read
            correct += (out.argmax(1) == yb).sum().item()  # 1 read
    # CUDA: 5 x (2 + 2) = 20 syncs.
    assert s.by_op == {"h2d_copy": 10, "item": 10}, s.result()
    assert 0 <= correct <= 40 and total > 0


def test_amp_with_grad_scaler():
    model = _mlp().to(SIM)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(SIM.type)
    X, y = torch.randn(16, 8).to(SIM), torch.randint(0, 3, (16,)).to(SIM)
    with perf.count_syncs() as s:
        for step in range(1, 13):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(SIM.type, dtype=torch.float16):
                loss = F.cross_entropy(model(X), y)
            scaler.scale(loss).backward()  # the scale lives on the device: no read
            scaler.unscale_(opt)  # non-finite check on the device: no read
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)  # reads found_inf once to decide whether to step: 12
            scaler.update()  # on the device: no read
            if step % 4 == 0:
                loss.item()  # 3
    assert s.by_op == {"item": 15}, s.result()
    sites = s.result().site_code
    assert any("loss.item()" in code for code in sites.values()), sites
    # GradScaler.step's read is attributed to the user's line that calls it.
    assert any("scaler.step(opt)" in code for code in sites.values()), sites


def test_stand_in_mode_overcounts_these_loops():
    """Why the stand-in mode is opt-in: on the clipping loop held in CPU tensors it counts the
    host work that real code does (here: 0 on the device, many in stand-in mode)."""
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    X, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    with perf.count_syncs(host_as_device=True) as s:
        for _ in range(10):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(X), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    assert s.count > 0, s.result()
