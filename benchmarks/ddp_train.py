"""A plain data-parallel training script, written for GPUs and device-agnostic as PyTorch's
own DDP examples are: one process per accelerator, launched by ``torchrun``.

``torchrun --nproc-per-node 2 benchmarks/ddp_train.py [--epochs N] [--out DIR]``

It knows nothing of perf: on a CPU-only box, ``python -m perf sim --devices 2 -- torchrun
--nproc-per-node 2 benchmarks/ddp_train.py`` runs it unchanged on two simulated devices
(docs/sim.md, "Several devices and collectives"). DDP with a BatchNorm (buffers broadcast
every forward), gradient accumulation with ``no_sync()``, a ``DistributedSampler``; rank 0
prints the loss per epoch. ``--out DIR`` writes each rank's losses to ``DIR/rank{N}.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

ACCUMULATE = 2  # micro-batches per optimizer step; all but the last under no_sync()


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
        nn.Linear(32, 1),
    )  # fmt: skip


def make_data(n: int = 512) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(n, 1, generator=g))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", default=None, help="write each rank's losses here")
    args = p.parse_args()

    acc = torch.accelerator.current_accelerator()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if acc is None or torch.accelerator.device_count() < world:
        print(f"needs {world} accelerators, found {torch.accelerator.device_count()}",
              file=sys.stderr)  # fmt: skip
        return 1
    rank = int(os.environ["LOCAL_RANK"])
    torch.accelerator.set_device_index(rank)
    dist.init_process_group(backend=dist.get_default_backend_for_device(acc))
    device = torch.device(acc.type, rank)

    torch.manual_seed(0)
    model = DDP(make_model().to(device), device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    data = make_data()
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler, pin_memory=True)

    losses: list[float] = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros((), device=device)
        for i, (x, y) in enumerate(loader):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            step = (i + 1) % ACCUMULATE == 0
            if step:
                loss = nn.functional.mse_loss(model(x), y)
                (loss / ACCUMULATE).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                with model.no_sync():
                    loss = nn.functional.mse_loss(model(x), y)
                    (loss / ACCUMULATE).backward()
            total += loss.detach()
        dist.all_reduce(total)  # the epoch's mean loss over all ranks
        losses.append(total.item() / (len(loader) * world))
        if rank == 0:
            print(f"epoch {epoch}: loss {losses[-1]:.4f} on {device} (world {world})")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, f"rank{rank}.json").write_text(
            json.dumps({"rank": rank, "device": str(device), "backend": dist.get_backend(),
                        "losses": losses, "steps_per_epoch": len(loader)})
        )  # fmt: skip
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
