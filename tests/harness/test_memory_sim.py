"""CUDA's memory figures on ``sim``: exact numbers derived by hand from the allocator's rules.

Each expected figure is written as the sum it comes from. Rules used (CUDACachingAllocator.cpp):
sizes round up to 512 B; <= 1 MiB: small pool, 2 MiB segments; < 10 MiB: 20 MiB segments;
>= 10 MiB: rounded to 2 MiB; a large block splits only if more than 1 MiB remains; cuBLAS's
workspace (32 MiB on an H100) is allocated at the first matmul and kept.
"""

from __future__ import annotations

import gc

import pytest
import torch
from _sim import needs_sim

import perf
from perf.sim import memory as simmem

KiB, MiB = 1 << 10, 1 << 20
WS = 32 * MiB  # cuBLAS workspace, sm90 default


@pytest.fixture
def sim():
    d = perf.simulated_device()
    gc.collect()
    # a fresh allocator, as a new process starts (sim tensors other tests keep are not counted)
    simmem.reset(forget_live=True)
    return d


def figures():
    a = torch.accelerator
    return a.memory_allocated(), a.max_memory_allocated(), a.memory_reserved()


@needs_sim
def test_tensors_across_pool_and_split_thresholds(sim):
    a = torch.empty(250, device=sim)  # 1000 B -> 1024, new 2 MiB small segment
    assert figures() == (1024, 1024, 2 * MiB)
    b = torch.empty(MiB, dtype=torch.uint8, device=sim)  # 1 MiB: small, same segment
    assert figures() == (1024 + MiB, 1024 + MiB, 2 * MiB)
    c = torch.empty(3 * MiB // 4, device=sim)  # 3 MiB: large, 20 MiB segment, split
    assert figures() == (1024 + 4 * MiB, 1024 + 4 * MiB, 22 * MiB)
    # 17.5 MiB does not fit the 17 MiB rest of c's segment; >= 10 MiB: an 18 MiB segment
    # (2 MiB rounding); 512 KiB would remain, not more than 1 MiB: unsplit, so all 18 MiB
    # count as allocated
    d = torch.empty(17 * MiB + 512 * KiB, dtype=torch.uint8, device=sim)
    assert figures() == (1024 + 22 * MiB, 1024 + 22 * MiB, 40 * MiB)
    e = torch.empty(11 * MiB, dtype=torch.uint8, device=sim)  # fits the 17 MiB rest: split
    assert figures() == (1024 + 33 * MiB, 1024 + 33 * MiB, 40 * MiB)
    del d, e
    assert figures() == (1024 + 4 * MiB, 1024 + 33 * MiB, 40 * MiB)
    torch.accelerator.empty_cache()  # d's segment is free as a whole: released
    assert figures() == (1024 + 4 * MiB, 1024 + 33 * MiB, 22 * MiB)
    del c
    torch.accelerator.empty_cache()
    assert figures() == (1024 + MiB, 1024 + 33 * MiB, 2 * MiB)
    v = a.view(10, 25)  # a view allocates nothing
    del a
    assert figures()[0] == 1024 + MiB
    del v, b
    torch.accelerator.reset_peak_memory_stats()
    torch.accelerator.empty_cache()
    assert figures() == (0, 0, 0)


@needs_sim
def test_device_module_and_memory_stats_answer_like_cuda(sim):
    mod = torch.get_device_module("sim")
    x = torch.ones(3 * MiB // 4, device=sim)
    st = mod.memory_stats()
    assert st["allocated_bytes.large_pool.current"] == 3 * MiB
    assert st["inactive_split_bytes.large_pool.current"] == 17 * MiB
    assert st["segment.all.current"] == 1 and st["allocation.all.allocated"] == 1
    assert torch.accelerator.memory_stats() == st
    assert mod.memory_allocated(sim) == mod.memory_allocated(0) == 3 * MiB
    assert mod.max_memory_reserved() == 20 * MiB
    y = x * 2  # a temporary of the same size reuses the rest of the segment
    del y
    assert mod.memory_stats()["allocation.all.allocated"] == 2
    assert mod.memory_reserved() == 20 * MiB
    del x
    mod.empty_cache()
    assert mod.memory_reserved() == 0
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        mod.memory_allocated(1)


@needs_sim
def test_resize_in_place_is_a_new_block(sim):
    x = torch.empty(100, device=sim)  # 400 B -> 512
    x.resize_(1000)  # 4000 B -> 4096: CUDA allocates the new block, frees the old
    assert figures()[:2] == (4096, 4096 + 512)


@needs_sim
def test_peak_memory_on_sim(sim):
    keep = torch.empty(MiB // 4, device=sim)  # 1 MiB, small pool
    with perf.peak_memory(sim) as m:
        t = torch.empty(MiB, device=sim)  # 4 MiB: large pool, new 20 MiB segment
        del t
    r = m
    assert (r.start_bytes, r.peak_bytes, r.end_bytes) == (MiB, 5 * MiB, MiB)
    assert r.peak_delta_bytes == 4 * MiB
    assert r.reserved_peak_bytes == 22 * MiB
    del keep


def _adam_setup(sim):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(1024, 1024, device=sim))  # 4 MiB: large pool
    x = torch.randn(64, 1024, device=sim)  # 256 KiB: small pool
    return w, x, torch.optim.Adam([w], lr=1e-3)  # foreach Adam, as on CUDA


@needs_sim
def test_adam_step_figures(sim):
    w, x, opt = _adam_setup(sim)
    assert figures() == (4 * MiB + 256 * KiB, 4 * MiB + 256 * KiB, 22 * MiB)
    base = 4 * MiB + 256 * KiB
    torch.accelerator.reset_peak_memory_stats()
    opt.zero_grad()
    y = x @ w.t()  # 256 KiB; then the 32 MiB cuBLAS workspace: a 32 MiB segment, unsplit
    loss = y.pow(2).mean()  # pow: 256 KiB (freed after mean), mean: 512 B
    assert figures() == (base + 256 * KiB + 512 + WS, base + 512 * KiB + 512 + WS, 54 * MiB)
    fwd = base + 256 * KiB + 512 + WS
    loss.backward()
    # peak: the root grad (ones, 512 B, held by backward()'s frame) + the grad of y
    # (256 KiB) + the 4 MiB weight grad from mm; it is stolen as .grad (layout matches)
    assert figures() == (fwd + 4 * MiB, fwd + 512 + 256 * KiB + 4 * MiB, 54 * MiB)
    opt.step()
    # exp_avg and exp_avg_sq (4 MiB each) split the 20 MiB segment behind w and its grad;
    # _foreach_sqrt's 4 MiB temporary fills its last 4 MiB exactly: no new segment
    after = fwd + 4 * MiB + 8 * MiB
    assert figures() == (after, after + 4 * MiB, 54 * MiB)
    del y, loss
    assert figures()[0] == base + 12 * MiB + WS


@needs_sim
def test_adam_step_under_autocast_figures(sim):
    w, x, opt = _adam_setup(sim)
    opt.step()  # no grads yet: nothing happens
    base = 4 * MiB + 256 * KiB
    with torch.autocast("sim", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(x, w)
        # x -> bf16 (128 KiB, saved by mm), w -> bf16 (2 MiB, large pool: splits w's
        # segment), mm out (128 KiB), workspace; the cast of w stays in the cache
        inside = base + 128 * KiB + 2 * MiB + 128 * KiB + WS
        assert figures()[0] == inside
        loss = y.float().pow(2).mean()  # float: 256 KiB; pow: 256 KiB, freed; mean 512 B
        assert figures()[0] == inside + 256 * KiB + 512
    # leaving the region drops the cache: w's bf16 copy was not saved for backward
    # (x needs no grad, so mm did not save it)
    assert figures()[0] == inside + 256 * KiB + 512 - 2 * MiB
    loss.backward()
    # y (bf16) and x's cast stay referenced (y by this frame, x_bf16 by nothing after
    # backward frees the graph: -128 KiB); the fp32 pow input is freed (-256 KiB); the
    # weight grad: mm gives bf16 (2 MiB, freed), ToCopyBackward casts it to fp32 (4 MiB)
    assert figures()[0] == inside + 512 - 2 * MiB - 128 * KiB + 4 * MiB
    opt.step()
    assert figures()[0] == inside + 512 - 2 * MiB - 128 * KiB + 12 * MiB
    del y, loss


@needs_sim
def test_lt_workspace_for_addmm_with_bias(sim):
    lin = torch.nn.Linear(64, 64).to(sim)  # 16 KiB weight, 512 B bias
    x = torch.randn(8, 64, device=sim)  # 2 KiB
    lin(x)  # addmm with a bias vector: cuBLAS (32 MiB) and cuBLASLt (1 MiB, small pool)
    assert figures()[0] == 16 * KiB + 512 + 2 * KiB + WS + MiB


@needs_sim
@pytest.mark.parametrize("out", [False, True])
def test_a_matmul_with_out_dtype_takes_the_cublas_workspace_as_mm_does(sim, out):
    """``mm(a, b, out_dtype=...)`` (``F.linear_cross_entropy``'s CUDA branch) runs through
    ``addmm_out_cuda_impl`` on CUDA, on the same cuBLAS handle as ``mm``."""
    a = torch.ones(8, 8, dtype=torch.bfloat16, device=sim)  # 128 B: a 512 B block
    buf = torch.empty(8, 8, device=sim) if out else None  # 256 B: 512
    if out:
        torch.mm(a, a, out_dtype=torch.float32, out=buf)
        assert figures()[0] == 512 + 512 + WS
    else:
        y = torch.mm(a, a, out_dtype=torch.float32)
        assert y.dtype == torch.float32 and figures()[0] == 512 + 512 + WS
        del y


@needs_sim
def test_configure_refuses_live_tensors(sim):
    keep = torch.empty(10, device=sim)
    with pytest.raises(RuntimeError, match="sim tensors are alive"):
        simmem.configure(simmem.MemoryModelConfig())
    del keep


def test_workspace_size_follows_the_architecture_and_env(monkeypatch):
    assert simmem.MemoryModelConfig.for_arch(9, 0).cublas_workspace_bytes == 32 * MiB
    assert simmem.MemoryModelConfig.for_arch(8, 0).cublas_workspace_bytes == 8519680
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert simmem.MemoryModelConfig.for_arch(8, 0).cublas_workspace_bytes == 32 * MiB
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "4096")
    assert simmem.MemoryModelConfig.for_arch(9, 0).cublaslt_workspace_bytes == 4 * MiB


@needs_sim
def test_an_a100_config_gives_its_workspace(sim):
    simmem.configure(simmem.MemoryModelConfig.for_arch(8, 0))
    try:
        a = torch.ones(2, 2, device=sim)
        a @ a  # 8519680 B < 10 MiB: a 20 MiB segment, split
        assert figures() == (512 + 8519680, 512 + 8519680 + 512, 2 * MiB + 20 * MiB)
    finally:
        del a
        gc.collect()
        simmem.configure(simmem.MemoryModelConfig())


@needs_sim
def test_accelerator_reset_and_reserved_peak(sim):
    acc = torch.accelerator
    x = torch.empty(3 * MiB, dtype=torch.uint8, device=sim)  # a 20 MiB segment
    del x
    acc.empty_cache()
    assert (acc.max_memory_reserved(), acc.memory_reserved()) == (20 * MiB, 0)
    acc.reset_peak_memory_stats()
    assert acc.max_memory_reserved() == 0 and acc.max_memory_allocated() == 0
    assert acc.memory_stats()["allocation.all.allocated"] == 1
    acc.reset_accumulated_memory_stats()
    st = acc.memory_stats()
    assert st["allocation.all.allocated"] == st["num_device_alloc"] == 0
    free, total = torch.get_device_module("sim").mem_get_info()
    assert free == total == 80 * (1 << 30)  # no capacity set: an 80 GiB H100 is reported


@needs_sim
def test_tracking_off_and_on(sim):
    simmem.set_tracking(False)
    try:
        x = torch.empty(1000, device=sim)
        assert figures()[0] == 0  # not seen by the model
    finally:
        simmem.set_tracking(True)
    y = torch.empty(1000, device=sim)
    assert figures()[0] == 4096
    del x, y
