"""P3: automatic mixed precision cuts activation memory (and, on tensor cores, time).

Counted on any device: the bytes autograd saves for backward under autocast versus fp32
(bf16 on the CPU; fp16 and bf16 on CUDA). Autocast's casts of the weights are saved too; they
are reported apart (``param_copy_bytes``) so they neither hide nor inflate the activation saving.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import perf
from perf.workloads import mlp

MAX_AMP_FRACTION = 0.55  # 16-bit activations are half of 32-bit; a little room for fp32 islands


def _amp_dtypes(device: torch.device) -> list[torch.dtype]:
    if device.type == "cuda":
        out = [torch.float16]
        if torch.cuda.is_bf16_supported():
            out.append(torch.bfloat16)
        return out
    return [torch.bfloat16]


def _saved(model, x, y, dtype: torch.dtype | None):
    with perf.saved_activations(model) as saved:
        if dtype is None:
            loss = F.cross_entropy(model(x), y)
        else:
            with torch.autocast(device_type=x.device.type, dtype=dtype):
                loss = F.cross_entropy(model(x), y)
    loss.backward()  # outside autocast, as it belongs
    return saved.result()


def test_amp_activation_bytes_at_most_55_percent_of_fp32(device, perf_metrics):
    torch.manual_seed(0)
    model = mlp(512, 1024, 3, 10).to(device)
    x = torch.randn(128, 512, device=device)
    y = torch.randint(0, 10, (128,), device=device)
    fp32 = _saved(model, x, y, None)
    perf_metrics.record("fp32_activation_bytes", fp32.bytes, "bytes")
    assert fp32.bytes > 0 and fp32.param_copy_bytes == 0
    for dtype in _amp_dtypes(device):
        amp = _saved(model, x, y, dtype)
        name = str(dtype).removeprefix("torch.")
        perf_metrics.record(f"{name}_activation_bytes", amp.bytes, "bytes")
        perf_metrics.record(f"{name}_weight_copy_bytes", amp.param_copy_bytes, "bytes")
        perf_metrics.record(f"{name}_fraction_of_fp32", amp.bytes / fp32.bytes, "ratio")
        assert amp.bytes <= MAX_AMP_FRACTION * fp32.bytes, (name, amp, fp32)
        # The weights were cast and saved: counted, but not as activations.
        assert amp.param_copy_bytes > 0


def test_amp_no_grad_saves_no_activations(device, perf_metrics):
    torch.manual_seed(0)
    model = mlp(512, 1024, 3, 10).to(device)
    x = torch.randn(128, 512, device=device)
    amp = torch.autocast(device_type=device.type, dtype=_amp_dtypes(device)[0])
    with perf.saved_activations(model) as saved, torch.no_grad(), amp:
        model(x)
    perf_metrics.record("saved_bytes", saved.bytes + saved.param_copy_bytes, "bytes")
    assert saved.saved_refs == 0 and saved.bytes == 0


def _cuda_train_step(model, opt, x, y, dtype: torch.dtype | None, scaler):
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        if dtype is None:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return
        with torch.autocast(device_type="cuda", dtype=dtype):
            loss = F.cross_entropy(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    return step


@pytest.mark.perf_cuda
def test_amp_peak_allocated_memory_lower(device, perf_metrics):
    torch.manual_seed(0)
    model = mlp(2048, 4096, 4, 1000).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(1024, 2048, device=device)
    y = torch.randint(0, 1000, (1024,), device=device)
    scaler = torch.amp.GradScaler("cuda")
    peaks = {}
    for name, dtype, sc in (("fp32", None, None), ("fp16", torch.float16, scaler)):
        step = _cuda_train_step(model, opt, x, y, dtype, sc)
        step()
        with perf.peak_memory(device) as pm:
            step()
        peaks[name] = pm.peak_delta_bytes
        perf_metrics.record(f"{name}_peak_delta_bytes", pm.peak_delta_bytes, "bytes")
    assert peaks["fp16"] < peaks["fp32"], peaks


@pytest.mark.perf_cuda
@pytest.mark.perf_timing
def test_amp_speedup_on_tensor_cores(device, perf_metrics):
    cap = torch.cuda.get_device_capability(device)
    if cap < (7, 0):
        pytest.skip(f"needs CUDA tensor cores (capability >= 7.0); this GPU has {cap}")
    torch.manual_seed(0)
    model = mlp(4096, 4096, 4, 1000).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(2048, 4096, device=device)
    y = torch.randint(0, 1000, (2048,), device=device)
    fp32 = _cuda_train_step(model, opt, x, y, None, None)
    fp16 = _cuda_train_step(model, opt, x, y, torch.float16, torch.amp.GradScaler("cuda"))
    cmp = perf.compare(fp32, fp16, device=device, pairs=11, labels=("fp32", "fp16_amp"))
    perf_metrics.record("fp32_over_amp_time", cmp, higher_is_better=True)
    assert cmp.a_slower(1.2), str(cmp)
