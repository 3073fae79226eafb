"""The GPUs the time model knows: datasheet figures, host costs and efficiency factors.

Why a table of its own: :data:`perf.instruments.health.NOMINAL_PEAKS` matches a *measured*
device's name to its peaks; the model needs more per GPU (memory bandwidth, fp16 peaks, the
host link and the GPU-to-GPU link) and is looked up by a *chosen* name on a box that has no
GPU. Every figure below is a dense (no structured sparsity) datasheet figure: where a
datasheet quotes tensor-core TFLOP/s "with sparsity" only, the dense figure is half of it.
Link rates are one direction: a datasheet's "128 GB/s" PCIe Gen5 x16 or "900 GB/s" NVLink is
both directions together.

What is *not* from a datasheet is stated with its source (:data:`DEFAULT_EFFICIENCY`,
:data:`HOST_OP_S`, :data:`MIN_KERNEL_S`). The host cost per op and the pageable-copy
efficiency are measured: ``benchmarks/model_vs_gpu.py`` on an H200 runner
(docs/measurements.md, "Accuracy against a GPU"); the rest are assumptions. A team models its
own runner's host with :func:`with_host_cost` (``--perf-gpu-host-op-us``).

:data:`MODEL_VERSION` names the figures and rules a modelled time was made with; the gate
never compares two versions (a stored baseline is recorded again instead).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

#: PCIe x16, one direction, theoretical GB/s (Gen3 / Gen4 / Gen5: 8 / 16 / 32 GT/s per lane,
#: 128b/130b encoding) - the datasheets' 32 / 64 / 128 GB/s are both directions together.
PCIE_GEN3_GBPS, PCIE_GEN4_GBPS, PCIE_GEN5_GBPS = 15.75, 31.5, 63.0

#: Version of the model's figures and rules, stored with every modelled time (the gate
#: refuses to compare two versions). 1: host 5 us per launching op and 1 us per other op,
#: pageable copies at 0.4 of the host link (all assumed). 2: host 25 us per dispatched op and
#: pageable copies at 0.1 of the link, both measured on an H200 runner. 3: the op stream
#: without the ``detach`` calls a dispatch mode itself causes (torch detaches each output
#: autograd saves through the mode), and the host cost and pageable rate fitted again to that
#: stream: 34.5 us, 0.14 of the link.
MODEL_VERSION = 3
#: Host cost of one dispatched op that launches a kernel or a copy, seconds: the host's whole
#: share of an eager op (Python, autograd, the dispatcher, the launch call). Measured: one
#: cost per dispatched op fitted to the Iris and Adam training steps of
#: ``benchmarks/model_vs_gpu.py`` on an H200 runner (16-vCPU Xeon VM, torch 2.11, Python
#: 3.12; ``benchmarks/results/model_vs_gpu_NVIDIA-H200_2026-11-27.json``), counting the ops
#: the program dispatches (``sim``'s recorder, ``--replay``): 34.5 us. (Version 2 fitted 25 us
#: to a stream with a mode's own ``detach`` calls in it: more ops for the same time.) A faster
#: host costs less; the launch call alone is a few microseconds.
HOST_OP_S = 34.5e-6
#: Host cost of a dispatched op that launches nothing (a view, an ``empty``), seconds. The
#: same measured figure: the fit cannot tell the two apart (a second parameter put views
#: above kernels, which is the Python around them, not the view).
HOST_DISPATCH_S = 34.5e-6
#: The shortest a kernel lasts on the device (an empty kernel's launch-to-finish), seconds.
#: Assumption, in the range microbenchmark studies report for empty kernels (2-3 us).
MIN_KERNEL_S = 2e-6


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of each datasheet peak the model assumes (all assumptions).

    ``pageable`` is relative to the host link: a pageable copy is staged by the driver
    through a pinned bounce buffer (CUDA C++ Best Practices Guide, "Pinned Memory"), so it
    reaches less of the link than a pinned one. It is measured: the rate that makes P4's
    pageable copy loop of 1 MiB copies (``benchmarks/model_vs_gpu.py``, first H200 run) match
    with the host cost of :data:`HOST_OP_S`: 0.14 of its PCIe Gen5 link, about 9 GB/s
    (version 2, with a host cost of 25 us: 0.1); larger copies reach more of the link.
    """

    tensor_core: float = 0.75
    cuda_core: float = 0.75
    memory: float = 0.8
    pinned: float = 0.8
    pageable: float = 0.14
    interconnect: float = 0.8
    source: str = (
        "assumed round figures below the datasheet peaks, except pageable (measured on an "
        "H200 runner by benchmarks/model_vs_gpu.py)"
    )


DEFAULT_EFFICIENCY = Efficiency()


@dataclass(frozen=True)
class GpuTarget:
    """One GPU of the time model: datasheet figures (dense TFLOP/s, GB/s one direction).

    ``tf32_tflops`` / ``bf16_tflops`` / ``fp16_tflops`` are tensor-core peaks (None where
    the GPU has no tensor core for that dtype: the op then runs at ``fp32_tflops``, the
    CUDA-core peak). ``interconnect_gbps`` is the GPU-to-GPU rate all-reduces use (NVLink
    where the GPU has it, else the host link). Add one with :func:`add_target`.
    """

    name: str
    fp32_tflops: float
    tf32_tflops: float | None
    bf16_tflops: float | None
    fp16_tflops: float | None
    memory_gbps: float
    host_link_gbps: float
    host_link: str
    interconnect_gbps: float
    source: str
    host_op_s: float = HOST_OP_S
    host_dispatch_s: float = HOST_DISPATCH_S
    min_kernel_s: float = MIN_KERNEL_S
    efficiency: Efficiency = field(default_factory=Efficiency)

    def __post_init__(self) -> None:
        for f in ("fp32_tflops", "memory_gbps", "host_link_gbps", "interconnect_gbps"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(
                    f"GpuTarget {self.name!r}: {f} must be a positive number, got {v!r}"
                )
        for f in ("host_op_s", "host_dispatch_s", "min_kernel_s"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"GpuTarget {self.name!r}: {f} must be >= 0 seconds, got {v!r}")

    def tensor_core_tflops(self, peak: str) -> float | None:
        """The tensor-core peak for ``"tf32"``, ``"bf16"`` or ``"fp16"`` (None: none)."""
        return {"tf32": self.tf32_tflops, "bf16": self.bf16_tflops, "fp16": self.fp16_tflops}.get(
            peak
        )


_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023)"
#: The built-in targets, by name. Figures: the datasheet named in each row's ``source``.
TARGETS: dict[str, GpuTarget] = {
    t.name: t
    for t in (
        # SXM5: 67 / 494.7 / 989.4 dense (989 / 1979 with sparsity), HBM3 3.35 TB/s,
        # NVLink 900 GB/s, PCIe Gen5.
        GpuTarget("H100 SXM", 67.0, 494.7, 989.4, 989.4, 3350.0, PCIE_GEN5_GBPS, "PCIe Gen5 x16",
                  450.0, _H100),
        # PCIe: 51 / 378 / 756 dense, HBM2e 2 TB/s, NVLink bridge 600 GB/s.
        GpuTarget("H100 PCIe", 51.0, 378.0, 756.0, 756.0, 2000.0, PCIE_GEN5_GBPS, "PCIe Gen5 x16",
                  300.0, _H100),
        # SXM: 67 / 494.5 / 989.5 dense (989 / 1979 with sparsity), HBM3e 4.8 TB/s,
        # NVLink 900 GB/s.
        GpuTarget("H200", 67.0, 494.5, 989.5, 989.5, 4800.0, PCIE_GEN5_GBPS, "PCIe Gen5 x16",
                  450.0, "NVIDIA H200 Tensor Core GPU datasheet (2024)"),
        # Grace Hopper: H100-class GPU (96 GB HBM3, 4 TB/s) on NVLink-C2C to the CPU,
        # 900 GB/s both directions together.
        GpuTarget("GH200", 67.0, 494.7, 989.4, 989.4, 4000.0, 450.0, "NVLink-C2C", 450.0,
                  "NVIDIA GH200 Grace Hopper Superchip datasheet (2023)"),
        # SXM4 80 GB: 19.5 / 156 / 312 / 312, HBM2e 2039 GB/s, NVLink 600 GB/s, PCIe Gen4.
        GpuTarget("A100", 19.5, 156.0, 312.0, 312.0, 2039.0, PCIE_GEN4_GBPS, "PCIe Gen4 x16",
                  300.0, "NVIDIA A100 Tensor Core GPU datasheet (2021)"),
        # 91.6 FP32; 366 / 733 / 733 with sparsity; GDDR6 864 GB/s; no NVLink.
        GpuTarget("L40S", 91.6, 183.0, 366.5, 366.5, 864.0, PCIE_GEN4_GBPS, "PCIe Gen4 x16",
                  PCIE_GEN4_GBPS, "NVIDIA L40S GPU datasheet (2023)"),
        # 30.3 FP32; 120 / 242 / 242 with sparsity; GDDR6 300 GB/s; no NVLink.
        GpuTarget("L4", 30.3, 60.0, 121.0, 121.0, 300.0, PCIE_GEN4_GBPS, "PCIe Gen4 x16",
                  PCIE_GEN4_GBPS, "NVIDIA L4 Tensor Core GPU datasheet (2023)"),
        # 31.2 FP32; 62.5 / 125 / 125 dense; GDDR6 600 GB/s; no NVLink.
        GpuTarget("A10", 31.2, 62.5, 125.0, 125.0, 600.0, PCIE_GEN4_GBPS, "PCIe Gen4 x16",
                  PCIE_GEN4_GBPS, "NVIDIA A10 Tensor Core GPU datasheet (2021)"),
        # Turing: 8.1 FP32, 65 FP16 tensor (mixed precision); no TF32 or BF16 tensor cores;
        # GDDR6 320 GB/s; PCIe Gen3.
        GpuTarget("T4", 8.1, None, None, 65.0, 320.0, PCIE_GEN3_GBPS, "PCIe Gen3 x16",
                  PCIE_GEN3_GBPS, "NVIDIA T4 Tensor Core GPU datasheet (2019)"),
    )
}  # fmt: skip
DEFAULT_TARGET = "H100 SXM"


def add_target(target: GpuTarget, *, replace: bool = False) -> GpuTarget:
    """Make ``target`` known to :func:`get_target` (and ``--perf-gpu-target``) by its name.

    A name already known raises ``ValueError`` unless ``replace=True``: a silently changed
    datasheet would change every stored modelled figure.
    """
    if not isinstance(target, GpuTarget):
        raise TypeError(f"add_target needs a perf GpuTarget, got {type(target).__name__}")
    if target.name in TARGETS and not replace:
        raise ValueError(
            f"GPU target {target.name!r} is already known; pass replace=True to change it"
        )
    TARGETS[target.name] = target
    return target


def with_host_cost(target: GpuTarget, host_op_us: float | str) -> GpuTarget:
    """``target`` with one host cost per dispatched op, launching or not (microseconds):
    the figure ``benchmarks/model_vs_gpu.py`` fits on a GPU runner (an H200 runner's, 34.5 us,
    is :data:`HOST_OP_S`). The name says so (``"H100 SXM, host 12 us/op"``), so stored
    modelled times are never compared across host figures."""
    try:
        us = float(host_op_us)
    except (TypeError, ValueError):
        raise ValueError(f"{host_op_us!r} is not a number of microseconds") from None
    if not us > 0 or us == float("inf"):
        raise ValueError(f"a host cost per op must be a positive number of microseconds, got {us}")
    s = us / 1e6
    name = f"{target.name}, host {us:g} us/op"
    return dataclasses.replace(target, name=name, host_op_s=s, host_dispatch_s=s)


def get_target(target: str | GpuTarget) -> GpuTarget:
    """The target of that name (a :class:`GpuTarget` is returned as is); unknown names raise
    ``ValueError`` listing the known ones."""
    if isinstance(target, GpuTarget):
        return target
    found = TARGETS.get(target)
    if found is None:
        known = ", ".join(repr(n) for n in TARGETS)
        raise ValueError(
            f"unknown GPU target {target!r}; known targets: {known} "
            "(add one with perf.instruments.gpu_targets.add_target)"
        )
    return found
