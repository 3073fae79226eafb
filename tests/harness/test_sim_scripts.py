"""The simulated-device scripts run as documented (on CPU: the simulated side only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from perf.sim.kernel_syncs import multinomial_asserts_async

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # CPU-only children: the simulated device refuses a process with CUDA (on a GPU runner)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env
    )


def test_parity_child_side_runs_cudas_kernel_choices():
    """The kernel-choice half of test_sim_parity.py's comparison with cuda:0, as its child runs
    it: the kernels derived from CUDA's SDPA choice (sdp_utils.cpp) and RMSNorm's fused one."""
    proc = _run("tests/benchmarks/test_sim_parity.py", "sim-paths")
    assert proc.returncode == 0, proc.stderr
    ops = json.loads(proc.stdout)
    kernels = {
        name: sorted(k for k in by_op if "attention" in k or "rms" in k or k == "bmm")
        for name, by_op in ops.items()
    }
    flash = ["_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward"]
    eff = [f"_scaled_dot_product_efficient_attention{s}" for s in ("", "_backward")]
    assert kernels == {
        "fp16_causal": flash,
        "bf16_grouped_query": flash,
        "fp32_causal": eff,
        "fp32_bool_mask_dropout": eff,
        "fp32_grouped_query": ["bmm"],  # memory-efficient needs equal heads: math
        "fp32_last_dim_strided": ["bmm"],  # both fused kernels need stride 1: math
        "bf16_value_head_dim_of_its_own": eff,  # flash needs one head dim
        "bf16_rms_norm": ["_fused_rms_norm", "_fused_rms_norm_backward"],
    }
    assert ops["fp32_bool_mask_dropout"]["where"] == 1  # the mask made additive


def test_parity_child_side_counts_the_derived_truth():
    """What test_sim_parity.py compares with cuda:0, as its child process runs it."""
    proc = _run("tests/benchmarks/test_sim_parity.py", "sim")
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout)
    assert counts["log_every_k"]["by_op"] == {"item": 4}  # 20 steps, every 5th
    assert counts["clip_adamw"]["syncs"] == 0
    assert counts["nanogpt_batches"]["pinned_h2d_copies"] == 5
    assert counts["loader_pageable"]["by_op"] == {"h2d_copy": 10}
    assert counts["loader_pinned_workers"]["syncs"] == 0
    assert counts["eval_per_batch_item"]["by_op"] == {"h2d_copy": 15, "item": 10}
    assert counts["amp_grad_scaler"]["by_op"] == {"item": 10}  # 8 scaler steps + 2 logs
    # each habit on its own (docs/sim.md, "Syncs, case by case", cites CUDA's count)
    habits = {k.removeprefix("habit_"): v["syncs"] for k, v in counts.items() if "habit_" in k}
    assert habits == {
        **dict.fromkeys(["float", "bool", "tolist", "cpu", "nonzero", "bool_mask_index"], 1),
        **dict.fromkeys(["masked_select", "unique", "equal_copy", "torch_tensor"], 1),
        **dict.fromkeys(["pageable_d2h", "index_setitem_scalar", "linalg_cholesky"], 1),
        **dict.fromkeys(["linalg_cholesky_ex_check_errors", "stream_synchronize"], 1),
        **dict.fromkeys(["repeat_interleave", "bincount", "histc"], 2),
        "multinomial": 0 if multinomial_asserts_async() else 2,  # _assert_async from 2.11 on
        "mask_setitem_tensor": 2,  # t[t > 0] reads its mask; index_put_ with a mask again
        "mask_index_backward": 2,  # the forward index and index_put_ in the backward
        "distribution_validation": 2,  # the constructor's and log_prob's bool() checks
        "ctc_loss_sum": 6,  # three copies in each of CTC's two CUDA kernels
        "ctc_loss_mean": 7,  # and the mean's copy of the lengths
        **dict.fromkeys(["repeat_interleave_output_size", "equal_alias", "histc_range"], 0),
        **dict.fromkeys(["pinned_non_blocking_d2h", "pageable_non_blocking_d2h"], 0),
        **dict.fromkeys(["to_cpu_non_blocking", "mask_setitem_scalar"], 0),
        **dict.fromkeys(["event_synchronize", "device_synchronize"], 0),
        "accelerator_synchronize": 0,
    }
    d2h = [k for k, v in counts.items() if "habit_" in k and v["d2h_copies"]]
    assert sorted(d2h) == [
        f"habit_{h}"
        for h in sorted(
            [
                "tolist",
                "cpu",
                "pinned_non_blocking_d2h",
                "pageable_non_blocking_d2h",
                "pageable_d2h",
                "to_cpu_non_blocking",
            ]
        )
    ]


def test_counter_overhead_on_sim_prints_its_table():
    proc = _run("benchmarks/counter_overhead.py", "--device", "sim", "--steps", "1", "--pairs", "8")
    assert proc.returncode == 0, proc.stderr
    rows = [
        ln for ln in proc.stdout.splitlines() if ln.startswith("| iris") or ln.startswith("| mlp")
    ]
    assert len(rows) == 10 and all("x | [" in r for r in rows), proc.stdout


def test_nanogpt_script_without_a_checkout_prints_its_usage():
    proc = _run("benchmarks/nanogpt_sim.py")
    assert proc.returncode == 2 and "nanoGPT" in proc.stdout


def test_vcpu_speed_trace_prints_a_letter_per_window_and_a_summary():
    proc = _run("benchmarks/vcpu_speed_trace.py", "--seconds", "0.5", "--window", "0.05")
    assert proc.returncode == 0, proc.stderr
    trace, summary = proc.stdout.splitlines()
    assert set(trace) <= {"F", "S"} and "F" in trace and 5 <= len(trace) <= 11
    assert f"slow windows {trace.count('S')}/{len(trace)}" in summary


FIELD_PROGRAM = """
import argparse, torch
p = argparse.ArgumentParser()
p.add_argument("--device", default="cpu")
p.add_argument("--steps", type=int, default=6)
a = p.parse_args()
dev = torch.device(a.device)
torch.manual_seed(0)
model = torch.nn.LSTM(8, 16, batch_first=True).to(dev)      # 4 parameters: 4 h2d copies
head = torch.nn.Linear(16, 4).to(dev)                         # 2 more
opt = torch.optim.AdamW([*model.parameters(), *head.parameters()])
data = torch.randn(a.steps, 2, 5, 8)
for step in range(a.steps):
    x = data[step].to(dev)                                    # 1 blocking h2d copy per step
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        out = head(model(x)[0])
    loss = out.float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step % 3 == 0:
        print(step, loss.item())                              # 1 sync every 3rd step
torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, "ckpt.pt")
ck = torch.load("ckpt.pt", map_location=dev)
model.load_state_dict(ck["model"])  # device to device: no transfer
"""


def test_field_script_runs_a_program_and_prints_its_counts(tmp_path):
    """benchmarks/field_sim.py runs an unmodified program from its checkout on sim.

    Derivation (as on cuda:0): 6 parameter copies + 6 batch copies = 12 blocking h2d copies;
    2 loss.item(); torch.save copies each device storage once to the host: the LSTM's 4
    parameters lie in one buffer after ``.to(dev)`` (cuDNN's ``flatten_parameters``), so 1,
    + 2 x 6 AdamW moments = 13 d2h copies (AdamW's step counters are host tensors);
    torch.load with map_location=dev copies every storage back (13 + 6 step counters = 19
    h2d)."""
    (tmp_path / "train.py").write_text(FIELD_PROGRAM)
    proc = _run("benchmarks/field_sim.py", str(tmp_path), "train.py", "--", "--device", "sim")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    r = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert r["ran"] and r["error"] is None
    assert r["by_op"] == {"h2d_copy": 12 + 19, "d2h_copy": 13, "item": 2}, r
    assert r["h2d_copies"] == 31 and r["d2h_copies"] == 13
    assert (tmp_path / "ckpt.pt").exists()


def test_field_script_reports_a_failure_with_its_place(tmp_path):
    (tmp_path / "bad.py").write_text(
        "import torch\nx = torch.ones(2, device='sim')\ny = x + torch.ones(2)\n"
    )
    proc = _run("benchmarks/field_sim.py", str(tmp_path), "bad.py")
    assert proc.returncode == 1
    r = json.loads(proc.stdout)
    assert not r["ran"] and r["error"]["type"] == "RuntimeError"
    assert "same device" in r["error"]["message"] and r["error"]["where"].endswith("bad.py:3")


def test_field_script_without_arguments_prints_its_usage():
    proc = _run("benchmarks/field_sim.py")
    assert proc.returncode == 2 and "CHECKOUT SCRIPT" in proc.stdout
