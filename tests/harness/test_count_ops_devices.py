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
