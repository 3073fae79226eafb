"""Several simulated devices (``sim:0`` ... ``sim:N-1``) with CUDA's semantics.

The device count is fixed when ``sim`` is installed, and this test process has one device, so
the N-device facts come from one CPU-only child (``PERF_SIM_DEVICES=3``) that prints them as
JSON; the one-device facts run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _sim import needs_sim

import perf

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, sys
import torch
import perf

facts = {}
def err(fn):
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None

dev = perf.simulated_device()
facts["initialized_before_a_tensor"] = torch.sim.is_initialized()
facts["returned"] = str(dev)
facts["count"] = [torch.accelerator.device_count(), torch.get_device_module("sim").device_count()]
a = torch.ones(4, device="sim:1")
facts["factory"] = str(a.device)
facts["op"] = str((a * 2 + 1).device)
facts["to_int"] = str(torch.ones(2).to(2).device)
facts["plain_sim_is_current"] = str(torch.ones(1, device="sim").device)
facts["initialized_after_a_tensor"] = torch.sim.is_initialized()
torch.sim.set_device(2)
facts["after_set_device"] = [torch.sim.current_device(), str(torch.ones(1, device="sim").device)]
facts["to_plain_sim"] = [str(torch.ones(1).to("sim").device),
                         str(torch.ones(1).to(device=torch.device("sim")).device),
                         str(torch.nn.Linear(1, 1).to("sim").weight.device),
                         str(torch.ones(1).to("sim:0").device)]
torch.accelerator.set_device_index(1)
facts["accelerator_index"] = [torch.accelerator.current_device_index(), torch.sim.current_device()]
with torch.accelerator.device_index(2):
    facts["inside_device_index"] = torch.sim.current_device()
with torch.sim.device(0):
    facts["inside_sim_device"] = str(torch.empty(1, device="sim").device)
facts["restored"] = torch.sim.current_device()
import threading
_barrier, _seen = threading.Barrier(2), {}
def _on_thread(i):
    start = torch.sim.current_device()
    with torch.cuda.device(i) if torch.cuda.is_available() else torch.sim.device(i):
        _barrier.wait()  # both threads have set theirs before either reads
        _seen[i] = [start, torch.sim.current_device(), str(torch.empty(1, device="sim").device)]
_threads = [threading.Thread(target=_on_thread, args=(i,)) for i in (0, 2)]
[t.start() for t in _threads]
[t.join() for t in _threads]
facts["threads"] = [_seen[0], _seen[2], torch.sim.current_device()]
torch.sim.set_device(0)
facts["bad_ordinal"] = err(lambda: torch.ones(1, device="sim:3"))
facts["bad_set_device"] = err(lambda: torch.sim.set_device(5))
facts["bad_accelerator_index"] = err(lambda: torch.accelerator.set_device_index(3))
facts["cross_device"] = err(lambda: a + torch.ones(4, device="sim:0"))

# training on sim:1: parameters, gradients and optimizer state stay there
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
model.to("sim:1")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = torch.randn(32, 8).to("sim:1"), torch.randint(0, 2, (32,)).to("sim:1")
losses = []
for _ in range(5):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
facts["train_devices"] = sorted({str(t.device) for p in model.parameters()
                                 for t in (p, p.grad, *opt.state[p].values()) if t.dim()})
facts["loss_fell"] = losses[-1] < losses[0]

# per-device allocator statistics
mod = torch.get_device_module("sim")
before = [mod.memory_allocated(i) for i in range(3)]
big = torch.empty(1 << 20, device="sim:2")
facts["alloc_delta"] = [mod.memory_allocated(i) - b for i, b in enumerate(before)]
facts["stats_device_2"] = mod.memory_stats("sim:2")["allocated_bytes.all.current"]
del big

# copies between devices are device-to-device transfers, not host ones
src = torch.ones(256, device="sim:0")
with perf.count_transfers() as t:
    moved = src.to("sim:1")
    back = torch.empty(256, device="sim:0")
    back.copy_(moved)
facts["transfers"] = [t.d2d_copies, t.d2d_bytes, t.h2d_copies, t.d2h_copies]
facts["moved"] = [str(moved.device), float(back.sum())]
with perf.count_syncs() as s:
    src.to("sim:2")
facts["d2d_syncs"] = s.count
# checkpoints keep the device (torch.save tags "sim:1"), and map_location moves them
import copy, io
buf = io.BytesIO()
torch.save(model.state_dict(), buf)
buf.seek(0)
loaded = torch.load(buf)
buf.seek(0)
mapped = torch.load(buf, map_location="sim:0")
facts["checkpoint"] = [str(loaded["0.weight"].device), str(mapped["0.weight"].device),
                       bool(torch.equal(loaded["0.weight"].cpu(), model[0].weight.cpu()))]
facts["deepcopy"] = str(copy.deepcopy(model)[0].weight.device)
# cuDNN's RNN dropout state is per device; torch.sim.manual_seed resets the current device's,
# manual_seed_all (and torch.manual_seed) every device's (CUDA's reset_rnn_state)
lstms = {i: torch.nn.LSTM(4, 4, num_layers=2, dropout=0.5).to(f"sim:{i}") for i in (0, 1)}
xs = {i: torch.randn(3, 1, 4).to(f"sim:{i}") for i in (0, 1)}
def state_syncs():
    out = []
    for i in (0, 1):
        with perf.count_syncs() as s:
            lstms[i](xs[i])
        out.append(s.count)
    return out
facts["rnn_reseed"] = [state_syncs(), state_syncs()]
torch.sim.set_device(1)
torch.sim.manual_seed(3)
facts["rnn_reseed"].append(state_syncs())
torch.sim.manual_seed_all(3)
facts["rnn_reseed"].append(state_syncs())
torch.manual_seed(3)
facts["rnn_reseed"].append(state_syncs())
torch.sim.set_device(0)
# sparse COO tensors on sim:2: their indices, values and results stay there
import warnings
warnings.simplefilter("ignore")
sp = torch.eye(4).to_sparse()
on2 = sp.to("sim:2")
prod = torch.mm(on2, torch.ones(4, 2, device="sim:2"))
facts["sparse"] = [str(on2.device), str(on2._values().device), str(prod.device),
                   float(prod.sum()), str((on2 * 2).coalesce().device),
                   str(torch.ones(3, 3, device="sim:2").to_sparse().device),
                   str(on2.to("sim:0")._indices().device),
                   err(lambda: torch.mm(on2, torch.ones(4, 2, device="sim:0")))]
def data_parallel_facts():
    # nn.DataParallel over the three devices (its primitives are CUDA-build C functions:
    # perf.sim.comm), one training step against the same model on one device
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    net.to("sim:0")
    single = copy.deepcopy(net)
    dp = torch.nn.DataParallel(net)
    xb, yb = torch.randn(12, 8).to("sim:0"), torch.randint(0, 2, (12,)).to("sim:0")
    with perf.count_transfers() as t, perf.count_syncs() as s:
        dp_loss = torch.nn.functional.cross_entropy(dp(xb), yb)
        dp_loss.backward()
    ref_loss = torch.nn.functional.cross_entropy(single(xb), yb)
    ref_loss.backward()
    facts["data_parallel"] = {
        "device_ids": dp.device_ids, "d2d": [t.d2d_copies, t.d2d_bytes],
        "host": [t.h2d_copies, t.d2h_copies], "syncs": s.count,
        "param_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
        "same": [bool(torch.allclose(dp_loss.cpu(), ref_loss.cpu()))] + [
            bool(torch.allclose(p.grad.cpu(), q.grad.cpu(), atol=1e-6))
            for p, q in zip(net.parameters(), single.parameters())],
        "grad_devices": sorted({str(p.grad.device) for p in net.parameters()}),
    }
    from torch.nn.parallel import comm
    v = torch.arange(6.0).to("sim:0")
    parts = comm.scatter(v, devices=[0, 1, 2])
    outs = [torch.empty(2, device=f"sim:{i}") for i in (1, 2)]
    facts["comm"] = {
        "scatter": [str(p.device) for p in parts] + [parts[0].data_ptr() == v.data_ptr()],
        "broadcast": [str(b.device) for b in comm.broadcast(v, devices=[0, 2])],
        "broadcast_not_first": err(lambda: comm.broadcast(v, devices=[1, 0])),
        "gather_host": [str(comm.gather(parts, destination="cpu").device),
                        comm.gather(parts, destination=1).tolist()],
        "out_forms": [comm.broadcast(v[:2], out=outs)[1].tolist(),
                      [o.tolist() for o in comm.scatter(v[2:], out=outs)],
                      comm.gather(outs, out=torch.empty(4, device="sim:0")).tolist()],
    }

for _name, _facts in (("data_parallel", data_parallel_facts),):
    try:
        _facts()
    except Exception as e:  # one feature's failure names itself; the other facts stand
        facts[_name] = {"error": f"{type(e).__name__}: {e}"}
print(json.dumps(facts))
"""


@pytest.fixture(scope="module")
def three_devices() -> dict[str, Any]:
    # CPU-only child: the simulated device refuses a process with CUDA (on a GPU runner)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PERF_SIM_DEVICES="3")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_environment_sets_the_device_count(three_devices: dict[str, Any]) -> None:
    assert three_devices["returned"] == "sim:0"
    assert three_devices["count"] == [3, 3]


def test_a_reseed_resets_the_rnn_dropout_state_of_the_devices_it_seeds(
    three_devices: dict[str, Any],
) -> None:
    """cuDNN's RNN dropout state (made with 1 sync) is per device and made again after its
    generator is reseeded: ``torch.sim.manual_seed`` seeds the current device (sim:1 here), as
    ``torch.cuda.manual_seed`` does; ``manual_seed_all`` and ``torch.manual_seed`` every one."""
    assert three_devices["rnn_reseed"] == [[1, 1], [0, 0], [0, 1], [1, 1], [1, 1]]


def test_placement_lands_on_the_named_device(three_devices: dict[str, Any]) -> None:
    """``"sim:1"``, ``.to(2)`` and op outputs keep the index; plain ``"sim"`` is the current
    device, as ``"cuda"`` is."""
    f = three_devices
    assert (f["factory"], f["op"], f["to_int"]) == ("sim:1", "sim:1", "sim:2")
    assert f["plain_sim_is_current"] == "sim:0"


def test_current_device_follows_set_device_and_contexts(three_devices: dict[str, Any]) -> None:
    """Factories and ``.to("sim")`` (a module's too) follow the current device, as with
    ``"cuda"`` (``Tensor.to`` once sent a bare ``"sim"`` to ``sim:0``: DTensor's
    ``distribute_tensor`` on rank 1 did); ``is_initialized()`` is CUDA's lazy state, False
    until the first tensor (DeviceMesh sets the device from ``LOCAL_RANK`` only then)."""
    f = three_devices
    assert f["after_set_device"] == [2, "sim:2"]
    assert f["to_plain_sim"] == ["sim:2", "sim:2", "sim:2", "sim:0"]
    assert (f["initialized_before_a_tensor"], f["initialized_after_a_tensor"]) == (False, True)
    assert f["accelerator_index"] == [1, 1]
    assert f["inside_device_index"] == 2
    assert f["inside_sim_device"] == "sim:0"
    assert f["restored"] == 1


def test_the_current_device_is_per_thread(three_devices: dict[str, Any]) -> None:
    """As CUDA's (one per host thread): two threads inside ``torch.sim.device(0)`` and
    ``(2)`` at once each see and allocate on their own, a new thread starts on device 0 while
    the program is on ``sim:1``, and the program's stays ``sim:1`` (``nn.DataParallel``'s
    replica threads do this)."""
    assert three_devices["threads"] == [[0, 0, "sim:0"], [0, 2, "sim:2"], 1]


def test_an_index_past_the_count_is_an_invalid_device_ordinal(
    three_devices: dict[str, Any],
) -> None:
    for key in ("bad_ordinal", "bad_set_device", "bad_accelerator_index"):
        assert "invalid device ordinal" in three_devices[key], three_devices[key]
        assert "simulated device" in three_devices[key]


def test_a_cross_device_op_fails_like_cuda(three_devices: dict[str, Any]) -> None:
    msg = three_devices["cross_device"]
    assert msg.startswith("RuntimeError: Expected all tensors to be on the same device"), msg
    assert "sim:1 and sim:0" in msg


def test_training_on_device_1_keeps_everything_there(three_devices: dict[str, Any]) -> None:
    assert three_devices["train_devices"] == ["sim:1"]
    assert three_devices["loss_fell"]


def test_each_device_has_its_own_allocator_statistics(three_devices: dict[str, Any]) -> None:
    assert three_devices["alloc_delta"] == [0, 0, 4 << 20]
    assert three_devices["stats_device_2"] >= 4 << 20


def test_copies_between_devices_are_device_to_device_transfers(
    three_devices: dict[str, Any],
) -> None:
    """Two copies of 1 KiB each between sim devices; no host copy, and no sync (CUDA's peer
    copy is ``cudaMemcpyAsync`` on the stream)."""
    assert three_devices["transfers"] == [2, 2048, 0, 0]
    assert three_devices["moved"] == ["sim:1", 256.0]
    assert three_devices["d2d_syncs"] == 0


def test_checkpoints_and_copies_keep_the_device(three_devices: dict[str, Any]) -> None:
    assert three_devices["checkpoint"] == ["sim:1", "sim:0", True]
    assert three_devices["deepcopy"] == "sim:1"


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_device_count_in_the_environment_says_what_to_set(value: str) -> None:
    from perf.sim.ordinals import count_from_env

    with pytest.raises(ValueError, match="PERF_SIM_DEVICES"):
        count_from_env({"PERF_SIM_DEVICES": value})
    assert count_from_env({}) == 1 and count_from_env({"PERF_SIM_DEVICES": "4"}) == 4


@needs_sim
def test_one_device_by_default_and_the_count_cannot_change_later() -> None:
    dev = perf.simulated_device()
    assert torch.accelerator.device_count() == 1
    assert perf.simulated_device(count=1) == dev
    with pytest.raises(perf.SimulatedDeviceError, match="count=2 cannot change"):
        perf.simulated_device(count=2)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.ones(1, device="sim:1")


def test_sparse_tensors_stay_on_their_device(three_devices: dict[str, Any]) -> None:
    *placed, mixed = three_devices["sparse"]
    assert placed == ["sim:2", "sim:2", "sim:2", 8.0, "sim:2", "sim:2", "sim:0"]
    assert mixed.startswith("RuntimeError: Expected all tensors to be on the same device")


def test_data_parallel_trains_over_the_devices_moving_what_cuda_moves(
    three_devices: dict[str, Any],
) -> None:
    """``nn.DataParallel`` needs ``torch._C._scatter`` and its kin, which only CUDA builds have
    (it failed on ``sim``). One step over ``sim:0``-``sim:2``: the loss and gradients of the
    same model on one device, and the device-to-device copies of ``comm.cpp``: the parameters
    broadcast to the 2 other devices (one coalesced bucket each), the batch's two other
    thirds scattered (4 x 8 floats each), their outputs gathered (4 x 2 each), the output
    gradient scattered back, and each replica's gradients reduced onto ``sim:0``; no host copy,
    no sync."""
    f = three_devices["data_parallel"]
    assert "error" not in f, f["error"]
    assert f["device_ids"] == [0, 1, 2]
    assert all(f["same"]) and f["grad_devices"] == ["sim:0"], f
    param = f["param_bytes"]
    scatter, gather = 2 * 4 * 8 * 4, 2 * 4 * 2 * 4
    assert f["d2d"] == [10, 2 * param + scatter + gather + gather + 2 * param], f
    assert f["host"] == [0, 0] and f["syncs"] == 0, f


def test_the_comm_primitives_keep_cudas_semantics(three_devices: dict[str, Any]) -> None:
    """``torch.nn.parallel.comm`` on ``sim``: a scatter's own-device chunk is a view, a
    broadcast's source device must come first and keeps the tensor, a gather goes to a device
    or to the host, and the ``out=`` forms fill their outputs (``comm.cpp``)."""
    assert "error" not in three_devices["data_parallel"], three_devices["data_parallel"]
    f = three_devices["comm"]
    assert f["scatter"] == ["sim:0", "sim:1", "sim:2", True]
    assert f["broadcast"] == ["sim:0", "sim:2"]
    assert "must appear as the first on devices list" in f["broadcast_not_first"]
    assert f["gather_host"] == ["cpu", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]]
    assert f["out_forms"] == [[0.0, 1.0], [[2.0, 3.0], [4.0, 5.0]], [2.0, 3.0, 4.0, 5.0]]


@needs_sim
def test_the_device_module_answers_what_device_agnostic_code_asks() -> None:
    """``torch.get_device_module(dev)``: torchtitan's memory monitor failed at start on ``sim``
    (no ``get_device_properties``). The properties are those of the GPU whose code paths
    ``sim`` takes (sm90), with the memory the allocator model reports; an index past the
    devices is CUDA's error. No ``get_rng_state``: sim draws from the CPU generator, and
    DTensor's RNG tracker reads any device module's state as Philox's 16 bytes."""
    dev = perf.simulated_device()
    mod = torch.get_device_module(dev)
    props = mod.get_device_properties(0)
    assert (props.major, props.minor, props.multi_processor_count) == (9, 0, 132)
    assert props.total_memory == mod.mem_get_info()[1] == 80 * (1 << 30)
    assert mod.get_device_capability() == (9, 0) and mod.get_arch_list() == ["sm_90"]
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        mod.get_device_properties(1)
    assert not hasattr(mod, "get_rng_state") and not hasattr(mod, "set_rng_state")
    x = torch.ones(1024, device=dev)
    assert mod.max_memory_allocated() >= 4096
    del x
    mod.reset_max_memory_allocated()
    assert mod.max_memory_allocated() == mod.memory_allocated()
    assert mod.get_allocator_backend() == "native"
    stream = mod.default_stream()
    with mod.StreamContext(stream) as s:
        mod.set_stream(s)
    mod.init()
    mod.ipc_collect()
