"""The two-timeline GPU time model: a pure function of a list of op events and a target.

Why pure: the model is the part that must be exact and deterministic (same events, same
figures, to the bit), so it takes plain data (:class:`OpEvent`) and is tested with
hand-derived cases, without torch dispatch. :mod:`perf.instruments.gpu_model` turns the op
stream of ``sim`` / ``cuda`` into these events. The rules (docs/gpu-model.md):

- *Host*: every op that launches a kernel or a copy costs the host ``host_op_s`` (dispatch +
  launch API call); an op that launches nothing costs ``host_dispatch_s``. A sync blocks the
  host until the device's stream and the copy engines are idle. A blocking copy (pageable
  host-to-device, any device-to-host without ``non_blocking``) waits like a sync, then lasts
  its transfer. A pinned ``non_blocking`` host-to-device copy runs on a copy engine: it
  overlaps compute, and only the kernels that read its buffer wait for it.
- *Device*: a kernel starts at ``max(launch time, device free, its inputs ready)`` and lasts
  ``max(flops / (peak x eff), bytes / (memory bandwidth x eff), min_kernel_s)``.
- *Collectives*: an all-reduce of ``b`` bytes over ``n`` ranks lasts
  ``2 (n - 1) / n x b / (interconnect x eff)`` (ring) on the device's stream.
- *CUDA graphs*: a replay costs the host one launch; its kernels run back to back.

Every figure is *modelled* seconds on the target, not a measurement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from perf.instruments.gpu_targets import MODEL_VERSION, GpuTarget

EventKind = Literal["kernel", "copy", "sync", "collective", "graph", "host"]
Bound = Literal["launch", "compute", "memory", "transfer", "sync"]
#: Order of the bounds when two components are equal (the first wins).
BOUNDS: tuple[Bound, ...] = ("compute", "memory", "transfer", "sync", "launch")


class OpEvent(NamedTuple):
    """One thing the device program does, in program order (a named tuple: immutable, and
    cheap to make once per dispatched op).

    ``peak``: which peak a kernel's FLOPs run at (``"fp32"``: CUDA cores; ``"tf32"``,
    ``"bf16"``, ``"fp16"``: tensor cores, where the target has them). ``nbytes``: device
    memory a kernel reads and writes, bytes a copy moves, or bytes an all-reduce reduces.
    ``reads`` / ``writes``: buffer keys, so a kernel waits for the async copy that fills its
    input. ``dtype`` labels the op in reports (``"mm bf16"``).
    """

    kind: EventKind
    name: str
    site: str = "<unknown>"
    dtype: str = ""
    flops: int = 0
    nbytes: int = 0
    peak: str = "fp32"
    direction: Literal["", "h2d", "d2h"] = ""
    pinned: bool = False
    non_blocking: bool = False
    world_size: int = 1
    kernels: tuple[OpEvent, ...] = ()
    reads: tuple[int, ...] = ()
    writes: int | None = None

    @property
    def label(self) -> str:
        return f"{self.name} {self.dtype}" if self.dtype else self.name


@dataclass(frozen=True)
class SiteTime:
    """Modelled seconds of the events from one source line, and what bounds them."""

    time_s: float
    bound: Bound
    #: the op (and dtype) that costs the most at this site, e.g. ``"mm bf16"``
    op: str
    launches: int
    function: str = ""
    code: str = ""


@dataclass(frozen=True)
class GpuTime:
    """Modelled time of a block on a target GPU (every figure *modelled*, in seconds).

    ``total_s``: the block's wall time (until the host, the stream and the copy engines are
    all done). ``host_s``: host time spent dispatching and launching. ``sync_wait_s``: host
    time blocked on syncs and blocking copies waiting for queued work. ``device_busy_s`` /
    ``device_idle_s``: the compute stream's busy time (kernels, collectives, blocking copies)
    and the rest of ``total_s``. ``transfer_s``: host<->device copy time on either engine.
    ``by_op`` / ``by_site``: each event's cost (the longer of its host and device time, plus
    its wait), summed per op name and per source line. ``bound``: the largest component.
    """

    target: str
    total_s: float
    device_busy_s: float
    host_s: float
    device_idle_s: float
    sync_wait_s: float
    transfer_s: float
    launches: int
    by_op: dict[str, float]
    by_site: dict[str, SiteTime]
    bound: Bound
    #: modelled seconds per bound (what ``bound`` is the largest of)
    components: dict[str, float] = field(default_factory=dict)

    @property
    def sites(self) -> dict[str, dict[str, Any]]:
        """JSON-ready sites for a metric's extra data (``model_sites``), which the gate uses
        to name the sites whose modelled time grew and the bound that changed."""
        return {
            k: {
                "modelled_s": v.time_s,
                "bound": v.bound,
                "op": v.op,
                "launches": v.launches,
                "function": v.function,
                "code": v.code,
            }
            for k, v in self.by_site.items()
        }

    @property
    def metric_extra(self) -> dict[str, Any]:
        """The extra data of a recorded modelled time, which the gate needs to compare it (the
        target) and to name the sites that moved: ``perf_metrics.record("gpu_time",
        t.total_s, "modelled_s", **t.metric_extra)``. ``model`` is the model's version
        (:data:`~perf.instruments.gpu_targets.MODEL_VERSION`): figures of two versions are
        never compared."""
        return {
            "target": self.target,
            "model": MODEL_VERSION,
            "bound": self.bound,
            "model_sites": self.sites,
        }

    def summary(self) -> str:
        """One line, labelled modelled: ``modelled on H100 SXM: 1.234 ms (compute-bound)``."""
        return (
            f"modelled on {self.target}: {self.total_s * 1e3:.3f} ms ({self.bound}-bound; "
            f"{self.launches} launches, sync wait {self.sync_wait_s * 1e3:.3f} ms, "
            f"transfers {self.transfer_s * 1e3:.3f} ms)"
        )


def kernel_time(ev: OpEvent, target: GpuTarget) -> tuple[float, Bound]:
    """A kernel's modelled duration and what bounds it (compute, memory, or ``launch`` when
    the minimum kernel time is the largest)."""
    eff = target.efficiency
    tc = target.tensor_core_tflops(ev.peak)
    if tc is not None:
        flops_per_s = tc * 1e12 * eff.tensor_core
    else:
        flops_per_s = target.fp32_tflops * 1e12 * eff.cuda_core
    compute = ev.flops / flops_per_s
    memory = ev.nbytes / (target.memory_gbps * 1e9 * eff.memory)
    if compute >= memory and compute >= target.min_kernel_s:
        return compute, "compute"
    if memory >= target.min_kernel_s:
        return memory, "memory"
    return target.min_kernel_s, "launch"


def copy_time(ev: OpEvent, target: GpuTarget) -> float:
    """A host<->device copy's duration: bytes over the host link at the pinned or pageable
    efficiency."""
    eff = target.efficiency.pinned if ev.pinned else target.efficiency.pageable
    return ev.nbytes / (target.host_link_gbps * 1e9 * eff)


def allreduce_time(ev: OpEvent, target: GpuTarget) -> float:
    """Ring all-reduce: ``2 (n - 1) / n x bytes / (interconnect x eff)``, at least one
    minimum kernel time."""
    n = max(1, ev.world_size)
    bw = target.interconnect_gbps * 1e9 * target.efficiency.interconnect
    return max(2.0 * (n - 1) / n * ev.nbytes / bw, target.min_kernel_s)


def is_blocking_copy(ev: OpEvent) -> bool:
    """Pageable copies and copies without ``non_blocking`` block the host (CUDA stages a
    pageable copy through a pinned buffer and returns when it is done)."""
    return not (ev.pinned and ev.non_blocking)


class _Acc:
    """Per-site and per-op accumulation of event costs."""

    def __init__(self) -> None:
        self.comp: defaultdict[str, float] = defaultdict(float)
        self.site_comp: defaultdict[str, defaultdict[str, float]] = defaultdict(
            lambda: defaultdict(float)
        )
        self.site_ops: defaultdict[str, defaultdict[str, float]] = defaultdict(
            lambda: defaultdict(float)
        )
        self.site_launches: defaultdict[str, int] = defaultdict(int)
        self.by_op: defaultdict[str, float] = defaultdict(float)

    def add(self, ev: OpEvent, bound: str, seconds: float) -> None:
        self.comp[bound] += seconds
        self.site_comp[ev.site][bound] += seconds
        self.site_ops[ev.site][ev.label] += seconds
        self.by_op[ev.name] += seconds


def _largest(comp: dict[str, float]) -> Bound:
    best: Bound = "launch"
    top = -1.0
    for b in BOUNDS:
        v = comp.get(b, 0.0)
        if v > top:
            best, top = b, v
    return best


def simulate(
    events: Iterable[OpEvent],
    target: GpuTarget,
    site_info: dict[str, tuple[str, str]] | None = None,
) -> GpuTime:
    """Run the two timelines over ``events`` (program order) on ``target``.

    ``site_info``: ``{site: (function, source line)}`` for the report. Pure and
    deterministic: the same events give the same floats, bit for bit.
    """
    host = 0.0  # the host's clock
    dev_free = 0.0  # when the compute stream has finished its queue
    copy_free = {"h2d": 0.0, "d2h": 0.0}  # when each copy engine is idle
    ready: dict[int, float] = {}  # buffer -> when the async copy filling it ends
    host_s = sync_wait = busy = transfer = 0.0
    launches = 0
    acc = _Acc()
    for ev in events:
        k = ev.kind
        if k == "kernel":
            host += target.host_op_s
            launches += 1
            start = max(host, dev_free)
            for r in ev.reads:
                start = max(start, ready.get(r, 0.0))
            dur, bound = kernel_time(ev, target)
            dev_free = start + dur
            busy += dur
            host_s += target.host_op_s
            if target.host_op_s > dur:
                acc.add(ev, "launch", target.host_op_s)
            else:
                acc.add(ev, bound, dur)
            acc.site_launches[ev.site] += 1
        elif k == "host":
            host += target.host_dispatch_s
            host_s += target.host_dispatch_s
            acc.add(ev, "launch", target.host_dispatch_s)
        elif k == "sync":
            drained = max(dev_free, copy_free["h2d"], copy_free["d2h"])
            wait = max(0.0, drained - host)
            host += wait
            sync_wait += wait
            acc.add(ev, "sync", wait)
        elif k == "copy":
            host += target.host_op_s
            host_s += target.host_op_s
            dur = copy_time(ev, target)
            transfer += dur
            engine = ev.direction or "h2d"
            if is_blocking_copy(ev):
                # stream order: after every queued kernel and copy; the host waits for it all
                drained = max(dev_free, copy_free["h2d"], copy_free["d2h"])
                wait = max(0.0, drained - host)
                sync_wait += wait
                end = host + wait + dur
                host = end
                dev_free = end
                busy += dur
                copy_free[engine] = end
                acc.add(ev, "sync", wait)
                acc.add(ev, "transfer", max(dur, target.host_op_s))
            else:
                start = max(host, copy_free[engine])
                if engine == "d2h":
                    start = max(start, dev_free)  # its source is written by queued kernels
                end = start + dur
                copy_free[engine] = end
                if ev.writes is not None:
                    ready[ev.writes] = end
                acc.add(ev, "transfer", max(dur, target.host_op_s))
        elif k == "collective":
            host += target.host_op_s
            host_s += target.host_op_s
            launches += 1
            start = max(host, dev_free)
            dur = allreduce_time(ev, target)
            dev_free = start + dur
            busy += dur
            transfer += dur
            acc.add(ev, "transfer", max(dur, target.host_op_s))
            acc.site_launches[ev.site] += 1
        elif k == "graph":
            host += target.host_op_s  # cudaGraphLaunch: one launch for the whole graph
            host_s += target.host_op_s
            launches += 1
            start = max(host, dev_free)
            graph_s = 0.0
            comp: defaultdict[str, float] = defaultdict(float)
            for inner in ev.kernels:
                dur, bound = kernel_time(inner, target)
                graph_s += dur
                comp[bound] += dur
            dev_free = start + graph_s
            busy += graph_s
            if target.host_op_s > graph_s:
                acc.add(ev, "launch", target.host_op_s)
            else:
                for b, v in comp.items():
                    acc.add(ev, b, v)
            acc.site_launches[ev.site] += 1
        else:
            raise ValueError(f"unknown event kind {k!r} (one of kernel, copy, sync, ...)")
    total = max(host, dev_free, copy_free["h2d"], copy_free["d2h"])
    info = site_info or {}
    by_site = {}
    for site in sorted(acc.site_comp):
        comp_s = acc.site_comp[site]
        ops = acc.site_ops[site]
        op = max(sorted(ops), key=lambda o: ops[o])
        fn, code = info.get(site, ("", ""))
        by_site[site] = SiteTime(
            sum(comp_s.values()), _largest(comp_s), op, acc.site_launches[site], fn, code
        )
    return GpuTime(
        target=target.name,
        total_s=total,
        device_busy_s=busy,
        host_s=host_s,
        device_idle_s=max(0.0, total - busy),
        sync_wait_s=sync_wait,
        transfer_s=transfer,
        launches=launches,
        by_op=dict(sorted(acc.by_op.items())),
        by_site=by_site,
        bound=_largest(acc.comp),
        components={b: acc.comp.get(b, 0.0) for b in BOUNDS},
    )
