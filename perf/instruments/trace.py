"""Chrome traces of failing (or gate-suspect) timing tests: the evidence a red timing test
needs.

A timing test that failed is re-run once under ``torch.profiler`` *after* its timed run, so
the trace never perturbs the samples that decided the verdict; the trace shows where the
time of the re-run went (ops, kernels, gaps, syncs). Open it in https://ui.perfetto.dev or
``chrome://tracing``. Pure logic here (no pytest); :mod:`perf.plugin.trace` is the glue.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: File names stay short and portable (artifact uploads reject some characters).
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_STEM = 120


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
    fn: Callable[[], object], path: Path, *, nodeid: str = "", reason: str = "failed"
) -> TraceResult:
    """Run ``fn()`` once under ``torch.profiler`` and write its Chrome trace to ``path``.

    Any exception of ``fn`` is caught and reported in the result (the trace is written
    either way); CUDA devices in use are drained before the profiler stops, so kernels still
    queued are in the trace.
    """
    import torch
    from torch.profiler import profile

    path.parent.mkdir(parents=True, exist_ok=True)
    err: str | None = None
    t0 = time.perf_counter()
    with profile(activities=profiler_activities(torch.cuda.is_available())) as prof:
        try:
            fn()
        except BaseException as e:  # the test's own failure, or pytest's outcome exceptions
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
        finally:
            _sync_cuda()
    dt = time.perf_counter() - t0
    prof.export_chrome_trace(str(path))
    return TraceResult(path, nodeid, reason, err, dt)


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
        "Each test was re-run once under `torch.profiler` after its timed run (the samples "
        "were not profiled). Open a trace in https://ui.perfetto.dev or `chrome://tracing`.",
        "",
    ]
    for p in items:
        target = os.path.relpath(p, report_dir) if report_dir is not None else str(p)
        lines.append(f"- [{p.name}]({Path(target).as_posix()})")
    return "\n".join(lines) + "\n"
