"""Device discovery and the machine fingerprint.

The fingerprint decides whether two runs' timings may be compared at all: a timing baseline
from another CPU, GPU, driver or torch build is a different experiment.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that use it: the gate's modules import this one for
# TIMING_KEYS, and a process that never runs torch (a child timing torch-free code, a gate
# that only compares stored runs) should not pay ~1.5 s of CPU to import it.

#: The id of the simulated accelerator (``perf.simulated_device()``) in device lists.
SIM = "sim"

SIM_TIMING_SKIP_REASON = (
    "timing on the simulated device is meaningless: it runs the CPU kernels through a Python "
    "backend; time on cpu or cuda instead"
)


def _real_accelerator() -> str | None:
    from perf.sim import device as simulated

    return simulated._real_accelerator()


def cuda_visible(spec: str | None, uuids: Sequence[str]) -> list[int]:
    """Indices into ``uuids`` (the physical GPUs) that a process sees, ``cuda:0`` first, the
    way the CUDA driver reads ``CUDA_VISIBLE_DEVICES=spec``: unset means all; entries are
    indices or ``GPU-`` uuid prefixes naming one device; the list ends at the first entry that
    names no device or repeats one (so ``""`` and ``"-1"`` hide every device). One rule for
    the rehearsal's fake and the GPU preflight."""
    if spec is None:
        return list(range(len(uuids)))
    out: list[int] = []
    for raw in spec.split(","):
        tok = raw.strip()
        idx: int | None = None
        if tok.isdigit() and int(tok) < len(uuids):
            idx = int(tok)
        elif tok.startswith("GPU-") and len(tok) > 4:
            hits = [i for i, u in enumerate(uuids) if u.startswith(tok)]
            idx = hits[0] if len(hits) == 1 else None
        if idx is None or idx in out:
            break
        out.append(idx)
    return out


def sim_unavailable_reason() -> str | None:
    """Why the simulated device cannot be used in this process, or None if it can (the
    simulated device's own list: :func:`perf.sim.device.unavailable_reason`)."""
    from perf.sim import device as simulated

    return simulated.unavailable_reason()


def available_devices() -> list[str]:
    """Usable devices: ``cpu``, each ``cuda:N``, ``mps`` where present, and ``sim`` (the
    simulated accelerator) where there is no real one."""
    import torch

    out = ["cpu"]
    if torch.cuda.is_available():
        out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    if len(out) == 1 and sim_unavailable_reason() is None:
        out.append(SIM)
    return out


def make_device(name: str) -> torch.device:
    """The ``torch.device`` for a name from ``parse_devices``; ``sim`` installs the simulated
    accelerator into this process (see ``perf.sim.device``)."""
    import torch

    if name == SIM:
        from perf.sim.device import simulated_device

        return simulated_device()
    return torch.device(name)


def is_sim(device: object) -> bool:
    """Whether ``device`` (a ``torch.device`` or name) is the simulated accelerator."""

    return getattr(device, "type", str(device).split(":")[0]) == SIM


def parse_devices(spec: str, available: list[str] | None = None) -> list[str]:
    """Parse ``--perf-devices`` (``cpu,cuda``, ``all``, ``cuda:1``, ``sim``) against what exists.

    ``cuda`` expands to every visible CUDA device. Raises ``ValueError`` naming the devices
    that exist when a requested one does not.
    """
    import torch

    avail = available_devices() if available is None else available
    out: list[str] = []
    for raw in spec.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name == "all":
            picked = list(avail)
        elif name in ("cuda", "gpu"):
            picked = [d for d in avail if d.startswith("cuda:")]
            if not picked:
                raise ValueError(
                    f"--perf-devices asks for {raw.strip()!r} but this machine has no CUDA "
                    f"device (torch {torch.__version__}, torch.cuda.is_available() is False); "
                    f"devices here: {', '.join(avail)}"
                )
        else:
            if name == "cuda:":
                name = "cuda:0"
            if name in (SIM, f"{SIM}:0"):
                name = SIM
                if name not in avail:
                    why = sim_unavailable_reason() if available is None else None
                    raise ValueError(
                        f"--perf-devices asks for {raw.strip()!r}, the simulated accelerator, "
                        f"which is not available here: {why or 'not in the device list'}; "
                        f"devices here: {', '.join(avail)}"
                    )
            if name not in avail:
                raise ValueError(
                    f"--perf-devices asks for {raw.strip()!r}, which does not exist here; "
                    f"devices here: {', '.join(avail)}"
                )
            picked = [name]
        for d in picked:
            if d not in out:
                out.append(d)
    if not out:
        raise ValueError(
            f"--perf-devices {spec!r} names no device; devices here: {', '.join(avail)}"
        )
    return out


@functools.lru_cache(maxsize=1)
def _cpu_model() -> str:
    """The CPU's marketing name. /proc/cpuinfo on Linux (instant); elsewhere py-cpuinfo, which
    knows macOS and Windows but runs itself in a subprocess (about a second)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        import cpuinfo

        model = cpuinfo.get_cpu_info().get("brand_raw") or ""
        if model:
            return str(model)
    except Exception:  # cpuinfo may fail in odd sandboxes; fall back below
        pass
    return platform.processor() or platform.machine()


def _driver_version() -> str | None:
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            first = f.readline()
        for tok in first.split():
            if tok.count(".") >= 1 and tok.replace(".", "").isdigit():
                return tok
    except OSError:
        pass
    return None


def fingerprint() -> dict[str, Any]:
    """What decides whether timings are comparable across runs; plain JSON types only."""
    import torch

    fp: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "system": platform.system(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpus": [],
        "driver": None,
    }
    if torch.cuda.is_available():
        fp["driver"] = _driver_version()
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            fp["gpus"].append(
                {
                    "name": p.name,
                    "capability": f"{p.major}.{p.minor}",
                    "total_memory": int(p.total_memory),
                    "sm_count": int(p.multi_processor_count),
                }
            )
    return fp


#: Fingerprint fields that must match for cross-run timings to be comparable.
TIMING_KEYS = (
    "cpu_model",
    "cpu_count",
    "machine",
    "torch",
    "torch_threads",
    "cuda",
    "cudnn",
    "gpus",
    "driver",
)


def fingerprint_diff(
    a: dict[str, Any], b: dict[str, Any], keys: tuple[str, ...] = TIMING_KEYS
) -> dict[str, tuple[Any, Any]]:
    """Fields whose values differ between two fingerprints (empty: comparable)."""
    return {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)}


def machine_id(fp: dict[str, Any] | None = None) -> str:
    """A short, filesystem-safe name for a fingerprint's timing-relevant fields."""
    import hashlib
    import json

    fp = fingerprint() if fp is None else fp
    key = json.dumps({k: fp.get(k) for k in TIMING_KEYS}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    gpu = fp.get("gpus") or []
    kind = gpu[0]["name"] if gpu else "cpu"
    slug = "".join(c if c.isalnum() else "-" for c in f"{fp.get('system')}-{kind}").strip("-")
    return f"{slug}-{digest}"
