"""The simulated accelerator: a device of its own type with CUDA's semantics where they change
counts, and the CPU's arithmetic (so results equal a CPU run bit for bit)."""

from __future__ import annotations

import copy

import pytest
import torch
from _sim import SIM, needs_sim
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import perf
from perf.sim import device as simulated

pytestmark = needs_sim


def test_sim_is_a_device_of_its_own_type():
    x = torch.randn(3, device=SIM)
    assert torch.device("sim", 0) == SIM and x.device == SIM
    assert x.device.type not in ("cpu", "meta", "cuda")
    assert type(x) is torch.Tensor and not x.is_cpu
    assert x.to(SIM) is x  # same device: nothing happens
    assert perf.simulated_device() is SIM  # installed once


def _train(device: torch.device, steps: int = 4) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 5),
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    X = torch.randn(8, 3, 6, 6).to(device)
    y = torch.randint(0, 5, (8,)).to(device)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(X), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return [p.detach().cpu() for p in model.parameters()]


_BIT_FOR_BIT = """
import torch
import perf
from tests.harness.test_simulated import SIM, _train

pairs = list(zip(_train(SIM), _train(torch.device("cpu")), strict=True))
assert all(torch.equal(a, b) for a, b in pairs), [(a - b).abs().max() for a, b in pairs]
"""


def test_training_on_sim_equals_training_on_cpu_bit_for_bit():
    """In a fresh process on one thread. Why: the sim device's backward runs on autograd's
    device thread, created at the first backward on sim with the intra-op thread count of that
    moment; in a process where an earlier test made it with 2 threads, its reductions split
    differently from the CPU's one-thread backward (seen as last-bit differences whenever a
    sim training test ran first in the same pytest worker)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root), str(root / "tests" / "harness")])  # `_sim` too
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, "-c", _BIT_FOR_BIT],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_parameters_stay_plain_and_optimizers_default_to_foreach_as_on_cuda():
    from torch.optim.optimizer import _default_to_fused_or_foreach

    model = torch.nn.Linear(4, 3).to(SIM)
    assert all(type(p) is torch.nn.Parameter and p.device == SIM for p in model.parameters())
    assert _default_to_fused_or_foreach(list(model.parameters()), False, False) == (False, True)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4, device=SIM)).sum().backward()
    with perf.count_ops(kernels=False) as o:
        opt.step()
    assert any(k.startswith("_foreach_") for k in o.by_op), o.by_op
    assert opt.state[model.weight]["step"].device.type == "cpu"  # as foreach Adam on CUDA


def test_views_in_place_out_and_resize_share_data_like_a_device():
    a = torch.zeros(4, 4, device=SIM)
    a[1].add_(1)  # a view written in place
    a.t()[0].fill_(5)  # a transposed view
    assert a.sum().item() == 4 * 5 + 3
    t = a.t()
    assert t.stride() == (1, 4) and not t.is_contiguous() and t.contiguous().is_contiguous()
    out = torch.empty(0, device=SIM)
    res = torch.add(torch.ones(3, device=SIM), 1, out=out)
    assert res is out and out.tolist() == [2.0, 2.0, 2.0]
    r = torch.ones(2, device=SIM)
    r.resize_(5)
    assert r.shape == (5,)
    assert (torch.arange(10, device=SIM) % 3).tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    m = copy.deepcopy(torch.nn.Linear(2, 2).to(SIM))
    assert m.weight.device == SIM


def _views(x: torch.Tensor, c: torch.Tensor) -> list[torch.Tensor]:
    """Each view op that reaches the device's kernel (perf.sim.kernels.META_VIEWS), from a
    real float tensor ``x`` and a complex one ``c``."""
    return [
        x.as_strided((3, 2), (1, 4), 2),
        x.view(4, 6),
        torch.ops.aten._reshape_alias.default(x, [6, 4], [4, 1]),
        x.unfold(1, 2, 1),
        torch.view_as_real(c),
        torch.view_as_complex(x.view(24, 1).expand(24, 2).contiguous()[:4]),
        x.t(),  # composite: as_strided below it
        x[1:, 2],
    ]


def test_views_run_on_the_device_share_its_storage_and_allocate_nothing():
    """A view on sim is its base's sim storage with new sizes, strides and offset (as a CUDA
    view shares its base's storage), equal to the CPU's view, writable through, and the
    allocator model sees no allocation for it."""
    from perf.sim import memory as simmem
    from perf.sim.kernels import META_VIEWS

    torch.manual_seed(0)
    x_cpu, c_cpu = torch.randn(6, 4), torch.randn(3, dtype=torch.complex64)
    x, c = x_cpu.to(SIM), c_cpu.to(SIM)
    stats = simmem.allocator().stats
    allocations = stats["allocation"][0].allocated
    for i, (v, v_cpu) in enumerate(zip(_views(x, c), _views(x_cpu, c_cpu), strict=True)):
        assert v.device == SIM and v._is_view(), i
        if i != 5:  # view_as_complex views a contiguous copy, not x
            base = c if i == 4 else x
            assert v.untyped_storage()._cdata == base.untyped_storage()._cdata, i
        assert (v.shape, v.stride(), v.storage_offset()) == (
            v_cpu.shape, v_cpu.stride(), v_cpu.storage_offset()
        ), i  # fmt: skip
        assert torch.equal(v.cpu(), v_cpu), i
    # allocator() again: with the C++ path (PERF_SIM_NATIVE=1) the model catches up when read
    stats = simmem.allocator().stats
    assert stats["allocation"][0].allocated == allocations + 1  # the contiguous copy only
    x.view(24)[5] = 7.0  # written through a view, read through the base
    assert x[1, 1].item() == 7.0
    assert len(META_VIEWS) == 6

    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device=SIM) + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.nn.Linear(3, 2)(torch.ones(1, 3, device=SIM))
    # Host scalars (0-dim) beside device tensors are fine on CUDA, and so here.
    assert (torch.ones(2, device=SIM) * torch.tensor(3.0)).tolist() == [3.0, 3.0]
    with pytest.raises(TypeError, match="sim"):
        torch.ones(2, device=SIM).numpy()  # as on CUDA: .cpu() first


def test_pin_memory_marks_host_tensors_pinned():
    x = torch.randn(4)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned() and p[1:].is_pinned() and torch.equal(p, x)
    assert p.pin_memory() is p
    assert not torch.randn(2, device=SIM).is_pinned()
    assert p.to(SIM, non_blocking=True).device == SIM


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_pin_memory_yields_pinned_batches(workers):
    ds = TensorDataset(torch.randn(20, 3), torch.randint(0, 2, (20,)))
    loader = DataLoader(ds, batch_size=5, shuffle=True, pin_memory=True, num_workers=workers)
    batches = list(loader)
    assert len(batches) == 4
    assert all(xb.is_pinned() and yb.is_pinned() for xb, yb in batches)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_on_sim_casts_as_cuda_does(dtype):
    lin = torch.nn.Linear(8, 4).to(SIM)
    ln = torch.nn.LayerNorm(4).to(SIM)
    x = torch.randn(2, 8, device=SIM)
    with torch.autocast(SIM.type, dtype=dtype):
        y = lin(x)  # lower-precision list
        assert y.dtype == dtype
        assert torch.softmax(y, -1).dtype == torch.float32  # fp32 with dtype set
        assert ln(y).dtype == torch.float32  # fp32 list
        assert y.sum().dtype == torch.float32
        assert torch.addcmul(torch.ones(2, 4, device=SIM), y, y).dtype == torch.float32  # promote
        assert torch.addcmul(y, y, y).dtype == dtype
        assert (y * 2).dtype == dtype  # not listed: runs in the input's type
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(torch.sigmoid(y.float()), torch.rand(2, 4, device=SIM))
    assert lin(x).dtype == torch.float32  # outside the region


def test_grad_scaler_works_and_reads_found_inf_once_per_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2).to(SIM)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(SIM.type)
    x = torch.randn(4, 8, device=SIM)
    with perf.count_syncs() as s:
        for _ in range(3):
            opt.zero_grad()
            with torch.autocast(SIM.type, dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    assert s.by_op == {"item": 3}, s.by_op
    assert scaler.get_scale() == 65536.0


def test_simulated_device_refusals_say_why(monkeypatch):
    monkeypatch.setattr(simulated, "_device", None)
    monkeypatch.setattr(simulated, "_requirements_missing", lambda: "torch._C._acc.nothing")
    with pytest.raises(simulated.SimulatedDeviceError, match=r"needs torch._C._acc.nothing"):
        simulated.simulated_device()
    assert "lacks torch._C._acc.nothing" in str(simulated.unavailable_reason())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(simulated.SimulatedDeviceError, match="this process has CUDA"):
        simulated.simulated_device()


def test_module_to_sim_keeps_parameter_objects_and_tied_weights():
    """As module.to("cuda"): an optimizer made before the move keeps working, ties survive."""
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied, as nanoGPT's wte / lm_head
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    w = emb.weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with perf.count_transfers() as t:
        model.to(SIM)
    assert emb.weight is w and head.weight is w and w.device == SIM
    assert t.h2d_copies == 1  # the tied weight moves once
    head(emb(torch.tensor([1, 2], device=SIM))).sum().backward()
    opt.step()
    assert opt.param_groups[0]["params"][0] is w


def test_cuda_only_kernels_fail_with_a_clear_error():
    # the fused LSTM cell that non-CPU devices get now has a kernel on sim
    # (tests/harness/test_sim_cuda_ops.py); a CUDA-only op without one names itself
    x = torch.ones(4, 4, device=SIM)
    with pytest.raises(NotImplementedError, match="simulated device runs every op with its CPU"):
        torch._cslt_compress(x)


def test_peak_memory_has_allocator_figures_on_sim():
    # the allocator model answers (exact figures: tests/harness/test_memory_sim.py): the
    # 400-byte tensor and its sum each take a 512-byte block above the start level
    with perf.peak_memory(SIM) as m:
        torch.ones(100, device=SIM).sum()
    r = m.result()
    assert r.peak_delta_bytes == 1024 and r.end_bytes == r.start_bytes


def test_moves_that_do_not_involve_sim_keep_torch_defaults():
    import weakref

    assert not torch.__future__.get_swap_module_params_on_conversion()
    m = torch.nn.Linear(2, 2)
    ref = weakref.ref(m.weight)  # a weakref makes swapping fail: set_data must be used here
    m.double()
    m.to(torch.float32)
    assert ref() is m.weight and m.weight.dtype == torch.float32
    m.to(SIM)  # weakly referenced: PyTorch's default for PrivateUse1, a new Parameter
    assert m.weight.device == SIM and ref() is not m.weight
    n = torch.nn.Linear(2, 2)
    w = n.weight
    n.to(SIM).cpu()  # there and back: the same Parameter object
    assert n.weight is w and w.device.type == "cpu"


def test_installed_after_the_first_backward_is_a_clear_error():
    """autograd fixes its device queues at the first backward of a process: installing the
    simulated device later used to fail deep in torch (INTERNAL ASSERT) at the first sim
    backward; now the installation itself says why and what to do."""
    import subprocess
    import sys

    code = (
        "import torch, perf\n"
        "x = torch.ones(1, requires_grad=True); (x * 2).sum().backward()\n"
        "try:\n"
        "    perf.simulated_device()\n"
        "except perf.sim.device.SimulatedDeviceError as e:\n"
        "    print('REFUSED', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "REFUSED the simulated device was installed after" in out.stdout, out.stderr
    assert "before any backward" in out.stdout


def test_plugin_installs_sim_before_any_test_runs_backward(pytester):
    """`pytest tests/benchmarks` ran cpu tests (backward) before the first sim test."""
    pytester.makepyfile(
        """
        import torch

        def test_a_cpu_backward_first():
            x = torch.ones(2, requires_grad=True)
            (x * 3).sum().backward()

        def test_then_sim(device):
            x = torch.ones(2, device=device, requires_grad=True)
            (x * 3).sum().backward()
            assert x.grad.tolist() == [3.0, 3.0]
        """
    )
    r = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=3)  # the cpu test, and test_then_sim on cpu and on sim


_ENDS_RIGHT_AFTER_BACKWARD = """
import sys
import torch, perf
sim = perf.simulated_device()
model = torch.nn.Linear(8, 1).to(sim)
x = torch.randn(4, 8, device=sim)
for _ in range(3):
    model(x).pow(2).mean().backward()
# the main thread keeps the GIL from the last backward to the interpreter's shutdown, while
# autograd's device thread still has the step's tensors to release
sys.setswitchinterval(100)
model(x).pow(2).mean().backward()
"""


def test_a_program_that_ends_right_after_a_sim_backward_exits_cleanly():
    """Autograd's device thread releases the step's tensors after ``backward()`` returns, and
    on sim that takes the GIL; a program that ended first aborted in the interpreter's shutdown
    ("terminate called without an active exception", -6): this script 12 runs in 12, and about
    1 in 20 without its ``setswitchinterval``. The exit waits for that thread now."""
    import subprocess
    import sys

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _ENDS_RIGHT_AFTER_BACKWARD],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err


def test_autograd_thread_states_are_read_from_proc(tmp_path):
    def task(tid: int, comm: str, state: str, ns: int) -> None:
        d = tmp_path / str(tid)
        d.mkdir()
        (d / "comm").write_text(comm + "\n")
        (d / "stat").write_text(f"{tid} ({comm}) {state} 1 1 1 0 -1 4194304\n")
        (d / "schedstat").write_text(f"{ns} 0 3\n")

    task(10, "python", "R", 5)
    task(11, "pt_autograd_0", "S", 700)
    task(12, "a (weird) name", "R", 9)  # ')' in a name: the state is after the last one
    assert simulated._autograd_threads_state(str(tmp_path)) == (("S", 700),)
    assert simulated._autograd_threads_state(str(tmp_path / "absent")) is None
