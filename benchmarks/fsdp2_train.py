"""A plain FSDP2 training script (``fully_shard``), device-agnostic as PyTorch's own examples
are: one process per accelerator, launched by ``torchrun``; on a machine without one, the CPU
over gloo (``--cpu``).

``torchrun --nproc-per-node 2 benchmarks/fsdp2_train.py [--steps N] [--out DIR] [--cpu]``

It knows nothing of perf: on a CPU-only box, ``python -m perf sim --devices 2 -- torchrun
--nproc-per-node 2 benchmarks/fsdp2_train.py`` runs it unchanged on two simulated devices
(docs/sim.md, "Several devices and collectives"). Each ``Linear`` is its own FSDP unit and
the root wraps the rest; parameters are resharded after forward (each unit is all-gathered
again for backward) and gradients reduce-scattered. ``--out DIR`` writes each rank's losses,
its shard's shape and its parameter checksum to ``DIR/rank{N}.json``.
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
from torch.distributed.fsdp import fully_shard


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
    )  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default=None, help="write each rank's losses here")
    p.add_argument("--cpu", action="store_true", help="CPU tensors over gloo, no accelerator")
    args = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ["LOCAL_RANK"])
    if args.cpu:
        dist.init_process_group(backend="gloo")
        device = torch.device("cpu")
    else:
        acc = torch.accelerator.current_accelerator()
        if acc is None or torch.accelerator.device_count() < world:
            print(f"needs {world} accelerators, found {torch.accelerator.device_count()}",
                  file=sys.stderr)  # fmt: skip
            return 1
        device = torch.device(acc.type, rank)
        torch.accelerator.set_device_index(rank)
        # bound to the rank's device, as PyTorch's FSDP2 example binds it
        dist.init_process_group(backend=dist.get_default_backend_for_device(acc), device_id=device)

    torch.manual_seed(0)
    model = make_model().to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(rank)  # each rank its own batch, as a sampler gives
    losses: list[float] = []
    for _ in range(args.steps):
        x = torch.randn(32, 16, generator=g).to(device)
        y = x.sum(dim=1, keepdim=True).sin()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    with torch.no_grad():
        shard = model[0].weight.to_local()  # type: ignore[operator]
        checksum = sum(float(p.to_local().double().sum()) for p in model.parameters())  # type: ignore[operator]
    if rank == 0:
        print(f"step {args.steps}: loss {losses[-1]:.4f}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        facts = {
            "device": str(device),
            "backend": dist.get_backend(),
            "losses": losses,
            "shard_shape": list(shard.shape),
            "shard_device": str(shard.device),
            "param_checksum": checksum,
        }
        (out / f"rank{rank}.json").write_text(json.dumps(facts))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
