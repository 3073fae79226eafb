"""``count_ops``: kernel counting only for measured CUDA devices, each device index honoured.

The decision is a pure function of what torch reports, so it is tested here without a GPU;
the GPU side (profiler, synchronising each measured device) is exercised by
``tests/benchmarks/test_p6_launch_overhead.py`` on a CUDA box.
"""

from __future__ import annotations

import pytest
import torch

import perf
from perf.instruments.ops import kernel_devices


@pytest.mark.parametrize(
    ("dev", "expected"),
    [
        ("cuda:1", (1,)),
        (torch.device("cuda", 0), (0,)),
        ("cuda", (3,)),  # no index: the current CUDA device (3 in this fake)
        (["cuda:0", "cuda:1", "cuda:1"], (0, 1)),  # each index once, in order
        (["cpu", "cuda:2"], (2,)),  # only the CUDA ones
    ],
)
def test_kernel_devices_counts_the_measured_cuda_devices(dev, expected) -> None:
    assert kernel_devices(dev, None, cuda_available=True, current_cuda=3) == expected


@pytest.mark.parametrize("dev", [None, "cpu", torch.device("meta"), ["cpu", "meta"]])
def test_kernel_devices_no_profiler_without_a_cuda_device_even_on_a_gpu_box(dev) -> None:
    # A CPU-device test on a GPU box: no CUDA profiler, no meaningless 0.
    assert kernel_devices(dev, None, cuda_available=True) == ()


def test_kernel_devices_kernels_false_never_profiles() -> None:
    assert kernel_devices("cuda:0", False, cuda_available=True) == ()


def test_kernel_devices_kernels_true_without_cuda_device_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"needs a CUDA device.*device='cuda:N'"):
        kernel_devices("cpu", True, cuda_available=True)


def test_kernel_devices_cuda_device_on_a_box_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        kernel_devices("cuda:0", None, cuda_available=False)


def test_count_ops_cpu_device_counts_ops_and_no_kernels() -> None:
    x = torch.randn(8, 8)
    with perf.count_ops(device="cpu") as o:
        (x @ x).relu().sum()
    res = o.result()
    assert res.by_op == {"mm": 1, "relu": 1, "sum": 1}
    assert res.kernels is None and res.kernels_by_name == {} and res.host_launches is None


def test_count_ops_default_counts_no_kernels() -> None:
    with perf.count_ops() as o:
        torch.ones(3).add_(1)
    assert o.result().kernels is None and o.result().host_launches is None
    assert o.result().count == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a box without CUDA")
def test_count_ops_asking_for_cuda_kernels_without_cuda_raises_before_the_block() -> None:
    ran = []
    with pytest.raises(ValueError, match="CUDA is not available"), perf.count_ops("cuda:0"):
        ran.append(1)
    assert ran == []


def test_count_ops_of_cpu_work_never_initialises_cuda_on_a_gpu_box(tmp_path) -> None:
    """A GPU box rehearsed in a child (its first real CUDA call stops the process): counting
    CPU work, with no device or with cpu / meta, never asks for the current CUDA device, which
    initialises CUDA (a context on the GPU; the rehearsal stopped gpu.yml's harness step in a
    child project's `count_ops()`). A bare "cuda" does ask: the stop proves the probe sees it."""
    import os
    import subprocess
    import sys

    from perf.core import rehearse

    code = (
        "import torch, perf\n"
        "for dev in (None, 'cpu', ['cpu', 'meta']):\n"
        "    with perf.count_ops(dev) as o:\n"
        "        torch.ones(3).add(1).exp()\n"
        "    print(o.count, torch.cuda.is_available())\n"
        "try:\n"
        "    with perf.count_ops('cuda'):\n"
        "        pass\n"
        "except BaseException as e:\n"
        "    print(type(e).__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CUDA_"))}
    rehearse.activate(1, env)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["3 True"] * 3 + ["CudaRehearsalStop"], proc.stdout
