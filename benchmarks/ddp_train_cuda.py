"""A data-parallel training script written for CUDA and NCCL, the way PyTorch's DDP tutorial
series writes one: ``torch.cuda.set_device(LOCAL_RANK)``, ``init_process_group("nccl")``,
the job sized by ``torch.cuda.device_count()``, the model placed by index (``.to(rank)``),
and a snapshot that the next run resumes from with ``map_location=f"cuda:{rank}"``.

``torchrun --nproc-per-node 2 benchmarks/ddp_train_cuda.py --snapshot S [--epochs N] --out DIR``

It knows nothing of perf: on a CPU-only box, ``python -m perf sim --devices 2 --as-cuda --
torchrun --nproc-per-node 2 benchmarks/ddp_train_cuda.py ...`` runs it unchanged on two
simulated devices standing in for CUDA (docs/sim.md, "Scripts that name CUDA and NCCL").
Each rank writes what it saw to ``DIR/rank{N}.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import destroy_process_group, get_backend, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--snapshot", required=True, help="resume from here if it exists; save here")
    p.add_argument("--out", required=True, help="each rank writes rank{N}.json here")
    args = p.parse_args()

    world = int(os.environ["WORLD_SIZE"])
    if torch.cuda.device_count() < world:
        print(f"needs {world} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 1
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    init_process_group(backend="nccl")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1)).to(rank)
    start = 0
    if os.path.exists(args.snapshot):
        snap = torch.load(args.snapshot, map_location=f"cuda:{rank}")
        model.load_state_dict(snap["model"])
        start = snap["epochs_run"]
    model = DDP(model, device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(rank)
    steps = 8
    for epoch in range(start, start + args.epochs):
        for _ in range(steps):
            x, y = torch.randn(32, 20, generator=g), torch.randn(32, 1, generator=g)
            x, y = x.to(rank), y.to(rank)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        if rank == 0:
            snap = {"model": model.module.state_dict(), "epochs_run": epoch + 1}
            torch.save(snap, args.snapshot)
    weight = next(model.parameters())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, f"rank{rank}.json").write_text(
        json.dumps({
            "rank": rank, "device": str(weight.device), "backend": get_backend(),
            "current_device": torch.cuda.current_device(), "resumed_at": start,
            "saved": start + args.epochs, "steps": args.epochs * steps,
            "weight_sum": weight.sum().item(),
            "params": sum(q.numel() for q in model.parameters()),
        })
    )  # fmt: skip
    destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
