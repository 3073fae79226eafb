"""Chrome traces of failing (or gate-suspect) timing tests: the evidence a red timing test
needs.

What is traced, after the timed run (so the trace never perturbs the samples that decided
the verdict): *one call of each function the test measured*. While a test is traced
(:func:`arm`), :func:`perf.measure` and :func:`perf.compare` leave the callables they timed
here (:func:`remember`); the trace runs one call of each, labelled, under ``torch.profiler``
(:func:`trace_measured`). A test that measured nothing through perf is re-run whole instead.

Rules that keep a trace from breaking a run:

- **Never nest profilers.** A second ``torch.profiler`` session inside a running one fails
  (``count_ops`` on CUDA starts one), so :func:`trace_call` raises :class:`ProfilerBusy`
  before starting when a session is running, and tracing one measured call (instead of the
  whole test) keeps a test's own profiler out of the trace.
- **Bounded size.** A whole-test re-run of a long loop records ~10^6 events (hundreds of MB
  of JSON). A trace over :data:`MAX_EVENTS` events or :data:`MAX_BYTES` bytes is written
  truncated: the first events in time order, a top-level ``perf_truncated`` record and an
  instant event named ``perf: trace truncated ...`` saying how many were kept of how many.

Open a trace in https://ui.perfetto.dev or ``chrome://tracing``. Pure logic here (no pytest);
:mod:`perf.plugin.trace` is the glue.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf.core import rehearse

#: File names stay short and portable (artifact uploads reject some characters).
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_STEM = 120
#: Size caps of one trace: profiler events, and bytes of the exported JSON.
MAX_EVENTS = 200_000
MAX_BYTES = 64 * 2**20


@dataclass(frozen=True)
class TraceResult:
    """One trace written: where, for which test, why, and how the profiled re-run ended."""

    path: Path
    nodeid: str
    reason: str
    #: None when the re-run returned; else the exception's type and message (a failing
    #: timing test usually fails again: the trace is still complete up to that point).
    rerun_error: str | None
    duration_s: float
    #: what ran under the profiler: "one call of <labels>" or "the whole test"
    what: str = "the whole test"
    truncated: bool = False
    kept_events: int = 0
    total_events: int = 0


class NotTraced(RuntimeError):
    """Nothing was traced, for the reason in the message (raised before anything ran)."""


class ProfilerBusy(NotTraced):
    """A ``torch.profiler`` session is already running: a second one would fail."""


@dataclass(frozen=True)
class MeasuredCall:
    """A callable that perf.measure / perf.compare timed, with its label and device."""

    label: str
    fn: Callable[[], object]
    device: str


# The callables measured in the test being traced; None while no test is traced, so a
# library user's closures (and the tensors they hold) are never kept alive here.
_measured: list[MeasuredCall] | None = None


def arm() -> None:
    """Start keeping the callables that perf.measure / perf.compare time (one test)."""
    global _measured
    _measured = []


def disarm() -> list[MeasuredCall]:
    """Stop keeping them; return what the last measurement timed (and drop the references)."""
    global _measured
    got, _measured = _measured or [], None
    return got


def remember(calls: Sequence[MeasuredCall]) -> None:
    """Called by perf.measure / perf.compare: the last measurement of the test wins."""
    if _measured is not None:
        _measured[:] = list(calls)


def profiler_busy() -> bool:
    """Whether a ``torch.profiler`` (autograd profiler) session is running in this process."""
    import torch

    return bool(torch.autograd._profiler_enabled())


def trace_filename(nodeid: str, reason: str, tag: str = "") -> str:
    """``tests/x.py::test_a[cuda:0]`` -> ``failed__tests_x.py__test_a_cuda_0_.json``."""
    stem = _UNSAFE.sub("_", nodeid.replace("::", "__").replace("/", "_"))
    stem = f"{reason}__{stem}"[:MAX_STEM]
    return f"{stem}{'_' + tag if tag else ''}.json"


def profiler_activities(cuda_available: bool) -> list[Any]:
    """CPU always; CUDA kernels too where CUDA is available."""
    from torch.profiler import ProfilerActivity

    acts = [ProfilerActivity.CPU]
    if cuda_available:
        acts.append(ProfilerActivity.CUDA)
    return acts


def _sync_cuda() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)


def trace_call(
    fn: Callable[[], object],
    path: Path,
    *,
    nodeid: str = "",
    reason: str = "failed",
    what: str = "the whole test",
    max_events: int | None = None,
    max_bytes: int | None = None,
) -> TraceResult:
    """Run ``fn()`` once under ``torch.profiler`` and write its Chrome trace to ``path``.

    Any exception of ``fn`` is caught and reported in the result (the trace is written
    either way); CUDA devices in use are drained before the profiler stops, so kernels still
    queued are in the trace. Raises :class:`ProfilerBusy` (before running anything) when a
    profiler session is already running, :class:`NotTraced` in a CUDA rehearsal. The trace
    is capped (module docstring; the caps default to :data:`MAX_EVENTS` / :data:`MAX_BYTES`
    as they are at the call).
    """
    import torch
    from torch.profiler import profile

    max_events = MAX_EVENTS if max_events is None else max_events
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    if profiler_busy():
        raise ProfilerBusy("a torch.profiler session is already running (nested ones fail)")
    cuda = torch.cuda.is_available()
    if cuda and rehearse.active():
        # Starting CUDA activity is a real CUDA call: the rehearsal would stop it half-way,
        # leaving a profiler session running that fails every later one in the process.
        raise NotTraced(
            "CUDA rehearsal: torch.profiler's CUDA activity is a real CUDA call; only a GPU traces"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    err: str | None = None
    t0 = time.perf_counter()
    with profile(activities=profiler_activities(cuda)) as prof:
        try:
            fn()
        except BaseException as e:  # the test's own failure, or pytest's outcome exceptions
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
        finally:
            _sync_cuda()
    dt = time.perf_counter() - t0
    events = prof.events()
    total = len(events)
    limit = max_events
    if total <= max_events:
        prof.export_chrome_trace(str(path))
        size = path.stat().st_size
        if size <= max_bytes:
            return TraceResult(path, nodeid, reason, err, dt, what, False, total, total)
        limit = max(1, int(total * max_bytes / size * 0.9))
    kept = write_truncated(events, path, limit, total, max_events=max_events, max_bytes=max_bytes)
    return TraceResult(path, nodeid, reason, err, dt, what, True, kept, total)


def trace_measured(
    calls: Sequence[MeasuredCall], path: Path, *, nodeid: str = "", reason: str = "failed"
) -> TraceResult:
    """Trace one call of each measured callable, each inside a ``perf: <label>`` range."""
    from torch.profiler import record_function

    def run() -> None:
        for c in calls:
            with record_function(f"perf: {c.label} (one call, {c.device})"):
                c.fn()
            _sync_cuda()

    what = "one call of " + ", ".join(c.label for c in calls)
    return trace_call(run, path, nodeid=nodeid, reason=reason, what=what)


def chrome_events(events: Iterable[Any], limit: int) -> list[dict[str, Any]]:
    """Chrome-trace complete events (``ph: X``) for the first ``limit`` profiler events in
    time order: host events on the process's host row, device records per device and
    stream. ``events`` are ``FunctionEvent``-like: name, time_range, thread, device_type,
    device_index, and where known activity_type / device_resource_id."""
    from torch.autograd import DeviceType

    evs = sorted(events, key=lambda e: (e.time_range.start, e.time_range.end))[: max(0, limit)]
    out: list[dict[str, Any]] = []
    for e in evs:
        on_device = getattr(e, "device_type", DeviceType.CPU) != DeviceType.CPU
        cat = getattr(e, "activity_type", None) or ("kernel" if on_device else "cpu_op")
        out.append(
            {
                "ph": "X",
                "cat": cat,
                "name": str(e.name),
                "ts": float(e.time_range.start),
                "dur": max(0.0, float(e.time_range.end - e.time_range.start)),
                "pid": f"device {e.device_index}" if on_device else "host",
                "tid": getattr(e, "device_resource_id", e.thread) if on_device else e.thread,
            }
        )
    return out


def write_truncated(
    events: Sequence[Any],
    path: Path,
    limit: int,
    total: int,
    *,
    max_events: int = MAX_EVENTS,
    max_bytes: int = MAX_BYTES,
) -> int:
    """Write the first ``limit`` events as a Chrome trace that says it was truncated; returns
    the number of events kept."""
    body = chrome_events(events, limit)
    note = (
        f"perf: trace truncated: kept the first {len(body)} of {total} profiler events "
        f"(caps: {max_events} events, {max_bytes} bytes)"
    )
    ts = body[0]["ts"] if body else 0.0
    marker = {"ph": "i", "s": "g", "name": note, "ts": ts, "pid": "host", "tid": 0}
    doc = {
        # first, so that a reader of the file's head knows (truncation_of)
        "perf_truncated": {
            "kept_events": len(body),
            "total_events": total,
            "max_events": max_events,
            "max_bytes": max_bytes,
            "note": note,
        },
        "traceEvents": [marker, *body],
        "displayTimeUnit": "ms",
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    return len(body)


_TRUNCATED = re.compile(r'^\{"perf_truncated": \{"kept_events": (\d+), "total_events": (\d+)')


def truncation_of(path: Path) -> tuple[int, int] | None:
    """(kept, total) events when ``path`` is a trace :func:`write_truncated` wrote; None for a
    complete trace. Reads the file's first bytes only (traces can be tens of MB)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            head = fh.read(256)
    except OSError:
        return None
    m = _TRUNCATED.match(head)
    return (int(m.group(1)), int(m.group(2))) if m else None


def traces_since(directory: Path, t0: float) -> list[Path]:
    """Trace files in ``directory`` written at or after ``t0`` (e.g. by re-measuring
    children, whose reports never reach this process), oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.glob("*.json") if p.stat().st_mtime >= t0]
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))


def markdown_section(traces: Iterable[Path], report_dir: Path | None) -> str:
    """A Markdown section linking each trace, relative to the report's directory."""
    items = list(traces)
    if not items:
        return ""
    import os

    lines = [
        "",
        "## Traces of failing / suspect timing tests",
        "",
        "After each test's timed run, one call of each function it measured (or the whole "
        "test, where it measured nothing through perf) was re-run under `torch.profiler`; "
        "the samples were not profiled. Open a trace in https://ui.perfetto.dev or "
        "`chrome://tracing`.",
        "",
    ]
    for p in items:
        target = os.path.relpath(p, report_dir) if report_dir is not None else str(p)
        cut = truncation_of(p)
        note = f" (truncated: the first {cut[0]} of {cut[1]} events)" if cut else ""
        lines.append(f"- [{p.name}]({Path(target).as_posix()}){note}")
    return "\n".join(lines) + "\n"
