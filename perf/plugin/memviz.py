"""pytest glue: a memory picture of each failing memory test.

- A test marked ``perf_memory`` runs with the allocation history recorded (stack frames per
  allocation: the ``sim`` allocator model, or ``torch.cuda.memory._record_memory_history``).
- When such a test fails, or any test on ``sim`` / ``cuda`` that recorded a ``bytes`` metric
  fails, or it runs in a gate's re-measuring child (a suspect), the snapshot of the device is
  written as ``memory__<test>.pickle`` (pytorch.org/memory_viz reads it), ``.html``
  (``torch.cuda._memory_viz.trace_plot``: needs internet) and, with matplotlib, ``.svg`` /
  ``.png`` (:mod:`perf.report.memory_picture`: open offline) into ``--perf-trace-dir`` (else
  pytest's cache folder ``.pytest_cache/d/perf-memviz``; a re-measuring child writes to its
  parent's: :func:`perf.plugin.options.memviz_dir`). The files are listed at the end of the
  session and linked from ``--perf-report``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from perf.plugin.core import perf_device_of
from perf.plugin.metrics import item_metrics
from perf.plugin.options import memviz_dir

PERF_MEMORY = "perf_memory"
_WRITTEN_KEY = pytest.StashKey[list[Path]]()
_NO_PICTURE_KEY = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{PERF_MEMORY}(device=None): record the allocation history (stack frames) while the "
        "test runs; a failure leaves a memory snapshot (memory_viz pickle + HTML)",
    )
    config.stash[_WRITTEN_KEY] = []


def _device_of(item: pytest.Item) -> str | None:
    m = item.get_closest_marker(PERF_MEMORY)
    if m is not None and m.kwargs.get("device"):
        return str(m.kwargs["device"])
    name = perf_device_of(item)
    if name is not None and (name == "sim" or name.startswith("cuda")):
        return name
    if m is not None:
        import torch

        return "cuda:0" if torch.cuda.is_available() else "sim"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    device = _device_of(item) if item.get_closest_marker(PERF_MEMORY) else None
    if device is None:
        return (yield)
    from perf.instruments.memviz import recording

    with recording(device):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    if rep.when != "call":
        return rep
    marked = item.get_closest_marker(PERF_MEMORY) is not None
    device = _device_of(item)
    try:
        if device is not None and _wanted(item, rep, marked):
            _write(item, device)
    finally:
        if marked and device is not None:
            from perf.instruments.memviz import stop_recording

            stop_recording(device)
    return rep


def _wanted(item: pytest.Item, rep: pytest.TestReport, marked: bool) -> bool:
    child = bool(item.config.getoption("--perf-child-out", None))
    if not (rep.failed or child):
        return False
    return marked or any(m.get("kind") == "bytes" for m in item_metrics(item))


def _write(item: pytest.Item, device: str) -> None:
    from perf.instruments.memviz import memory_snapshot, write_memviz
    from perf.instruments.trace import trace_filename

    config = item.config
    stem = trace_filename(item.nodeid, "memory").removesuffix(".json")
    snapshot = memory_snapshot(device)
    paths = write_memviz(snapshot, memviz_dir(config) / stem)
    config.stash[_WRITTEN_KEY].extend(paths)
    config.stash[_WRITTEN_KEY].extend(_picture(item, snapshot, memviz_dir(config) / stem))


def _picture(item: pytest.Item, snapshot: dict[str, Any], base: Path) -> list[Path]:
    """The offline SVG / PNG of the timeline (:mod:`perf.report.memory_picture`), leak sites
    (``sites`` of the test's bytes metrics) highlighted; none without matplotlib (said once
    at the end of the session)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        item.config.stash[_NO_PICTURE_KEY] = (
            "no offline memory picture (SVG/PNG): matplotlib is not installed; "
            "pip install 'pytest-torch-perf[plots]'"
        )
        return []
    from perf.report.memory_picture import draw, timeline

    leaks = [
        site
        for m in item_metrics(item)
        if m.get("kind") == "bytes"
        for site in ((m.get("extra") or {}).get("sites") or {})
    ]
    try:
        return draw(timeline(snapshot, leak_sites=leaks), base, title=item.nodeid)
    except Exception as e:  # a picture is a courtesy: never the reason a session breaks
        item.config.stash[_NO_PICTURE_KEY] = (
            f"no offline memory picture for {item.nodeid}: {type(e).__name__}: {e} "
            "(the pickle and HTML were written)"
        )
        return []


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    written = config.stash.get(_WRITTEN_KEY, [])
    if not written:
        return
    terminalreporter.section("perf memory snapshots")
    for p in written:
        terminalreporter.write_line(f"written: {p}")
    if config.stash.get(_NO_PICTURE_KEY, ""):
        from perf.report.text import terminal_line

        terminalreporter.write_line(terminal_line(config.stash[_NO_PICTURE_KEY]))
    report = config.getoption("--perf-report", None)
    if report and not hasattr(config, "workerinput"):
        rp = Path(report)
        rp.parent.mkdir(parents=True, exist_ok=True)
        with open(rp, "a", encoding="utf-8") as fh:
            fh.write("\n### Memory snapshots of failing memory tests\n\n")
            for p in written:
                fh.write(f"- [{p.name}]({p.resolve().as_uri()})\n")
            fh.write(f"\n(written {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
