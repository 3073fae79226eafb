"""Terminal and Markdown gate reports, and the plots (matplotlib, files only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _runs import metric, run, timed

from perf.gate import compare as g
from perf.gate.verdict import GateResult
from perf.report import plots
from perf.report.text import (
    format_value,
    gate_markdown,
    gate_table,
    md_code,
    md_text,
    metrics_table,
    terminal_line,
)

T = "t.py::test_a"


def _result() -> GateResult:
    base = run(
        {
            T: [metric("syncs", 10, "syncs"), timed("step_s", 1e-3), metric("act", 2**20, "bytes")],
            "t.py::test_gone": [metric("ops", 5, "ops")],
        }
    )
    cur = run(
        {
            T: [
                metric("syncs", 20, "syncs"),
                timed("step_s", 1e-3, seed=5),
                metric("act", 2**19, "bytes"),
            ],
            "t.py::test_new": [metric("ops", 5, "ops")],
        }
    )
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


def test_a_count_that_was_zero_has_no_ratio_but_says_from_zero() -> None:
    base = run({T: [metric("syncs", 0, "syncs")]})
    cur = run({T: [metric("syncs", 50, "syncs")]})
    row = next(line for line in gate_table(g.compare_runs(base, cur)) if "syncs" in line)
    assert "from 0" in row and "inf" not in row, row


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
    assert metrics_table({T: {"outcome": "passed", "metrics": [metric("syncs", 3, "syncs")]}}) == [
        f"{T}  syncs  3 syncs"
    ]


def _sized_run() -> object:
    tests = {
        f"t.py::test_speed[cpu-n{n}]": [metric("speedup", n / 512, "ratio")]
        for n in (64, 512, 2048)
    }
    tests.update(
        {f"t.py::test_mem[bs{bs}]": [metric("act", 1000 * bs + 50, "bytes")] for bs in (1, 2, 4, 8)}
    )
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


# -- untrusted strings from stored runs, escaped per sink (issue 8, item 6) -----------------

EVIL_ID = "t.py::test_x[\x1b[2J\x1b[31m\r\n::error::pwned\u202e]"
EVIL_NAME = "[click](https://evil.example)<img src=x onerror=alert(1)>`|x"


def _evil_result() -> GateResult:
    base = run(
        {
            EVIL_ID: [metric(EVIL_NAME.replace(" ", "_"), 10, "syncs")],
            "\n::add-mask::x": [metric("ops", 1, "ops")],
        }
    )
    cur = run({EVIL_ID: [metric(EVIL_NAME.replace(" ", "_"), 11, "syncs")]})
    return g.compare_runs(base, cur)


def test_terminal_output_escapes_controls_and_workflow_commands() -> None:
    lines = gate_table(_evil_result(), verbose=True)
    lines += metrics_table(
        {EVIL_ID: {"outcome": "passed", "metrics": [metric("syncs", 1, "syncs")]}}
    )
    text = "\n".join(lines)
    assert "\\x1b[2J" in text and "\\x0d\\x0a" in text and "\\u202e" in text  # shown, inert
    for line in lines:
        assert not any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or c == "\u202e" for c in line)
        assert not line.lstrip().startswith("::"), line
    assert terminal_line("::set-output name=x::y") == "\\x3a:set-output name=x::y"
    assert terminal_line("  tests/a.py::test_b") == "  tests/a.py::test_b"  # ids stay readable


def test_markdown_escapes_links_images_html_and_pipes() -> None:
    md = gate_markdown(_evil_result(), error=f"bad unit {EVIL_NAME!r} in {EVIL_ID}")
    assert "\x1b" not in md and "\r" not in md and "\u202e" not in md
    outside = _outside_code_spans(md)
    assert "](" not in outside and "![" not in outside
    for line in outside.splitlines():
        body = line.removeprefix("> ")  # our own blockquote
        assert all(body[i - 1] == "\\" for i, c in enumerate(body) if c in "<>[]`"), line
    assert any("<img" in span for span in _code_spans(md))  # shown literally, in a code span
    for line in md.splitlines():
        assert not line.startswith("::")
        if line.startswith("| ") and "syncs" in line:  # the regression row: 6 cells
            assert len(_unescaped_pipes(line)) == 7, line


def _code_spans(md: str) -> list[str]:
    import re

    return [m.group(2) for m in re.finditer(r"(?<!\\)(`+)(.*?)\1", md)]


def _outside_code_spans(md: str) -> str:
    import re

    return re.sub(r"(?<!\\)(`+).*?\1", "", md)


def _unescaped_pipes(line: str) -> list[int]:
    return [i for i, c in enumerate(line) if c == "|" and (i == 0 or line[i - 1] != "\\")]


def test_md_code_fence_cannot_be_closed_from_inside() -> None:
    assert md_code("a`b") == "``a`b``"
    assert md_code("``x") == "``` ``x ```"
    assert md_code("a|b", in_table=True) == "`a\\|b`"
    assert md_text("[x](y) <b> *e* $m$") == "\\[x\\]\\(y\\) \\<b\\> \\*e\\* \\$m\\$"


def test_plots_without_matplotlib_name_the_distribution() -> None:
    """``perf`` on the package index is another project: the hint names ours."""
    code = (
        "import sys\n"
        "sys.modules['matplotlib'] = None  # as if not installed\n"
        "from perf.report import plots\n"
        "try:\n"
        "    plots._pyplot()\n"
        "except plots.PlotError as e:\n"
        "    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'pytest-torch-perf[plots]'" in r.stdout, r.stdout + r.stderr
    assert "pip install '.[plots]'" in r.stdout
