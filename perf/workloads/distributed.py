"""Data-parallel workload: DDP with a communication hook that counts all-reduces (P12), on CPU
tensors over gloo, on ``cuda:rank`` over nccl, or on ``sim:rank`` over the simulated device's
backend (``backend="sim"``: each rank installs ``sim`` with ``world_size`` devices).

``ddp_facts`` and ``ddp_facts_each`` are ``torch.multiprocessing.spawn`` targets, so they live
in an importable module: spawned children re-import them by name. Each rank writes what it
observed to a JSON file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from perf.workloads.data import synthetic_classification
from perf.workloads.models import mlp, param_bytes


@dataclass
class AllreduceLog:
    """State of :func:`counting_allreduce_hook`: all-reduce rounds and gradient bytes sent."""

    calls: int = 0
    bytes: int = 0

    def reset(self) -> None:
        self.calls = 0
        self.bytes = 0


def counting_allreduce_hook(
    state: AllreduceLog, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's own all-reduce hook, counting each call and the bytes of its gradient bucket."""
    buf = bucket.buffer()
    state.calls += 1
    state.bytes += buf.numel() * buf.element_size()
    return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]


# DDP checks the hook's annotations by identity; postponed (string) annotations fail that check.
counting_allreduce_hook.__annotations__.update(
    bucket=dist.GradBucket, state=AllreduceLog, **{"return": torch.futures.Future[torch.Tensor]}
)


def _backend_count(device: torch.device) -> Any:
    """The sim backend's collective count for a block (a null context elsewhere)."""
    if device.type != "sim":
        return contextlib.nullcontext()
    from perf.sim.distributed import count_collectives

    return count_collectives()


def _flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])  # type: ignore[union-attr]


def ddp_facts(
    rank: int,
    world_size: int,
    port: int,
    out_dir: str,
    backend: str = "gloo",
    accumulation_steps: int = 4,
    timed_steps: int = 0,
) -> None:
    """One DDP run collecting the P12 facts; writes ``rank{rank}.json`` into ``out_dir``.

    float64 model and data, so "DDP gradient == full-batch gradient" can be checked to 1e-12.
    Facts: all-reduce calls and bytes of one synced step; the full-batch gradient error;
    calls with ``no_sync()`` accumulation versus syncing every micro-step; optional step times.
    """
    _one_run(rank, world_size, port, Path(out_dir), backend, accumulation_steps, timed_steps)
    _leave()


def ddp_facts_each(
    rank: int,
    world_size: int,
    ports: list[int],
    out_dir: str,
    backends: list[str],
    accumulation_steps: int = 4,
) -> None:
    """:func:`ddp_facts` for each backend in turn, in the same two processes (one spawn, one
    torch import per rank, where a spawn per backend costs seconds each on a small CI box);
    writes ``BACKEND/rank{rank}.json`` into ``out_dir``. ``sim`` goes last: it installs the
    simulated device for the rest of the process."""
    for backend, port in zip(backends, ports, strict=True):
        out = Path(out_dir, backend)
        out.mkdir(parents=True, exist_ok=True)
        _one_run(rank, world_size, port, out, backend, accumulation_steps, 0)
    _leave()


def _one_run(
    rank: int,
    world_size: int,
    port: int,
    out_dir: Path,
    backend: str,
    accumulation_steps: int,
    timed_steps: int,
) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # One share of the cores per rank, as torchrun does (OMP_NUM_THREADS=1): ranks that each
    # spin up all-core thread pools oversubscribe the CPU and stall tiny ops for milliseconds.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    if backend == "sim":
        from perf.sim.device import simulated_device

        simulated_device(count=world_size)
    kind = {"nccl": "cuda", "sim": "sim"}.get(backend, "cpu")
    device = torch.device(kind, rank) if kind != "cpu" else torch.device("cpu")
    if device.type != "cpu":
        torch.accelerator.set_device_index(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        facts = _collect(rank, world_size, device, accumulation_steps, timed_steps)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(facts))
        dist.barrier()  # no rank tears down while the other still talks to it
    finally:
        dist.destroy_process_group()


def _leave() -> None:
    """Leave without interpreter finalisation."""
    # Leave without interpreter finalisation. Measured here: about 1 spawn in 80 on a loaded
    # 2-core box, a gloo rank died of SIGABRT ("terminate called without an active
    # exception") *after* its work and destroy_process_group() were done, with no Python
    # frame on the stack: a C++ thread still joinable when static destructors run at exit
    # (cf. pytorch/pytorch#179291). The facts are on disk by now; a failure above still
    # raises normally, so torch.multiprocessing.spawn reports it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _data_parallel_facts(
    world: int, x: torch.Tensor, y: torch.Tensor, ref: torch.nn.Module, dtype: torch.dtype
) -> dict[str, Any]:
    """One ``nn.DataParallel`` step over ``sim:0`` ... ``sim:world-1`` in this process, on the
    whole batch: the bytes it moves between devices (``perf.count_transfers``) and its
    gradient's error against ``ref``'s (the full-batch gradient, already computed)."""
    from perf.instruments.transfers import count_transfers

    net = mlp(32, 64, 2, 5, seed=0).to(device=x.device, dtype=dtype)
    dp = torch.nn.DataParallel(net, device_ids=list(range(world)))
    with warnings.catch_warnings():  # "PyTorch is not compiled with NCCL support"
        warnings.simplefilter("ignore")
        with count_transfers() as moved:
            F.cross_entropy(dp(x), y).backward()
    err = (_flat_grads(net) - _flat_grads(ref)).abs().max()
    return {
        "dp_step_d2d_bytes": moved.d2d_bytes,
        "dp_step_host_copies": moved.h2d_copies + moved.d2h_copies,
        "dp_grad_max_abs_err": float(err),
    }


def _collect(
    rank: int, world: int, device: torch.device, k: int, timed_steps: int
) -> dict[str, Any]:
    # float64 where the kernels are the CPU's (sim runs them too): exact comparisons
    dtype = torch.float32 if device.type == "cuda" else torch.float64
    per_rank = 16
    x, y = synthetic_classification(world * per_rank * k, 32, 5, seed=1, dtype=dtype)
    x, y = x.to(device), y.to(device)
    ref = mlp(32, 64, 2, 5, seed=0).to(device=device, dtype=dtype)
    model = DDP(
        mlp(32, 64, 2, 5, seed=0).to(device=device, dtype=dtype),
        device_ids=[device.index] if device.type != "cpu" else None,
    )
    log = AllreduceLog()
    model.register_comm_hook(log, counting_allreduce_hook)
    facts: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "param_bytes": param_bytes(ref),
        "accumulation_steps": k,
    }

    # 1. one synced step on this rank's shard vs the full-batch gradient of the whole batch
    n = world * per_rank
    xs, ys = x[:n], y[:n]
    shard = slice(rank * per_rank, (rank + 1) * per_rank)
    with _backend_count(device) as seen:
        F.cross_entropy(model(xs[shard]), ys[shard]).backward()
    F.cross_entropy(ref(xs), ys).backward()
    facts["step_allreduce_calls"] = log.calls
    facts["step_allreduce_bytes"] = log.bytes
    if device.type == "sim":  # what the backend itself saw (perf.sim.distributed)
        facts["backend_allreduce_calls"] = seen.allreduce_calls
        facts["backend_allreduce_bytes"] = seen.allreduce_bytes
    facts["grad_max_abs_err"] = float((_flat_grads(model) - _flat_grads(ref)).abs().max())
    facts["grad_max_abs"] = float(_flat_grads(ref).abs().max())
    facts["grad_checksum"] = float(_flat_grads(model).double().sum())

    if device.type == "sim" and rank == 0:
        facts.update(_data_parallel_facts(world, xs, ys, ref, dtype))

    # 2. k micro-steps per rank: sync every micro-step, then no_sync() for all but the last
    def accumulate(use_no_sync: bool) -> tuple[int, int]:
        model.zero_grad(set_to_none=True)
        log.reset()
        for i in range(k):
            lo = (i * world + rank) * per_rank
            xb, yb = x[lo : lo + per_rank], y[lo : lo + per_rank]
            if use_no_sync and i < k - 1:
                with model.no_sync():
                    (F.cross_entropy(model(xb), yb) / k).backward()
            else:
                (F.cross_entropy(model(xb), yb) / k).backward()
        return log.calls, log.bytes

    facts["sync_every_step_calls"], facts["sync_every_step_bytes"] = accumulate(False)
    facts["no_sync_calls"], facts["no_sync_bytes"] = accumulate(True)
    ref.zero_grad(set_to_none=True)
    F.cross_entropy(ref(x), y).backward()
    facts["no_sync_grad_max_abs_err"] = float((_flat_grads(model) - _flat_grads(ref)).abs().max())

    # 3. optional: step times (for DataParallel vs DDP on GPUs)
    if timed_steps:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        xb, yb = x[:per_rank], y[:per_rank]
        samples: list[float] = []
        for i in range(timed_steps + 3):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 3:
                samples.append(time.perf_counter() - t0)
        facts["step_time_samples_s"] = samples
    return facts
