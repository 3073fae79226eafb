"""Kernels vs host launches (``perf.instruments.launches``): the profiler-event classification
is a pure function, tested here with constructed event lists shaped like ``torch.profiler``'s
``FunctionEvent`` (name, correlation ``id``, ``device_index``, ``activity_type`` /
``device_type``); the model on ``sim`` and the CPU's None run for real.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _sim import needs_sim
from torch.autograd import DeviceType

import perf
from perf.instruments.launches import api_name, classify_profiler_events

PID = 4242  # runtime / driver records carry the process id as their device (kineto)


def _api(name: str, corr: int, activity: str | None = "cuda_runtime") -> SimpleNamespace:
    return SimpleNamespace(
        name=name, id=corr, device_index=PID, activity_type=activity, device_type=DeviceType.CPU
    )


def _dev(name: str, corr: int, device: int, activity: str | None = "kernel") -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        id=corr,
        device_index=device,
        activity_type=activity,
        device_type=DeviceType.CUDA,
    )


def _cpu_op(name: str, corr: int) -> SimpleNamespace:
    return SimpleNamespace(
        name=name, id=corr, device_index=PID, activity_type="cpu_op", device_type=DeviceType.CPU
    )


def test_each_launch_api_is_one_launch_and_its_kernel_one_kernel() -> None:
    events = [
        _cpu_op("aten::mm", 1),
        _api("cudaLaunchKernel", 11),
        _dev("gemm", 11, 0),
        _api("cudaLaunchKernelExC", 12),
        _dev("flash_fwd", 12, 0),
        _api("cuLaunchKernel", 13, "cuda_driver"),
        _dev("triton_poi", 13, 0),
        _api("cuLaunchKernelEx", 14, "cuda_driver"),
        _dev("triton_red", 14, 0),
    ]
    r = classify_profiler_events(events, [0])
    assert r.host_launches == 4 and r.kernels == 4
    assert r.launches_by_api == {
        "cuLaunchKernel": 1,
        "cuLaunchKernelEx": 1,
        "cudaLaunchKernel": 1,
        "cudaLaunchKernelExC": 1,
    }
    assert r.unattributed_launches == 0


def test_graph_replay_is_one_launch_of_many_kernels() -> None:
    # CUPTI gives every kernel node of a replayed graph the cudaGraphLaunch's correlation id
    events = [_api("cudaGraphLaunch", 50)] + [_dev(f"k{i}", 50, 0) for i in range(37)]
    r = classify_profiler_events(events, [0])
    assert (r.host_launches, r.kernels) == (1, 37)
    assert r.launches_by_api == {"cudaGraphLaunch": 1}


def test_memcpy_and_memset_calls_are_not_launches_nor_kernels() -> None:
    events = [
        _api("cudaMemcpyAsync", 21),
        _dev("Memcpy HtoD (Pageable -> Device)", 21, 0, "gpu_memcpy"),
        _api("cudaMemsetAsync", 22),
        _dev("Memset (Device)", 22, 0, "gpu_memset"),
        _api("cudaStreamSynchronize", 23),
        _api("cudaGetDevice", 24),
        _dev("gpu annotation", 25, 0, "gpu_user_annotation"),
    ]
    r = classify_profiler_events(events, [0])
    assert (r.host_launches, r.kernels, r.unattributed_launches) == (0, 0, 0)


def test_device_index_filter_attributes_launches_through_the_correlation_id() -> None:
    events = [
        _api("cudaLaunchKernel", 1),
        _dev("a", 1, 0),
        _api("cudaLaunchKernel", 2),
        _dev("b", 2, 1),
        _api("cudaLaunchKernel", 3),
        _dev("c", 3, 1),
    ]
    assert classify_profiler_events(events, [1]).host_launches == 2
    assert classify_profiler_events(events, [1]).kernels_by_name == {"b": 1, "c": 1}
    assert classify_profiler_events(events, [0]).host_launches == 1
    both = classify_profiler_events(events, [0, 1])
    assert (both.host_launches, both.kernels) == (3, 3)
    # a launch on another device is that device's, never "unattributed"
    assert classify_profiler_events(events, [0]).unattributed_launches == 0


def test_launch_without_any_device_record_is_counted_apart() -> None:
    events = [_api("cudaLaunchKernel", 1), _dev("a", 1, 0), _api("cudaLaunchKernel", 2)]
    r = classify_profiler_events(events, [0])
    assert (r.host_launches, r.unattributed_launches) == (1, 1)


def test_runtime_and_driver_record_of_one_call_are_one_launch() -> None:
    events = [
        _api("cudaLaunchKernel", 7),
        _api("cuLaunchKernel", 7, "cuda_driver"),
        _dev("k", 7, 0),
    ]
    assert classify_profiler_events(events, [0]).host_launches == 1


def test_cupti_name_suffixes_are_stripped() -> None:
    assert api_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert api_name("cudaLaunchKernel_ptsz") == "cudaLaunchKernel"
    assert api_name("cudaGraphLaunch_ptsz_v10000") == "cudaGraphLaunch"
    assert api_name("cuLaunchKernelEx") == "cuLaunchKernelEx"
    events = [_api("cudaLaunchKernelExC_v11060", 3), _dev("k", 3, 0)]
    assert classify_profiler_events(events, [0]).launches_by_api == {"cudaLaunchKernelExC": 1}


def test_events_without_activity_type_fall_back_to_device_type() -> None:
    """torch builds before the ``activity_type`` field: device records are DeviceType.CUDA."""
    events = [
        _api("cudaLaunchKernel", 1, None),
        _dev("k", 1, 0, None),
        _api("cudaMemcpyAsync", 2, None),
        _dev("Memcpy DtoH", 2, 0, None),
    ]
    r = classify_profiler_events(events, [0])
    assert (r.host_launches, r.kernels, r.kernels_by_name) == (1, 1, {"k": 1})


def test_on_cpu_launch_fields_are_none() -> None:
    x = torch.randn(8, 8)
    with perf.count_ops("cpu") as o:
        (x @ x).relu()
    r = o.result()
    assert r.count == 2 and r.kernels is None and r.host_launches is None


@pytest.fixture
def sim() -> torch.device:
    from perf.sim.device import unavailable_reason

    why = unavailable_reason()
    if why:
        pytest.skip(f"the simulated device is unavailable here: {why}")
    return perf.simulated_device()


@needs_sim
def test_on_sim_one_launch_per_computing_op_none_for_views_allocations_memcpys(sim) -> None:
    x = torch.randn(4, 4)
    with perf.count_ops(sim) as o:
        y = x.to(sim)  # host -> device: a memcpy
        z = (y @ y).relu()  # two kernels
        z.t()  # a view
        z.clone()  # same dtype, contiguous: a device-to-device memcpy
        z.half()  # a dtype cast: a kernel
        torch.empty(3, device=sim)  # an allocation
        torch.ones(3, device=sim)  # a fill kernel
        z.sum().item()  # a reduction kernel, then a device-to-host memcpy
    r = o.result()
    assert r.launches_by_name == {"mm": 1, "relu": 1, "_to_copy": 1, "ones": 1, "sum": 1}
    assert r.host_launches == 5 and r.kernels is None
    assert r.count == 10  # every dispatched op, launching or not


@needs_sim
def test_on_sim_views_by_schema_or_by_nature_launch_nothing(sim) -> None:
    a, w = torch.randn(2, 3, 4, device=sim), torch.randn(4, 5, device=sim)
    with perf.count_ops(sim) as o:
        a @ w  # view + mm + _unsafe_view: one kernel
        a.permute(2, 0, 1).contiguous()  # a strided copy: a kernel
        a.split(1)
    r = o.result()
    assert r.launches_by_name == {"mm": 1, "clone": 1}, r.by_op


@needs_sim
def test_on_sim_kernels_false_models_nothing(sim) -> None:
    with perf.count_ops(sim, kernels=False) as o:
        torch.ones(3, device=sim).add_(1)
    assert o.result().host_launches is None and o.result().count == 2


def test_count_ops_refuses_to_nest_a_cuda_profiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nested torch.profiler sessions fail: counting CUDA kernels inside a running profiler
    raises before the block (faked CUDA: the check precedes any CUDA call)."""
    import perf.instruments.ops as ops

    monkeypatch.setattr(ops, "kernel_devices", lambda *a, **k: (0,))
    monkeypatch.setattr(torch.autograd, "_profiler_enabled", lambda: True)
    ran = []
    with pytest.raises(RuntimeError, match="nested profilers fail"), perf.count_ops("cuda:0"):
        ran.append(1)
    assert ran == []


@needs_sim
def test_the_per_op_helpers_agree_with_the_general_forms(sim) -> None:
    """The counting modes' argument walk and device test (``flat_tensors``, ``device_test``)
    give what torch's pytree and ``t.device.type == device_type`` give, on the argument shapes
    aten ops take: nested lists, ``None`` in a ``Tensor?[]``, keyword tensors, sizes."""
    from torch.utils._pytree import tree_leaves

    from perf.instruments.modes import device_test, flat_tensors

    a, b = torch.ones(2, device=sim), torch.ones(3)
    meta = torch.ones(1, device="meta")
    args = (a, [b, None, a], (meta, [a]), torch.Size([2, 3]), 1.5, {"out": b, "n": 2})
    walked = flat_tensors(args, [])
    assert [id(t) for t in walked] == [
        id(t) for t in tree_leaves(args) if isinstance(t, torch.Tensor)
    ]
    for kind in (sim.type, "cpu", "meta", "cuda"):
        on = device_test(kind)
        assert [on(t) for t in walked] == [t.device.type == kind for t in walked], kind
