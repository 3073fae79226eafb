"""Before a GPU job measures anything: is this the GPU the pool promised, is it idle, does the
driver run the torch wheel, and what are its clocks?

Why: a GPU runner that a neighbour is using, a mislabelled runner of another GPU model, or a
torch wheel built for a newer CUDA than the driver supports all produce numbers that gate as
regressions (or as nothing, when every CUDA test skips). ``nvidia-smi`` answers each question
without initialising CUDA, so this runs before torch is installed or imported.

Pure parsing and judging here; :func:`query` is the only part that runs ``nvidia-smi``.
Used by ``python -m perf gpu-preflight`` and the ``GPU preflight`` step of ``gpu.yml``.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: Fields asked of ``nvidia-smi --query-gpu`` (all supported by drivers of the last decade:
#: a field a driver does not know fails the whole query).
GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "pstate",
    "clocks.sm",
    "clocks.max.sm",
    "clocks.mem",
    "clocks.max.mem",
)
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
#: Median GPU utilisation (percent) above which a GPU counts as busy.
MAX_IDLE_UTILIZATION_PCT = 10.0


class PreflightError(RuntimeError):
    """``nvidia-smi`` is missing or failed: there is no NVIDIA driver to check."""


@dataclass(frozen=True)
class GpuState:
    """One GPU as ``nvidia-smi`` reports it; None where it says ``[N/A]``."""

    index: int
    uuid: str
    name: str
    driver: str
    utilization_pct: tuple[float, ...]  # one per sample
    memory_used_mib: float | None
    memory_total_mib: float | None
    temperature_c: float | None
    pstate: str
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    mem_clock_mhz: float | None
    mem_clock_max_mhz: float | None


@dataclass(frozen=True)
class ComputeApp:
    """A process holding a CUDA context on a GPU."""

    gpu_uuid: str
    pid: int
    name: str
    used_memory_mib: float | None


@dataclass(frozen=True)
class Preflight:
    """The verdict: ``problems`` fail the job, ``warnings`` are said and let it run."""

    gpus: tuple[GpuState, ...]
    apps: tuple[ComputeApp, ...]
    driver_cuda: tuple[int, int] | None
    torch_cuda: tuple[int, int] | None
    problems: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {"schema": "perf-gpu-preflight/1", "ok": self.ok, **asdict(self)}


def _num(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None  # [N/A], [Not Supported], [Unknown Error]


def _rows(csv_text: str, width: int) -> list[list[str]]:
    rows = []
    for line in csv_text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != width:
            raise PreflightError(f"nvidia-smi printed an unexpected line: {line!r}")
        rows.append(cells)
    return rows


def parse_gpus(samples: Sequence[str]) -> list[GpuState]:
    """GPUs from one or more ``--query-gpu=GPU_FIELDS --format=csv,noheader,nounits``
    outputs; utilisation keeps every sample, the rest comes from the last one."""
    if not samples:
        return []
    util: dict[str, list[float]] = {}
    for text in samples:
        for cells in _rows(text, len(GPU_FIELDS)):
            u = _num(cells[4])
            util.setdefault(cells[1], [])
            if u is not None:
                util[cells[1]].append(u)
    out = []
    for c in _rows(samples[-1], len(GPU_FIELDS)):
        out.append(
            GpuState(
                index=int(c[0]),
                uuid=c[1],
                name=c[2],
                driver=c[3],
                utilization_pct=tuple(util.get(c[1], ())),
                memory_used_mib=_num(c[5]),
                memory_total_mib=_num(c[6]),
                temperature_c=_num(c[7]),
                pstate=c[8],
                sm_clock_mhz=_num(c[9]),
                sm_clock_max_mhz=_num(c[10]),
                mem_clock_mhz=_num(c[11]),
                mem_clock_max_mhz=_num(c[12]),
            )
        )
    return out


def parse_apps(csv_text: str) -> list[ComputeApp]:
    """``--query-compute-apps=APP_FIELDS --format=csv,noheader,nounits``."""
    return [
        ComputeApp(c[0], int(c[1]), c[2], _num(c[3]))
        for c in _rows(csv_text, len(APP_FIELDS))
        if c[1].isdigit()
    ]


_DRIVER_CUDA = re.compile(r"CUDA Version\s*:\s*(\d+)\.(\d+)")


def parse_driver_cuda(text: str) -> tuple[int, int] | None:
    """The newest CUDA the driver supports, from ``nvidia-smi``'s header ("CUDA Version")."""
    m = _DRIVER_CUDA.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def wheel_cuda(tag: str) -> tuple[int, int]:
    """``cu128`` -> (12, 8): the CUDA version of a PyTorch wheel variant."""
    m = re.fullmatch(r"cu(\d+)(\d)", tag.strip().lower())
    if not m:
        raise ValueError(
            f"torch CUDA variant {tag!r} is not of the form cuXYZ (cu126, cu128, cu130: the "
            "folder names of PyTorch's wheel index)"
        )
    return int(m.group(1)), int(m.group(2))


def visible(gpus: Sequence[GpuState], cuda_visible_devices: str | None) -> list[GpuState]:
    """The GPUs a CUDA program here would see, in its order, by the driver's rule for
    ``CUDA_VISIBLE_DEVICES`` (:func:`perf.core.devices.cuda_visible`)."""
    from perf.core.devices import cuda_visible

    by_index = sorted(gpus, key=lambda g: g.index)
    return [by_index[i] for i in cuda_visible(cuda_visible_devices, [g.uuid for g in by_index])]


def judge(
    gpus: Sequence[GpuState],
    apps: Sequence[ComputeApp],
    driver_cuda: tuple[int, int] | None,
    *,
    expect_gpu: str | None = None,
    torch_cuda: str | None = None,
    max_utilization_pct: float = MAX_IDLE_UTILIZATION_PCT,
) -> Preflight:
    """The pool's promise (``expect_gpu``: a substring of every GPU's name), idleness (no
    compute process, median utilisation at most ``max_utilization_pct``), the driver against
    the wheel (``torch_cuda``), and clocks that are reported."""
    problems: list[str] = []
    warns: list[str] = []
    want = wheel_cuda(torch_cuda) if torch_cuda else None
    if not gpus:
        problems.append("nvidia-smi lists no GPU (or CUDA_VISIBLE_DEVICES hides every one)")
    for g in gpus:
        label = f"GPU {g.index} ({g.name})"
        if expect_gpu and expect_gpu.lower() not in g.name.lower():
            problems.append(
                f"{label} is not a {expect_gpu!r}: this runner does not belong to the pool "
                "that the job's matrix entry names (its baselines would mix GPU models); fix "
                "the runner's labels or the matrix entry's gpu_name"
            )
        busy = [a for a in apps if a.gpu_uuid == g.uuid]
        if busy:
            who = ", ".join(
                f"pid {a.pid} {a.name}"
                + (f" ({a.used_memory_mib:.0f} MiB)" if a.used_memory_mib is not None else "")
                for a in busy
            )
            problems.append(
                f"{label} is not idle: {who} holds it; timings would measure that neighbour. "
                "Stop it, or give perf a GPU of its own (CUDA_VISIBLE_DEVICES)"
            )
        if g.utilization_pct:
            med = statistics.median(g.utilization_pct)
            if med > max_utilization_pct:
                problems.append(
                    f"{label} is not idle: {med:.0f}% utilisation (median of "
                    f"{len(g.utilization_pct)} samples, limit {max_utilization_pct:.0f}%), "
                    "though no process of this container holds it: another container or VM "
                    "shares this GPU"
                )
        if g.sm_clock_mhz is None or g.sm_clock_max_mhz is None:
            warns.append(
                f"{label}: the driver does not report its SM clock: a throttled GPU cannot be "
                "told from a slow change"
            )
    if want is not None:
        if driver_cuda is None:
            warns.append("nvidia-smi does not say which CUDA the driver supports")
        elif want[0] > driver_cuda[0]:
            problems.append(
                f"the torch wheel is built for CUDA {want[0]}.{want[1]} ({torch_cuda}), but this "
                f"driver supports CUDA {driver_cuda[0]}.{driver_cuda[1]} at most: torch would "
                "not see the GPU. Pick a variant cu"
                f"{driver_cuda[0]}x for this pool, or update the driver"
            )
        elif want[0] == driver_cuda[0] and want[1] > driver_cuda[1]:
            warns.append(
                f"the torch wheel is built for CUDA {want[0]}.{want[1]} ({torch_cuda}) and the "
                f"driver supports {driver_cuda[0]}.{driver_cuda[1]}: it runs under CUDA's "
                "minor-version compatibility, but a kernel JIT-compiled from PTX can fail; "
                f"prefer cu{driver_cuda[0]}{driver_cuda[1]} or a newer driver"
            )
    return Preflight(tuple(gpus), tuple(apps), driver_cuda, want, tuple(problems), tuple(warns))


def query(
    *,
    samples: int = 3,
    interval_s: float = 0.5,
    exe: str = "nvidia-smi",
    run: Callable[[list[str]], str] | None = None,
) -> tuple[list[GpuState], list[ComputeApp], tuple[int, int] | None]:
    """Ask ``nvidia-smi`` (``samples`` utilisation readings ``interval_s`` apart)."""

    def default_run(args: list[str]) -> str:
        try:
            proc = subprocess.run(
                [exe, *args], capture_output=True, text=True, timeout=60, check=False
            )
        except FileNotFoundError:
            raise PreflightError(
                f"{exe} is not on PATH: this machine has no NVIDIA driver (or the container "
                "was started without the GPU: docker --gpus all)"
            ) from None
        except subprocess.TimeoutExpired:
            raise PreflightError(f"{exe} did not answer within 60 s: a hung driver?") from None
        if proc.returncode != 0:
            raise PreflightError(
                f"{exe} {' '.join(args)} failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()[:500]}"
            )
        return proc.stdout

    call = run or default_run
    fmt = "--format=csv,noheader,nounits"
    texts = []
    for i in range(max(1, samples)):
        if i:
            time.sleep(interval_s)
        texts.append(call([f"--query-gpu={','.join(GPU_FIELDS)}", fmt]))
    apps = parse_apps(call([f"--query-compute-apps={','.join(APP_FIELDS)}", fmt]))
    return parse_gpus(texts), apps, parse_driver_cuda(call([]))


def _fmt(v: float | None, unit: str) -> str:
    return "n/a" if v is None else f"{v:.0f} {unit}"


def markdown(p: Preflight, escape: Callable[[str], str] = str) -> list[str]:
    """A table for the job summary: what was checked and the clocks. ``escape`` is applied
    to text from the machine (GPU and process names; the report floor's ``md_text``)."""
    lines = [
        "### GPU preflight: " + ("passed" if p.ok else "FAILED"),
        "",
        "| GPU | name | util (samples) | memory used | temp | pstate | SM clock / max "
        "| memory clock / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in p.gpus:
        util = ", ".join(f"{u:.0f}%" for u in g.utilization_pct) or "n/a"
        lines.append(
            f"| {g.index} | {escape(g.name)} | {util} | {_fmt(g.memory_used_mib, 'MiB')} "
            f"| {_fmt(g.temperature_c, 'C')} | {g.pstate} "
            f"| {_fmt(g.sm_clock_mhz, 'MHz')} / {_fmt(g.sm_clock_max_mhz, 'MHz')} "
            f"| {_fmt(g.mem_clock_mhz, 'MHz')} / {_fmt(g.mem_clock_max_mhz, 'MHz')} |"
        )
    if p.driver_cuda:
        lines += ["", f"Driver supports CUDA {p.driver_cuda[0]}.{p.driver_cuda[1]}."]
    lines += [""] + [f"- **problem:** {escape(x)}" for x in p.problems]
    lines += [f"- warning: {escape(x)}" for x in p.warnings]
    return lines
