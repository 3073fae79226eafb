"""Kernels and launches: what the device ran, and what the host issued to make it run.

Why two numbers: launch overhead is paid by the host, once per launch API call, while the
device may run many kernels per call. A CUDA graph replay is the extreme case: one
``cudaGraphLaunch`` runs every kernel captured in the graph. A count of executed kernels
cannot show that a graph saves launches; a count of launch calls can.

On CUDA both come from the profiler (:func:`classify_profiler_events`, a pure function of the
profiler's event list, so it is tested with constructed events on a CPU-only box):

- **kernels**: device activity of kind ``kernel`` (CUPTI's concurrent-kernel records;
  ``torch.profiler`` gives them ``device_type == DeviceType.CUDA``), on the measured device
  indices. Memcpy / memset records and GPU user annotations are not kernels.
- **host launches**: CUDA runtime / driver API records (``activity_type`` ``cuda_runtime`` /
  ``cuda_driver``) whose name is a launch API (:data:`LAUNCH_APIS`): ``cudaLaunchKernel``,
  ``cudaLaunchKernelExC``, ``cuLaunchKernel``, ``cuLaunchKernelEx``, the cooperative variants
  and ``cudaGraphLaunch`` / ``cuGraphLaunch`` (one launch per replay). ``cudaMemcpyAsync``,
  ``cudaMemsetAsync`` and other runtime calls are not launches.

Device filtering: the runtime record of a launch carries the *process id* as its device
(kineto's ``RuntimeActivity::deviceId()`` returns ``processId()``), so a launch is attributed
to a device through its CUPTI correlation id, which it shares with the kernels it launched
(kineto ``CuptiActivity.h``: both records return ``activity_.correlationId``; torch's
``collection.cpp`` ``resultFromActivity`` keeps it as the event's correlation id, which
``profiler.py`` ``_parse_kineto_results`` makes ``FunctionEvent.id``). A launch whose
correlation id matches no device record at all (CUPTI dropped the kernel record, or a graph
with no kernel node) is counted apart as *unattributed*, never silently added or lost. A
runtime and a driver record with the same correlation id are one launch.

On ``sim`` there is no profiler: :func:`sim_op_launches` is the model (one launch per
dispatched op that computes on the device; views, allocations and copies that CUDA does with
``cudaMemcpyAsync`` launch nothing). On the CPU there are no launches: ``None``.

Sources: kineto ``libkineto/include/ActivityType.h`` (activity type names),
``libkineto/src/CuptiActivity.h`` (runtime / driver records), ``libkineto/src/cupti_strings.cpp``
(API names, ``_vNNNN`` suffix stripped since 2026-05; older builds named them the same without
it), ``libkineto/src/CuptiCbidRegistry.cpp`` (the launch callbacks kineto correlates);
torch ``torch/csrc/profiler/kineto_shim.cpp`` (``ProfilerActivity.CUDA`` collects
``CUDA_RUNTIME`` and ``CUDA_DRIVER``; ``deviceTypeFromActivity``); ATen
``native/cuda/Copy.cu`` (``copy_device_to_device``: same dtype and contiguous is a memcpy).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from perf.instruments.modes import device_test, flat_tensors

#: Launch APIs (names as the profiler reports them, suffixes stripped by :func:`api_name`).
LAUNCH_APIS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchCooperativeKernel",
        "cudaLaunchCooperativeKernelMultiDevice",
        "cudaGraphLaunch",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuGraphLaunch",
    }
)
GRAPH_LAUNCH_APIS = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})

#: kineto activity types (``ActivityType.h``) of host API records and device records.
HOST_API_ACTIVITIES = frozenset({"cuda_runtime", "cuda_driver"})
DEVICE_ACTIVITIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

# `cudaLaunchKernel_v7000` (CUPTI's raw name), `cudaLaunchKernel_ptsz` (per-thread stream)
_SUFFIX = re.compile(r"(_v\d{4,})$")
_STREAM_SUFFIX = re.compile(r"_(ptsz|ptds)$")


def api_name(name: str) -> str:
    """``cudaLaunchKernel_ptsz_v7000`` -> ``cudaLaunchKernel``: one name per launch API."""
    return _STREAM_SUFFIX.sub("", _SUFFIX.sub("", name))


@dataclass(frozen=True)
class LaunchCount:
    """Kernels run on the measured CUDA devices and the launch calls that ran them."""

    kernels: int
    kernels_by_name: dict[str, int] = field(default_factory=dict)
    host_launches: int = 0
    launches_by_api: dict[str, int] = field(default_factory=dict)
    #: launch calls matching no device record on any device (see the module docstring)
    unattributed_launches: int = 0


def _activity(ev: Any) -> str | None:
    """kineto's activity type of a ``FunctionEvent`` (None on a torch without the field)."""
    return getattr(ev, "activity_type", None)


def _is_cuda_device_record(ev: Any) -> bool:
    act = _activity(ev)
    if act is not None:
        return act in DEVICE_ACTIVITIES
    from torch.autograd import DeviceType

    return getattr(ev, "device_type", None) == DeviceType.CUDA


def _is_kernel(ev: Any) -> bool:
    act = _activity(ev)
    if act is not None:
        return act == "kernel"
    return _is_cuda_device_record(ev) and not str(ev.name).startswith(("Memcpy", "Memset"))


def _is_host_api(ev: Any) -> bool:
    act = _activity(ev)
    if act is not None:
        return act in HOST_API_ACTIVITIES
    from torch.autograd import DeviceType

    return getattr(ev, "device_type", None) == DeviceType.CPU


def classify_profiler_events(events: Iterable[Any], devices: Sequence[int]) -> LaunchCount:
    """Kernels and host launches on CUDA ``devices`` from ``torch.profiler``'s events.

    Each event needs ``name``, ``id`` (correlation id), ``device_index`` and either
    ``activity_type`` (torch >= 2.5) or ``device_type``. Rules: module docstring.
    """
    wanted = set(devices)
    evs = list(events)
    kernels: Counter[str] = Counter()
    on_measured: set[int] = set()
    on_any: set[int] = set()
    for ev in evs:
        if not _is_cuda_device_record(ev):
            continue
        on_any.add(ev.id)
        if ev.device_index in wanted:
            on_measured.add(ev.id)
            if _is_kernel(ev):
                kernels[str(ev.name)] += 1
    launches: Counter[str] = Counter()
    seen: set[int] = set()
    unattributed = 0
    for ev in evs:
        if not _is_host_api(ev):
            continue
        api = api_name(str(ev.name))
        if api not in LAUNCH_APIS or ev.id in seen:
            continue
        seen.add(ev.id)
        if ev.id in on_measured:
            launches[api] += 1
        elif ev.id not in on_any:
            unattributed += 1
    return LaunchCount(
        kernels=sum(kernels.values()),
        kernels_by_name=dict(kernels.most_common()),
        host_launches=sum(launches.values()),
        launches_by_api=dict(sorted(launches.items())),
        unattributed_launches=unattributed,
    )


# --------------------------------------------------------------------------------------------
# the model on sim

#: Ops that launch no kernel on CUDA: allocation, metadata, profiler markers, host reads (a
#: ``_local_scalar_dense`` on a device tensor is a device-to-host ``cudaMemcpyAsync``).
NO_LAUNCH_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "resize_",
        "set_",
        "lift_fresh",
        "lift_fresh_copy",
        "detach",
        "alias",
        "_unsafe_view",  # a view in all but schema (matmul's reshape of its result)
        "_local_scalar_dense",
        "is_nonzero",
        "_record_function_enter_new",
        "_record_function_exit",
        "record_stream",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "device",  # prim::device, which tracing issues (FlexAttention's graphs, in eager code)
    }
)
#: Copies: a memcpy (no launch) between host and device, and on the device when source and
#: destination have one dtype and both are contiguous (``Copy.cu`` ``copy_device_to_device``).
COPY_OPS = frozenset({"copy_", "_to_copy", "clone", "_copy_from", "_copy_from_and_resize"})


def _copy_is_memcpy(name: str, ins: list[Any], outs: list[Any], on: Any) -> bool:
    # copy_(dst, src) names the destination first; _to_copy / clone(src) return it
    if name == "copy_":
        if len(ins) < 2:
            return True
        dst, src = ins[0], ins[1]
    else:
        if not ins or not outs:
            return True
        src, dst = ins[0], outs[0]
    if not (on(src) and on(dst)):
        return True  # host <-> device: cudaMemcpyAsync
    return bool(src.dtype == dst.dtype and src.is_contiguous() and dst.is_contiguous())


def sim_op_launches(
    name: str, is_view: bool, args: Any, kwargs: Any, out: Any, device_type: str
) -> bool:
    """Whether one dispatched op launches a kernel on ``device_type`` in the model of CUDA.

    An op launches when it touches a tensor on the device (an input, a ``device=`` factory
    argument, or an output) and computes: views (``OpOverload.is_view``), :data:`NO_LAUNCH_OPS`
    and memcpy copies (:data:`COPY_OPS`) launch nothing. The model counts one launch per op;
    CUDA may launch more (a two-pass reduction, a foreach op over more tensors than one
    multi-tensor-apply chunk, cuBLAS split-K), so it is a lower bound that ranks fused /
    foreach / for-loop code as CUDA does, not CUDA's exact figure.
    """
    if is_view or name in NO_LAUNCH_OPS:
        return False
    ins = flat_tensors(args, [])
    if kwargs:
        flat_tensors(kwargs, ins)
    outs = flat_tensors(out, [])
    dev_kw = (kwargs or {}).get("device")
    on = device_test(device_type)
    on_device = (
        any(map(on, ins))
        or any(map(on, outs))
        or (
            dev_kw is not None and getattr(dev_kw, "type", str(dev_kw).split(":")[0]) == device_type
        )
    )
    if not on_device:
        return False
    if name in COPY_OPS:
        return not _copy_is_memcpy(name, ins, outs, on)
    return True
