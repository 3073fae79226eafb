"""``perf.model_gpu_time`` on the simulated device: the op stream becomes the model's events,
with hand-derived figures to the nanosecond, determinism across runs and processes, and the
errors a user can act on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _sim import SIM, needs_sim

import perf
from perf.instruments.gpu_model import model_gpu_time
from perf.instruments.gpu_targets import get_target
from perf.store.metrics import check_json_value

H100 = get_target("H100 SXM")
HOST, MIN_K, EFF = H100.host_op_s, H100.min_kernel_s, H100.efficiency
NS = 1e-9
ROOT = Path(__file__).resolve().parents[2]


def test_the_public_name_and_its_errors() -> None:
    assert perf.model_gpu_time is model_gpu_time
    unknown = r"unknown GPU target 'H800'.*known targets: 'H100 SXM'"
    with pytest.raises(ValueError, match=unknown), model_gpu_time("cuda:0", target="H800"):
        pass
    cpu = r"model_gpu_time\('cpu'\).*perf.simulated_device\(\)"
    with pytest.raises(ValueError, match=cpu), model_gpu_time("cpu"):
        pass


@needs_sim
@pytest.mark.parametrize(
    ("dtype", "tf32", "peak", "eff"),
    [
        (torch.float32, False, H100.fp32_tflops, EFF.cuda_core),
        (torch.float32, True, H100.tf32_tflops, EFF.tensor_core),
        (torch.bfloat16, False, H100.bf16_tflops, EFF.tensor_core),
        (torch.float16, False, H100.fp16_tflops, EFF.tensor_core),
    ],
    ids=["fp32", "tf32", "bf16", "fp16"],
)
def test_one_matmul_on_sim_is_2mnk_over_the_peak(
    dtype: torch.dtype, tf32: bool, peak: float, eff: float
) -> None:
    n = 1024
    x = torch.ones(n, n, device=SIM, dtype=dtype)
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32" if tf32 else "ieee"
    try:
        with model_gpu_time(SIM) as t:
            x @ x
    finally:
        torch.backends.cuda.matmul.fp32_precision = before
    kernel_s = 2 * n**3 / (peak * 1e12 * eff)
    assert kernel_s > 3 * n * n * x.element_size() / (H100.memory_gbps * 1e9 * EFF.memory)
    r = t.result()
    assert abs(r.total_s - (HOST + kernel_s)) < NS
    assert r.launches == 1 and list(r.by_op) == ["mm"]
    (site,) = r.by_site.values()
    label = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    assert site.op == f"mm {label}"
    assert site.code == "x @ x"


@needs_sim
def test_a_grouped_mm_is_a_tensor_core_kernel_with_its_flops() -> None:
    """A mixture-of-experts layer's ``grouped_mm``: one kernel of 2 * M * K * N FLOPs at the
    tensor-core peak (torch's flop counter has no formula for it: it modelled 0 FLOPs). fp32
    with TF32 on: the CPU computes it in a moment, where bf16 takes minutes here."""
    m, k, n, groups = 4096, 1024, 1024, 2
    a = torch.ones(m, k, device=SIM)
    w = torch.ones(groups, k, n, device=SIM)
    offs = torch.tensor([m // 2, m], device=SIM, dtype=torch.int32)
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        with model_gpu_time(SIM) as t:
            torch._grouped_mm(a, w, offs=offs)
    finally:
        torch.backends.cuda.matmul.fp32_precision = before
    kernel_s = 2 * m * k * n / (H100.tf32_tflops * 1e12 * EFF.tensor_core)
    nbytes = 4 * (m * k + groups * k * n + m * n + groups)
    assert kernel_s > nbytes / (H100.memory_gbps * 1e9 * EFF.memory)  # compute-bound
    r = t.result()
    # off bf16 CUDA's fallback reads offs on the host: the host waits for the kernel
    assert r.launches == 1 and set(r.by_op) == {"_grouped_mm", "grouped_mm"}
    assert abs(r.total_s - (HOST + kernel_s)) < NS, (r.total_s, HOST + kernel_s)
    assert abs(r.sync_wait_s - kernel_s) < NS


@needs_sim
def test_a_chunked_linear_cross_entropy_is_modelled_on_tensor_cores_with_its_flops() -> None:
    """``F.linear_cross_entropy`` with ``options`` is one custom op to a dispatch mode, which
    torch's flop counter has no formula for: an LLM head's logits and precomputed gradients
    were modelled as memory traffic. Now 3 x 2NDV at the tensor-core peak (TF32 on, so the
    CPU computes it in a moment)."""
    pytest.importorskip("torch.nn.modules.linear_cross_entropy", reason="F.linear_cross_entropy")
    n, d, v = 1024, 512, 4096  # a kernel of 34.7 us: longer than the host's 25 us
    x = torch.ones(n, d, device=SIM, requires_grad=True)
    w = torch.ones(v, d, device=SIM, requires_grad=True)
    t = torch.zeros(n, dtype=torch.int64, device=SIM)
    opts = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=256)
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        with model_gpu_time(SIM) as m:
            torch.nn.functional.linear_cross_entropy(x, w, t, options=opts)
    finally:
        torch.backends.cuda.matmul.fp32_precision = before
    kernel_s = 3 * 2 * n * d * v / (H100.tf32_tflops * 1e12 * EFF.tensor_core)
    nbytes = 4 * (2 * n * d + 2 * v * d + v) + 8 * n  # x, w, their gradients, bias grad, t
    assert kernel_s > nbytes / (H100.memory_gbps * 1e9 * EFF.memory)  # compute-bound
    r = m.result()
    op = "_linear_cross_entropy_batch_chunked"
    assert abs(r.by_op[op] - kernel_s) < NS, (r.by_op, kernel_s)
    # the op is compute-bound; the block's two detaches cost the host 25 us each
    assert abs(r.components["compute"] - kernel_s) < NS, r.components
    assert abs(r.components["launch"] - 2 * H100.host_dispatch_s) < NS, r.components


@needs_sim
def test_fp32_convolutions_and_rnns_run_on_tf32_as_cudnn_does_by_default() -> None:
    """cuDNN's fp32 convolutions and RNNs use TF32 tensor cores by default
    (``torch.backends.cudnn.conv`` / ``.rnn`` ``fp32_precision == "tf32"``, as ``allow_tf32``
    always was for cuDNN), fp32 matmuls do not (``torch.backends.cuda.matmul``: ``"none"``).
    Each setting moves its own ops only."""
    conv = torch.nn.Conv2d(16, 16, 3).to(SIM)
    lstm = torch.nn.LSTM(32, 32).to(SIM)
    img, seq, mat = (torch.ones(2, 16, 8, 8, device=SIM), torch.ones(4, 2, 32, device=SIM),
                     torch.ones(32, 32, device=SIM))  # fmt: skip

    def peaks() -> dict[str, str]:
        with model_gpu_time(SIM) as t:
            conv(img)
            lstm(seq)
            mat @ mat
        return {e.name: e.peak for e in t.events if e.kind == "kernel" and e.flops}

    cudnn = torch.backends.cudnn
    assert str(cudnn.conv.fp32_precision) == str(cudnn.rnn.fp32_precision) == "tf32"
    assert peaks() == {"convolution": "tf32", "_cudnn_rnn": "tf32", "mm": "fp32"}
    before = cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision
    cudnn.conv.fp32_precision = cudnn.rnn.fp32_precision = "ieee"
    try:
        assert peaks() == {"convolution": "fp32", "_cudnn_rnn": "fp32", "mm": "fp32"}
    finally:
        cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision = before


@needs_sim
def test_a_chain_of_tiny_ops_on_sim_is_host_bound() -> None:
    z = torch.zeros(4, device=SIM)
    with model_gpu_time(SIM) as t:
        for _ in range(25):
            z = z + 1
        assert t.launches == 25  # live inside the block
    assert abs(t.total_s - (25 * HOST + MIN_K)) < NS
    assert t.bound == "launch" and t.sync_wait_s == 0.0


@needs_sim
def test_item_in_the_middle_drains_the_queue() -> None:
    n = 2048
    a = torch.ones(n, n, device=SIM)
    z = torch.zeros(4, device=SIM)
    d = 2 * n**3 / (H100.fp32_tflops * 1e12 * EFF.cuda_core)
    c = 4 / (H100.host_link_gbps * 1e9 * EFF.pageable)  # one fp32 to the host
    with model_gpu_time(SIM) as t:
        y = a @ a
        y[0, 0].item()
        z + 1
    r = t.result()
    # mm launched at HOST; the read's copy call at 2 HOST (the index is a view) waits for
    # the mm (until HOST + d), copies 4 bytes; then z + 1 launches (HOST) and runs MIN_K
    views = r.by_op["select"] / H100.host_dispatch_s
    assert views == 2  # two selects: host dispatch only
    issue = HOST + 2 * H100.host_dispatch_s + HOST
    assert abs(r.sync_wait_s - (HOST + d - issue)) < NS
    assert abs(r.total_s - (HOST + d + c + HOST + MIN_K)) < NS
    item_site = next(s for s in r.by_site.values() if s.code == "y[0, 0].item()")
    assert item_site.bound == "sync"


@needs_sim
def test_a_pinned_non_blocking_copy_hides_behind_compute_on_sim() -> None:
    n = 2048
    a = torch.ones(n, n, device=SIM)
    host = torch.ones(2**18).pin_memory()  # 1 MiB
    d = 2 * n**3 / (H100.fp32_tflops * 1e12 * EFF.cuda_core)
    with model_gpu_time(SIM) as t:
        a @ a
        g = host.to(SIM, non_blocking=True)
        g + 1
    copy = next(e for e in t.events if e.kind == "copy")
    assert copy.pinned and copy.non_blocking and copy.nbytes == 2**20
    assert abs(t.total_s - (HOST + d + MIN_K)) < NS and t.sync_wait_s == 0.0
    with model_gpu_time(SIM) as p:
        a @ a
        g = host.clone().to(SIM)  # clone: a pageable host tensor
        g + 1
    c = 2**20 / (H100.host_link_gbps * 1e9 * EFF.pageable)
    assert abs(p.total_s - (HOST + d + c + HOST + MIN_K)) < NS
    assert p.total_s > t.total_s


@needs_sim
def test_python_data_copied_to_the_device_models_as_a_pageable_copy() -> None:
    """``torch.tensor(data, device=dev)`` and an index from a list copy from pageable host
    memory below the dispatch modes: the model sees ``lift_fresh`` and models that copy."""
    data = [float(i) for i in range(2**18)]  # 1 MiB of float32
    with model_gpu_time(SIM) as direct:
        torch.tensor(data, device=SIM)
    with model_gpu_time(SIM) as via_host:
        torch.tensor(data).to(SIM)
    x = torch.zeros(2**17, device=SIM)
    with model_gpu_time(SIM) as index:
        x[list(range(2**17))]  # an int64 index: 1 MiB
    c = 2**20 / (H100.host_link_gbps * 1e9 * EFF.pageable)
    for t in (direct, via_host, index):
        [copy] = [e for e in t.events if e.kind == "copy"]
        assert (copy.nbytes, copy.direction, copy.pinned, copy.non_blocking) == (
            2**20,
            "h2d",
            False,
            False,
        )
        assert abs(t.transfer_s - c) < NS


_STEP = """
import json, torch, perf
from perf.instruments.gpu_model import model_gpu_time

def run():
    torch.manual_seed(0)
    d = perf.simulated_device()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    model.to(d)
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(128, 32), torch.randint(0, 4, (128,))
    with model_gpu_time(d, target="A100") as t:
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x.to(d)), y.to(d))
            loss.backward()
            opt.step()
            loss.item()
    r = t.result()
    return {"total_s": r.total_s, "by_op": r.by_op, "launches": r.launches,
            "sync_wait_s": r.sync_wait_s, "bound": r.bound}
"""


@needs_sim
def test_a_training_step_models_identically_across_runs_and_processes() -> None:
    scope: dict[str, object] = {}
    exec(compile(_STEP, "step.py", "exec"), scope)
    first, second = scope["run"](), scope["run"]()  # type: ignore[operator]
    assert first == second
    assert first["launches"] > 20 and first["bound"] == "launch"  # a tiny MLP: host-bound
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT)
    code = _STEP + "\nprint(json.dumps(run()))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == json.loads(json.dumps(first))


@needs_sim
def test_the_sites_survive_a_metric_and_more_work_models_slower() -> None:
    a = torch.ones(256, 256, device=SIM)
    with model_gpu_time(SIM) as one:
        a @ a
    with model_gpu_time(SIM) as two:
        a @ a
        a @ a
    check_json_value(one.sites, "sites")
    (info,) = one.sites.values()
    assert set(info) == {"modelled_s", "bound", "op", "launches", "function", "code"}
    assert two.total_s > one.total_s
    with (
        pytest.raises(RuntimeError, match="once the with-block has ended"),
        model_gpu_time(SIM) as t,
    ):
        t.result()


@needs_sim
def test_launches_and_flops_agree_with_count_ops_and_count_flops() -> None:
    """The model reads the op stream as the counters do: one launch per computing op (the
    launch model of ``count_ops`` on sim) and FLOPs by ``count_flops``'s formulas, on an MLP
    with Adam and a small CNN under autocast."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten())
    mlp.to(SIM), cnn.to(SIM)
    opt = torch.optim.Adam([*mlp.parameters(), *cnn.parameters()])
    x, img = torch.randn(8, 16).to(SIM), torch.randn(2, 3, 8, 8).to(SIM)

    def step() -> None:
        opt.zero_grad()
        with torch.autocast(SIM.type, dtype=torch.bfloat16):
            loss = mlp(x).sum() + cnn(img).float().sum()
        loss.backward()
        opt.step()

    step()
    with perf.count_ops(SIM) as ops, perf.count_flops() as flops, model_gpu_time(SIM) as t:
        step()
    assert t.launches == ops.host_launches and t.launches > 20
    kernels = [e for e in t.events if e.kind == "kernel"]
    assert sum(e.flops for e in kernels) == flops.total > 0
    assert {e.peak for e in kernels if e.name in ("mm", "addmm", "convolution")} == {"bf16"}


@needs_sim
def test_the_flops_cache_tells_shapes_and_scalars_apart() -> None:
    """FLOPs are cached by the shapes a formula sees: each addmm / mm still counts its own
    2mnk (addmm's formula is the slow one the cache is for)."""
    a, b = torch.ones(8, 16, device=SIM), torch.ones(16, 32, device=SIM)
    c = torch.ones(8, 32, device=SIM)
    wide, tall = torch.ones(8, 32, device=SIM), torch.ones(32, 32, device=SIM)
    with model_gpu_time(SIM) as t:
        torch.addmm(c, a, b)
        torch.addmm(c[:4], a[:4], b)
        torch.addmm(c, a, b, beta=0.5)
        a @ b
        a[:2] @ b
        torch.addmm(c, a, b)
        wide @ tall  # the output of a @ b, from twice the inner size
        torch.addmm(c, wide, tall)
    flops = [e.flops for e in t.events if e.kind == "kernel"]
    k = 16 * 32 * 2
    assert flops == [8 * k, 4 * k, 8 * k, 8 * k, 2 * k, 8 * k, 16 * k, 16 * k]


@needs_sim
def test_a_compiled_function_with_a_graph_break_models_like_eager() -> None:
    """The model's dispatch runs with TorchDynamo off (in C, not torch's per-op wrapper):
    compiled code with a graph break gives the ops of the eager run, nothing traced twice."""

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.sin() * 2
        torch._dynamo.graph_break()
        return (y.cos() + 1).sum()

    x = torch.randn(64, device=SIM)
    with model_gpu_time(SIM) as eager:
        f(x)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="eager")
    with model_gpu_time(SIM) as t:
        compiled(x)
        compiled(x)
    torch._dynamo.reset()
    assert [(e.kind, e.name) for e in t.events] == [(e.kind, e.name) for e in eager.events] * 2
    assert [e.name for e in eager.events] == ["sin", "mul", "cos", "add", "sum"]
