"""``--perf-trace-dir``: a Chrome trace of each failing timing test, linked from the report.

Driven through pytester on the CPU: real torch.profiler, real pytest; the traces are read
back as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perf.instruments.trace import markdown_section, trace_call, trace_filename, traces_since

pytestmark = [
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.usefixtures("torch_profiler_loaded"),
]

# In-process runs: torch modules that the profiler imports lazily register operator libraries
# once per process, and pytester's in-process runs restore sys.modules afterwards, so a second
# import would fail; conftest's ``torch_profiler_loaded`` imports them once, before any run.

TESTS = """
import pytest, torch

@pytest.mark.perf_timing
def test_slow_fails(perf_metrics):
    x = torch.randn(64, 64)
    for _ in range(3):
        x = (x @ x).tanh()
    perf_metrics.record("step_s", 0.5, "s")
    assert False, "timing regression"

@pytest.mark.perf_timing
def test_fast_passes(perf_metrics):
    perf_metrics.record("step_s", 0.1, "s")

def test_counter_fails():
    assert False
"""


def _events(path: Path) -> list[dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return data["traceEvents"]


@pytest.mark.usefixtures("writes_a_trace")
def test_failing_timing_test_gets_a_valid_trace_linked_from_the_report(
    pytester: pytest.Pytester,
) -> None:
    """One run: only the failing *timing* test is traced (not the passing one, not the
    failing counter test), the trace holds the re-run's own ops, the re-run records no
    metric twice, and the report links the trace."""
    pytester.makepyfile(test_mod=TESTS)
    pytester.makeconftest(
        """
        def pytest_runtest_logreport(report):
            if report.when == "teardown" and "slow" in report.nodeid:
                names = [m["name"] for m in getattr(report, "perf_metrics", [])]
                print("METRICS", names)
        """
    )
    result = pytester.runpytest(
        "-s",
        "--perf-devices",
        "cpu",
        "--perf-trace-dir",
        "out/traces",
        "--perf-report",
        "out/report.md",
    )
    result.assert_outcomes(passed=1, failed=2)
    traces = pytester.path / "out" / "traces"
    files = sorted(p.name for p in traces.iterdir())
    assert files == ["failed__test_mod.py__test_slow_fails.json"]
    names = {e.get("name") for e in _events(traces / files[0])}
    assert "aten::mm" in names and "aten::tanh" in names  # the re-run's own ops
    result.stdout.fnmatch_lines(
        [
            "*METRICS [[]'step_s'[]]",  # recorded once, though the test ran twice
            "*perf traces*",
            "*trace of test_mod.py::test_slow_fails (failed; the whole test; "
            "re-run ended with AssertionError: timing regression*",
        ]
    )
    text = (pytester.path / "out" / "report.md").read_text(encoding="utf-8")
    assert "## Traces of failing / suspect timing tests" in text
    assert "(traces/failed__test_mod.py__test_slow_fails.json)" in text


def test_without_the_option_nothing_is_traced(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mod=TESTS)
    result = pytester.runpytest("--perf-devices", "cpu")
    result.assert_outcomes(passed=1, failed=2)
    assert "perf traces" not in result.stdout.str()
    assert not list(pytester.path.rglob("failed__*.json"))


def test_trace_dir_that_is_a_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mod=TESTS)
    (pytester.path / "f").write_text("x")
    result = pytester.runpytest("--perf-trace-dir", "f")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perf-trace-dir f: exists and is not a directory*"])


@pytest.mark.usefixtures("writes_a_trace")
def test_trace_call_writes_json_and_reports_the_exception(tmp_path: Path) -> None:
    import torch

    def boom() -> None:
        torch.ones(4).add_(1)
        raise ValueError("bad\nsecond line")

    res = trace_call(boom, tmp_path / "sub" / "t.json", nodeid="n", reason="failed")
    assert res.rerun_error == "ValueError: bad"
    assert any(e.get("name") == "aten::add_" for e in _events(res.path))


def test_trace_filename_is_portable_and_bounded() -> None:
    name = trace_filename("tests/x.py::test_a[cuda:0-n64]", "failed")
    assert name == "failed__tests_x.py__test_a_cuda_0-n64_.json"
    assert len(trace_filename("t.py::" + "a" * 500, "suspect", "123")) <= 120 + len("_123.json")


def test_traces_since_and_markdown(tmp_path: Path) -> None:
    import os
    import time

    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text("{}")
    new.write_text("{}")
    t0 = time.time()
    os.utime(old, (t0 - 100, t0 - 100))
    os.utime(new, (t0 + 1, t0 + 1))
    assert traces_since(tmp_path, t0) == [new]
    assert traces_since(tmp_path / "missing", t0) == []
    md = markdown_section([new], tmp_path.parent)
    assert f"- [new.json]({tmp_path.name}/new.json)" in md
    assert markdown_section([], None) == ""


@pytest.mark.usefixtures("writes_a_trace")
def test_remeasuring_child_traces_every_timing_test_it_runs(pytester: pytest.Pytester) -> None:
    """The gate re-runs suspects in a child (``--perf-child-out``), which inherits
    ``--perf-trace-dir``: there every timing test is a suspect and is traced, pass or fail."""
    from perf.gate.remeasure import filter_args

    assert filter_args(["--perf-trace-dir", "d", "--perf-report", "r.md"]) == [
        "--perf-trace-dir",
        "d",
    ]
    pytester.makepyfile(test_mod=TESTS)
    result = pytester.runpytest(
        "--perf-devices",
        "cpu",
        "--perf-trace-dir",
        "t",
        "--perf-child-out",
        "run.json",
        "-k",
        "fast or counter",
    )
    result.assert_outcomes(passed=1, failed=1)
    files = [p.name for p in (pytester.path / "t").iterdir()]
    assert len(files) == 1 and files[0].startswith("suspect__test_mod.py__test_fast_passes_")
    assert isinstance(_events(pytester.path / "t" / files[0]), list)


@pytest.mark.parametrize("where", ["a_file/sub", "/proc/self"])
def test_an_unwritable_trace_dir_is_a_usage_error_at_start(
    pytester: pytest.Pytester, where: str
) -> None:
    """Checked before any test runs (exit 4), not at the first failure (an INTERNALERROR
    that lost the test's own failure, or a trace "written" that never was)."""
    pytester.makepyfile(test_mod=TESTS)
    (pytester.path / "a_file").write_text("not a folder")
    r = pytester.runpytest("-p", "no:cacheprovider", f"--perf-trace-dir={where}")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines([f"*--perf-trace-dir {where}: *"])
    assert "INTERNALERROR" not in r.stdout.str() + r.stderr.str()
    assert "passed" not in r.stdout.str()


@pytest.mark.usefixtures("writes_a_trace")
def test_a_trace_that_cannot_be_written_is_said_not_claimed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_gone="""
        import pathlib, shutil, pytest

        @pytest.mark.perf_timing
        def test_fails_after_the_folder_went(perf_metrics):
            shutil.rmtree("traces")
            pathlib.Path("traces").write_text("a file now")
            perf_metrics.record("step_s", 0.5, "s")
            assert False, "slow"
        """
    )
    r = pytester.runpytest("--perf-devices", "cpu", "--perf-trace-dir", "traces")
    r.assert_outcomes(failed=1)  # the test's own failure is kept
    r.stdout.fnmatch_lines(
        ["*trace of test_gone.py::test_fails_after_the_folder_went NOT written*"]
    )
    assert "INTERNALERROR" not in r.stdout.str()
