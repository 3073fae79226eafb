"""Terminal and Markdown gate reports, and the plots (matplotlib, files only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _runs import metric, run, timed

from perf import gate as g
from perf import plots
from perf.report import format_value, gate_markdown, gate_table, metrics_table

T = "t.py::test_a"


def _result() -> g.GateResult:
    base = run({T: [metric("syncs", 10, "syncs"), timed("step_s", 1e-3),
                    metric("act", 2**20, "bytes")],
                "t.py::test_gone": [metric("ops", 5, "ops")]})
    cur = run({T: [metric("syncs", 20, "syncs"), timed("step_s", 1e-3, seed=5),
                   metric("act", 2**19, "bytes")],
               "t.py::test_new": [metric("ops", 5, "ops")]})
    return g.compare_runs(base, cur)


def test_gate_table_lists_regressions_with_values_ratio_and_margin() -> None:
    lines = gate_table(_result())
    text = "\n".join(lines)
    assert "REGRESSIONS (1):" in text
    row = next(line for line in lines if "syncs" in line and T in line)
    for part in ("10 syncs", "20 syncs", "2.000x", "exact"):
        assert part in row
    assert "improvements (1): update the baseline" in text
    assert "512.00 KiB" in text
    assert "unchanged: 1 metrics" in text
    assert "t.py::test_gone ops" in text and "t.py::test_new ops" in text
    assert lines[-1].startswith("perf gate FAILED: 1 regressions, 1 improvements, 1 unchanged")
    assert any("step_s" in line for line in gate_table(_result(), verbose=True))


def test_markdown_report() -> None:
    md = gate_markdown(_result(), saved="x/0002_y.json")
    assert "❌ failed" in md
    assert "### Regressions" in md and "| `t.py::test_a` | `syncs` | 10 syncs | 20 syncs |" in md
    assert "### Improvements" in md and "### Missing" in md and "### New" in md
    assert "Saved this run as `x/0002_y.json`." in md
    assert "No baseline to compare with: nope" in gate_markdown(None, missing="nope")
    assert "was not modified" in gate_markdown(None, error="baseline f: truncated")


def test_existing_helpers_still_work() -> None:
    assert format_value(1536, "bytes") == "1.50 KiB"
    assert format_value(2.5e-3, "s") == "2.500 ms"
    assert metrics_table({T: {"outcome": "passed", "metrics": [metric("syncs", 3, "syncs")]}}) \
        == [f"{T}  syncs  3 syncs"]


def _sized_run() -> object:
    tests = {f"t.py::test_speed[cpu-n{n}]": [metric("speedup", n / 512, "ratio")]
             for n in (64, 512, 2048)}
    tests.update({f"t.py::test_mem[bs{bs}]": [metric("act", 1000 * bs + 50, "bytes")]
                  for bs in (1, 2, 4, 8)})
    return run(tests)


def test_plots_write_files(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    r = _sized_run()
    assert plots.series(r, "speedup") == [(64.0, 0.125), (512.0, 1.0), (2048.0, 4.0)]
    assert plots.speedup_vs_size(r, "speedup", tmp_path / "s.png").stat().st_size > 0
    assert plots.memory_vs_batch(r, "act", tmp_path / "m.png").stat().st_size > 0
    assert plots.history([r, r], "t.py::test_mem[bs1]", "act", tmp_path / "h.svg").exists()
    with pytest.raises(plots.PlotError, match="has 0 sized points"):
        plots.speedup_vs_size(r, "nope", tmp_path / "x.png")
