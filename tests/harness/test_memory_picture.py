"""The offline memory picture: the timeline from a memory snapshot (pure, no matplotlib) and
its SVG / PNG (matplotlib, the optional extra ``plots``), which reference nothing outside
themselves; a failing leak test leaves them beside the pickle, linked from the report."""

from __future__ import annotations

import re

import pytest
import torch
from _sim import SIM, needs_sim

from perf.instruments.leaks import memory_growth
from perf.instruments.memviz import memory_snapshot, recording, stop_recording
from perf.report.memory_picture import BEFORE, OTHER, draw, timeline

NO_MPL = "the SVG/PNG needs matplotlib (optional extra 'plots'), not installed here"


def _frames(line: int) -> list[dict]:
    return [{"filename": "/ws/train.py", "line": line, "name": "step"}]


def _site(frames) -> str:
    return f"train.py:{frames[0]['line']}" if frames else "<unknown>"


def _snapshot() -> dict:
    """A history that starts after 512 B were allocated (a block at 0x1) and one 2 MiB
    segment was reserved; 4 sites allocate, one block is freed."""
    trace = [
        {"action": "alloc", "addr": 16, "size": 1024, "frames": _frames(10)},
        {"action": "alloc", "addr": 32, "size": 4096, "frames": _frames(11)},
        {"action": "free_requested", "addr": 16, "size": 1024, "frames": _frames(10)},
        {"action": "free_completed", "addr": 16, "size": 1024, "frames": _frames(10)},
        {"action": "segment_alloc", "addr": 2**21, "size": 2**21, "frames": _frames(12)},
        {"action": "alloc", "addr": 2**21, "size": 512, "frames": _frames(12)},
        {"action": "alloc", "addr": 64, "size": 256, "frames": _frames(13)},
        {"action": "free_completed", "addr": 1, "size": 512, "frames": []},
    ]
    segments = [
        {"device": 0, "total_size": 2**21, "allocated_size": 4096 + 256},
        {"device": 0, "total_size": 2**21, "allocated_size": 512},
    ]
    return {"segments": segments, "device_traces": [trace]}


def test_timeline_from_a_snapshot_with_an_earlier_history():
    tl = timeline(_snapshot(), top=2, leak_sites=["train.py:13"], site_of=_site)
    assert tl.events == 8
    assert tl.allocated_bytes == (512, 1536, 5632, 5632, 4608, 4608, 5120, 5376, 4864)
    assert tl.reserved_bytes == (2**21,) * 5 + (2**22,) * 4
    names = [n for n, _ in tl.bands]
    # the two largest sites, then the leak site (shown although small), then the rest
    assert names == [BEFORE, "train.py:11", "train.py:10", "train.py:13", OTHER]
    for i, total in enumerate(tl.allocated_bytes):
        assert sum(series[i] for _, series in tl.bands) == total
    assert dict(tl.bands)[BEFORE][-1] == 0  # the earlier block was freed at the end
    assert tl.leak_sites == ("train.py:13",)
    assert tl.peak_allocated_bytes == 5632 and tl.peak_reserved_bytes == 2**22


@needs_sim
def test_timeline_of_a_real_leak_on_sim_names_the_leaking_line():
    keep: list[torch.Tensor] = []

    def step() -> None:
        x = torch.ones(256, device=SIM)  # freed every step
        keep.append(x[:64].clone())  # LEAK: kept

    with recording(SIM):
        g = memory_growth(step, SIM, steps=5)
        snap = memory_snapshot(SIM)
    stop_recording(SIM)
    (leak,) = g.sites
    tl = timeline(snap, leak_sites=[leak.site])
    assert leak.site in dict(tl.bands) and leak.site.endswith(
        f"test_memory_picture.py:{step.__code__.co_firstlineno + 2}"
    )
    assert tl.allocated_bytes[-1] == torch.accelerator.memory_allocated()
    leaked = dict(tl.bands)[leak.site]
    assert leaked[-1] >= 5 * 256  # 64 floats kept per measured step (and the warm-up's)
    keep.clear()


def test_draw_writes_an_svg_and_png_that_need_nothing_else(tmp_path):
    pytest.importorskip("matplotlib", reason=NO_MPL)
    tl = timeline(_snapshot(), top=2, leak_sites=["train.py:13"], site_of=_site)
    svg, png = draw(tl, tmp_path / "memory__t", title="t.py::test_x[\x1b[31m]")
    assert (svg.name, png.name) == ("memory__t.svg", "memory__t.png")
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "</svg>" in text
    hrefs = re.findall(r'(?:href|src)="([^"#][^"]*)"', text)
    assert hrefs == [], f"the SVG references outside files: {hrefs}"
    assert "@font-face" not in text and "<image" not in text  # text drawn as paths
    assert "\x1b" not in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


LEAKY = """
import pytest, torch, perf

keep = []

def step():
    keep.append(torch.ones(64, device=perf.simulated_device()))

@pytest.mark.perf_memory(device="sim")
def test_leaky(perf_metrics):
    g = perf.memory_growth(step, "sim", steps=3)
    perf_metrics.record("leak_bytes_per_step", g.growth_bytes_per_step, "bytes",
                        tolerance=0.0, sites=g.sites_extra)
    assert g.growth_bytes_per_step == 0, g.describe()
"""


def test_failing_leak_test_leaves_the_offline_picture_linked_from_the_report(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    pytest.importorskip("matplotlib", reason=NO_MPL)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # sim needs a CPU-only child
    pytester.makepyfile(test_leak=LEAKY)
    out = pytester.path / "traces"
    report = pytester.path / "perf.md"
    res = pytester.runpytest_subprocess(
        "-p", "no:xdist", "-p", "no:cacheprovider", f"--perf-trace-dir={out}",
        f"--perf-report={report}",
    )  # fmt: skip
    res.assert_outcomes(failed=1)
    stem = "memory__test_leak.py__test_leaky"
    assert sorted(p.name for p in out.iterdir()) == [
        f"{stem}.{ext}" for ext in ("html", "pickle", "png", "svg")
    ]
    res.stdout.fnmatch_lines([f"written: *{stem}.svg"])
    assert f"[{stem}.svg](file://" in report.read_text()
    # matplotlib keeps each text as a comment beside its glyph paths: the leak site is named
    assert "<!-- LEAK test_leak.py:6 -->" in (out / f"{stem}.svg").read_text()


def test_without_matplotlib_the_session_says_why_and_keeps_the_pickle(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    """matplotlib is an optional extra: where it cannot be imported (a stand-in package that
    raises ImportError comes first on the path) the pickle and HTML are written as before."""
    stub = pytester.path / "no_mpl" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('matplotlib hidden for this test')\n")
    monkeypatch.setenv("PYTHONPATH", str(stub.parent))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(test_leak=LEAKY)
    out = pytester.path / "traces"
    res = pytester.runpytest_subprocess(
        "-p", "no:xdist", "-p", "no:cacheprovider", f"--perf-trace-dir={out}"
    )  # fmt: skip
    res.assert_outcomes(failed=1)
    stem = "memory__test_leak.py__test_leaky"
    assert sorted(p.name for p in out.iterdir()) == [f"{stem}.html", f"{stem}.pickle"]
    res.stdout.fnmatch_lines(
        ["no offline memory picture (SVG/PNG): matplotlib is not installed; pip install *plots*"]
    )
