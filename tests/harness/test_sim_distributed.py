"""Collectives on ``sim`` (``perf.sim.distributed``): the ``sim`` process-group backend, its
counts, and an unmodified DDP script launched by ``torchrun`` on two simulated devices.

In-process tests use a group of one (a file store in ``tmp_path``); the two-process facts come
from the command docs/sim.md gives, run exactly as written in a CPU-only child.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _sim import SIM, needs_sim
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import perf

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Several devices and collectives"

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="needs torch.distributed with gloo (the sim backend rides it)",
)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Any]:
    """The default group, one rank, made as an unmodified program makes it: no backend."""
    dist.init_process_group(init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@needs_sim
def test_init_without_a_backend_picks_sim_for_the_sim_device(group: Any) -> None:
    from perf.sim.distributed import SimProcessGroup

    assert dist.get_default_backend_for_device(SIM) == "sim"
    assert isinstance(group, SimProcessGroup)


@needs_sim
def test_the_group_has_its_name_as_device_mesh_reads_it(group: Any) -> None:
    """A process group keeps its name on its backends; DeviceMesh (FSDP2, DTensor) reads it
    ("ProcessGroup name not set" before the sim group registered one)."""
    from torch.distributed.device_mesh import init_device_mesh

    assert group.group_name  # raised "ProcessGroup name not set"
    mesh = init_device_mesh(SIM.type, (1,))
    x = torch.ones(2, device=SIM)
    dist.all_reduce(x, group=mesh.get_group())
    assert x.tolist() == [1.0, 1.0]


@needs_sim
def test_random_init_of_a_dtensor_on_sim(group: Any) -> None:
    """torchtitan initialises its DTensor parameters with ``nn.init.normal_``; DTensor's RNG
    tracker takes over random ops on a device module that has ``set_rng_state`` and reads the
    state as CUDA's Philox seed and offset, which the CPU generator ``sim`` draws from is not
    (an AssertionError in ``_random.py``). ``sim`` has no ``get_rng_state``, so the op runs on
    the local tensor, from the CPU generator."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = init_device_mesh(SIM.type, (1,))
    w = distribute_tensor(torch.zeros(4, 4, device=SIM), mesh, [Replicate()])
    torch.manual_seed(0)
    torch.nn.init.normal_(w, std=0.02)
    torch.manual_seed(0)
    assert torch.equal(w.to_local().cpu(), torch.zeros(4, 4).normal_(std=0.02))


@needs_sim
def test_attention_on_dtensors_takes_cudas_kernel(group: Any) -> None:
    """Tensor parallelism shards attention heads as DTensors (pytorch/examples'
    ``fsdp_tp_example.py``); on CUDA the composite picks flash or memory-efficient attention,
    which DTensor shards. ``sim`` ran the math backend there, whose host-made causal mask is a
    plain tensor: "aten.add.Tensor got mixed torch.Tensor and DTensor". Now the kernel CUDA
    picks, with the values of the same attention on plain tensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh(SIM.type, (1,))
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, device=SIM, requires_grad=True) for _ in range(3))
    dq, dk, dv = (
        distribute_tensor(t.detach(), mesh, [Shard(1)]).requires_grad_() for t in (q, k, v)
    )
    with perf.count_ops(SIM) as ops:
        out = F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
        out.sum().backward()
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.sum().backward()
    assert ops.by_op["_scaled_dot_product_efficient_attention"] == 1
    assert torch.equal(out.full_tensor(), ref.detach())
    assert torch.equal(dq.grad.full_tensor(), q.grad)


@needs_sim
def test_collectives_take_sim_tensors_in_place_and_are_counted(group: Any) -> None:
    from perf.sim.distributed import count_collectives

    x = torch.arange(4.0, device=SIM)
    gathered = torch.empty(4, device=SIM)
    scattered = torch.empty(4, device=SIM)
    host = torch.ones(3)
    # torch 2.13's names; before them (torch 2.11 has no *_single) the older, same calls
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    with count_collectives() as c:
        dist.all_reduce(x)
        dist.broadcast(x, src=0)
        gather(gathered, x)
        scatter(scattered, x)
        dist.all_reduce(host)  # CPU tensors in the same group go to gloo as they are
        dist.barrier()
    assert x.device == SIM and x.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert gathered.device == SIM and gathered.tolist() == x.tolist() == scattered.tolist()
    assert c.allreduce_calls == 2 and c.allreduce_bytes == 16 + 12
    assert c.calls["broadcast"] == c.calls["_allgather_base"] == 1
    assert c.calls["_reduce_scatter_base"] == 1 and c.bytes["_reduce_scatter_base"] == 16


@needs_sim
def test_ddp_checks_parameter_shapes_and_all_reduces_each_bucket(group: Any) -> None:
    """DDP's constructor (``_verify_param_shape_across_processes``, the module-state
    broadcast) and its reducer's bucket all-reduce run on ``sim`` tensors, in C++."""
    from perf.sim.distributed import count_collectives

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).to(SIM)
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=1)
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    x = torch.randn(4, 8, device=SIM)
    with count_collectives() as c:
        ddp(x).sum().backward()
    assert c.allreduce_calls == 1 and c.allreduce_bytes == n_bytes
    assert c.calls["broadcast"] >= 1  # broadcast_buffers: the BatchNorm buffers
    with count_collectives() as c, ddp.no_sync():
        ddp(x).sum().backward()
    assert c.allreduce_calls == 0
    assert all(p.grad is not None and p.grad.device == SIM for p in model.parameters())


def _documented_command() -> str:
    text = (ROOT / "docs" / "sim.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1]
    m = re.search(r"```bash\n(python -m perf sim .*?)```", section, re.S)
    assert m, "docs/sim.md's multi-device section shows the torchrun command"
    return m.group(1)


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """docs/sim.md's command, as written: ``benchmarks/ddp_train.py`` (which knows nothing
    of perf) under ``torchrun --nproc-per-node 2`` on two simulated devices. The working
    directory is a scratch folder with ``benchmarks`` linked in, for the relative paths."""
    tmp = tmp_path_factory.mktemp("torchrun")
    (tmp / "benchmarks").symlink_to(ROOT / "benchmarks")
    # CPU-only (the launcher hides CUDA too): sim refuses a process with CUDA
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["bash", "-c", _documented_command()], cwd=tmp, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    wall_s = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    ranks = [json.loads((tmp / "losses" / f"rank{r}.json").read_text()) for r in (0, 1)]
    counts = [json.loads((tmp / "counts" / f"collectives-rank{r}.json").read_text())
              for r in (0, 1)]  # fmt: skip
    return {"stdout": proc.stdout, "ranks": ranks, "counts": counts, "wall_s": wall_s}


def test_an_unmodified_ddp_script_trains_on_two_sim_devices(torchrun: dict[str, Any]) -> None:
    ranks = torchrun["ranks"]
    assert [r["device"] for r in ranks] == ["sim:0", "sim:1"]
    assert {r["backend"] for r in ranks} == {"sim"}
    losses = ranks[0]["losses"]
    assert ranks[1]["losses"] == losses  # all-reduced: every rank sees the same numbers
    assert losses[-1] < losses[0], losses
    assert "epoch 1: loss" in torchrun["stdout"]
    print(f"torchrun wall time: {torchrun['wall_s']:.1f} s")


def test_the_script_s_all_reduces_are_counted_as_on_nccl(torchrun: dict[str, Any]) -> None:
    """One all-reduce per synced optimizer step (one bucket: every gradient, float32) and one
    per epoch (the script's loss); the ``no_sync()`` micro-batches send nothing; each DDP
    forward broadcasts the BatchNorm buffers; the constructor all-gathers once."""
    r = torchrun["ranks"][0]
    epochs, steps = len(r["losses"]), r["steps_per_epoch"]
    synced = epochs * (steps // 2)  # ACCUMULATE = 2 in benchmarks/ddp_train.py
    params = 16 * 32 + 32 + 2 * 32 + 32 * 32 + 32 + 32 + 1  # Linear, BatchNorm, Linear, Linear
    for c in torchrun["counts"]:
        assert c["calls"]["allreduce"] == synced + epochs, c
        assert c["bytes"]["allreduce"] == synced * params * 4 + epochs * 4, c
        assert c["calls"]["broadcast"] >= epochs * steps, c
        assert c["calls"]["allgather"] == 1, c


@pytest.mark.parametrize("argv", [
    ["/venv/bin/python", "/venv/bin/torchrun", "--nproc-per-node", "2", "t.py"],
    ["/usr/bin/python3", "-m", "torch.distributed.run", "t.py"],
])  # fmt: skip
def test_launcher_processes_do_not_install_sim(argv: list[str]) -> None:
    from perf.sim.device import is_launcher

    assert is_launcher(argv)
    assert not is_launcher([sys.executable, "benchmarks/ddp_train.py"])


def test_the_launcher_points_hugging_face_accelerate_at_sim_unless_told_otherwise() -> None:
    """accelerate (and transformers' ``TrainingArguments``) choose CUDA, MPS, XPU, ... or the
    CPU: a ``Trainer`` script under ``python -m perf sim`` trained on the CPU, silently. The
    launcher sets the device override both read; one the user set is kept."""
    from perf.sim.device import launch_env

    assert launch_env(2, {"PATH": "/bin"})["ACCELERATE_TORCH_DEVICE"] == "sim"
    kept = launch_env(1, {"ACCELERATE_TORCH_DEVICE": "cpu"})
    assert kept["ACCELERATE_TORCH_DEVICE"] == "cpu"
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_TORCH_DEVICE"}
    show = "import os; print(os.environ['ACCELERATE_TORCH_DEVICE'])"
    proc = subprocess.run(
        [sys.executable, "-m", "perf", "sim", "--", sys.executable, "-c", show],
        cwd=ROOT, env=dict(env, CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "sim", proc.stderr[-2000:]


@needs_sim
def test_storage_resize_frees_and_reallocates_as_fsdp2_does() -> None:
    """FSDP2's ``free_storage`` / ``alloc_storage``: ``untyped_storage().resize_(0)`` gives
    the block back and ``resize_(n)`` takes a new one, in the memory model as on CUDA; the
    tensor keeps its storage object, and writes after the re-allocation land in it."""
    allocated = torch.accelerator.memory_allocated
    t = torch.ones(1024, device=SIM)
    st = t.untyped_storage()
    before = allocated()
    st.resize_(0)
    assert st.size() == st.nbytes() == 0
    assert allocated() == before - 4096
    st.resize_(4096)
    assert t.untyped_storage() is st and st.size() == 4096 and allocated() == before
    t.fill_(3.0)
    assert t.sum().item() == 3072.0


def _fsdp2_command() -> str:
    text = (ROOT / "docs" / "sim.md").read_text(encoding="utf-8")
    m = re.search(r"```bash\n(python -m perf sim [^`]*?fsdp2_train\.py[^`]*)```", text)
    assert m, "docs/sim.md's FSDP2 paragraph shows the torchrun command"
    return m.group(1)


def test_fsdp2_trains_on_two_sim_devices_as_on_the_cpu(tmp_path: Path) -> None:
    """docs/sim.md's FSDP2 command as written, and the same script on the CPU over gloo: the
    same losses and parameters on each rank, shards on ``sim:rank``, and per step and unit
    two all-gathers of the rank's shard and one reduce-scatter of the padded gradients."""
    from perf.sim.device import unavailable_reason

    reason = unavailable_reason(allow_with_accelerator=True)
    if reason is not None:
        pytest.skip(f"needs the simulated device: {reason}")
    (tmp_path / "benchmarks").symlink_to(ROOT / "benchmarks")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    sim = subprocess.run(
        ["bash", "-c", _fsdp2_command()], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stdout[-2000:] + sim.stderr[-4000:]
    steps = int(re.search(r"--steps (\d+)", _fsdp2_command())[1])  # type: ignore[index]
    cpu = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "benchmarks/fsdp2_train.py", "--cpu", "--steps", str(steps), "--out", "cpu"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cpu.returncode == 0, cpu.stdout[-2000:] + cpu.stderr[-4000:]
    for r in (0, 1):
        on_sim = json.loads((tmp_path / "fsdp" / f"rank{r}.json").read_text())
        on_cpu = json.loads((tmp_path / "cpu" / f"rank{r}.json").read_text())
        assert (on_sim["device"], on_sim["shard_device"], on_sim["backend"]) == (
            f"sim:{r}", f"sim:{r}", "sim")  # fmt: skip
        assert on_sim["losses"] == on_cpu["losses"] and len(on_sim["losses"]) == steps
        assert on_sim["param_checksum"] == on_cpu["param_checksum"]
        assert on_sim["shard_shape"] == on_cpu["shard_shape"] == [32, 16]
    # each rank's shard: dim 0 of every parameter split in two, padded (fsdp2_train.make_model)
    shapes = [(64, 16), (64,), (64, 64), (64,), (1, 64), (1,)]
    shard_bytes = 4 * sum(-(-s[0] // 2) * (s[1] if len(s) > 1 else 1) for s in shapes)
    units = 3
    for r in (0, 1):
        c = json.loads((tmp_path / "counts" / f"collectives-rank{r}.json").read_text())
        assert c["calls"] == {"_allgather_base": 2 * units * steps,
                              "_reduce_scatter_base": units * steps}, c  # fmt: skip
        assert c["bytes"]["_allgather_base"] == 2 * steps * shard_bytes, c
        assert c["bytes"]["_reduce_scatter_base"] == steps * 2 * shard_bytes, c
