"""``--perf-trace-dir``, issue 27 item 4: a trace holds one call of the measured function, never
nests a profiler, is capped in size, and only ``perf_``-marked tests are traced.

Real torch.profiler on the CPU; pytester runs in-process (see test_trace.py for what that
needs) except where the inner run would leave state in this process.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

import perf
from perf.instruments import trace

pytestmark = [
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.usefixtures("torch_profiler_loaded"),
]


def _doc(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


MEASURED = """
import pytest, torch, perf

@pytest.mark.perf_timing
def test_compare_fails(perf_metrics):
    x = torch.randn(32, 32)

    def slow():
        return (x @ x).tanh()

    def fast():
        return x.relu()

    for _ in range(50):  # the test's own loop: must not be in the trace
        x.sigmoid()
    perf.compare(slow, fast, device="cpu", pairs=8, min_sample_time_s=0.001,
                 labels=("slow", "fast"))
    assert False, "slow is slower"

@pytest.mark.timing
def test_projects_own_timing_marker(perf_metrics):
    assert False, "the project's test, not perf's"
"""


@pytest.mark.usefixtures("writes_a_trace")
def test_trace_holds_one_call_of_each_measured_function(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    timing: the project's own marker\n")
    pytester.makepyfile(test_mod=MEASURED)
    r = pytester.runpytest("--perf-devices", "cpu", "--perf-trace-dir", "t")
    r.assert_outcomes(failed=2)
    files = sorted(p.name for p in (pytester.path / "t").iterdir())
    # the project's `timing` marker is not perf's: that test is not traced
    assert files == ["failed__test_mod.py__test_compare_fails.json"]
    events = _doc(pytester.path / "t" / files[0])["traceEvents"]
    names = [e.get("name") for e in events]
    assert any(str(n).startswith("perf: slow (one call, cpu)") for n in names), names
    assert any(str(n).startswith("perf: fast (one call, cpu)") for n in names), names
    assert names.count("aten::mm") == 1 and names.count("aten::tanh") == 1
    assert "aten::sigmoid" not in names  # the test's own loop was not re-run
    r.stdout.fnmatch_lines(
        [
            "*trace of test_mod.py::test_compare_fails (failed; one call of slow, fast; "
            "re-run passed*"
        ]
    )


def test_measure_keeps_nothing_unless_a_trace_is_armed() -> None:
    assert trace.disarm() == []
    perf.measure(lambda: None, samples=1, number=1, warmup=0)
    assert trace.disarm() == []  # a library user's closures are never kept
    trace.arm()
    try:
        perf.measure(lambda: None, samples=1, number=1, warmup=0, label="first")
        perf.measure(lambda: None, samples=1, number=1, warmup=0, label="last")
    finally:
        got = trace.disarm()
    assert [c.label for c in got] == ["last"] and got[0].device == "cpu"
    assert trace.disarm() == []


def test_trace_call_inside_a_running_profiler_raises_before_running(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    ran = []
    with profile(activities=[ProfilerActivity.CPU]), pytest.raises(trace.ProfilerBusy):
        trace.trace_call(lambda: ran.append(1), tmp_path / "t.json")
    assert ran == [] and not (tmp_path / "t.json").exists()


def test_a_busy_profiler_is_a_note_not_a_crash(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_busy="""
        import pytest, torch
        from torch.profiler import ProfilerActivity, profile

        _p = profile(activities=[ProfilerActivity.CPU])

        @pytest.mark.perf_timing
        def test_fails_while_profiling():
            _p.__enter__()  # a session left running by the test
            assert False, "slow"
        """
    )
    # a subprocess: the test leaves its profiler session running
    r = pytester.runpytest_subprocess("--perf-devices", "cpu", "--perf-trace-dir", "t")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*not traced (a torch.profiler session is already running*"])
    assert not list((pytester.path / "t").glob("*.json"))


def test_a_cuda_rehearsal_notes_not_traced_and_leaves_no_profiler_running(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpu.yml's suite step traces failing timing tests; rehearsed, the profiler's CUDA
    activity stopped half-started and left a session running, so every later trace in the
    process failed as "already running". Now: a note, nothing started, the next test runs."""
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    pytester.makepyfile(
        test_mod="""
        import pytest
        from perf.instruments.trace import profiler_busy

        @pytest.mark.perf_timing
        def test_a_fails():
            assert False, "slow"

        def test_b_no_profiler_left_running():
            assert not profiler_busy()
        """
    )
    r = pytester.runpytest_subprocess(
        "--perf-rehearse-cuda=1", "--perf-devices", "cpu",
        "--perf-trace-dir", "t",
    )  # fmt: skip
    r.assert_outcomes(failed=1, passed=1)
    r.stdout.fnmatch_lines(
        ["*not traced (CUDA rehearsal: torch.profiler's CUDA activity is a real CUDA call*"]
    )
    assert not list((pytester.path / "t").glob("*.json"))


def _loop() -> None:
    x = torch.ones(4)
    for _ in range(200):
        x = x.add(1)


@pytest.mark.usefixtures("writes_a_trace")
def test_a_trace_over_the_event_cap_is_truncated_and_says_so(tmp_path: Path) -> None:
    res = trace.trace_call(_loop, tmp_path / "t.json", max_events=50)
    assert res.truncated and res.kept_events == 50 and res.total_events > 200
    doc = _doc(res.path)
    assert doc["perf_truncated"]["kept_events"] == 50
    assert doc["perf_truncated"]["total_events"] == res.total_events
    evs = doc["traceEvents"]
    assert len(evs) == 51 and evs[0]["name"].startswith("perf: trace truncated: kept the first 50")
    assert [e["ts"] for e in evs[1:]] == sorted(e["ts"] for e in evs[1:])
    # the report's link says so too (read from the file's head)
    assert trace.truncation_of(res.path) == (50, res.total_events)
    md = trace.markdown_section([res.path], tmp_path)
    assert f"- [t.json](t.json) (truncated: the first 50 of {res.total_events} events)" in md


@pytest.mark.usefixtures("writes_a_trace")
def test_a_truncated_trace_is_said_in_the_terminal_and_the_report(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest("import perf.instruments.trace as t\nt.MAX_EVENTS = 40\n")
    pytester.makepyfile(
        test_long="""
        import pytest, torch

        @pytest.mark.perf_timing
        def test_long_loop_fails():
            x = torch.ones(4)
            for _ in range(300):
                x = x.add(1)
            assert False, "slow"
        """
    )
    # a subprocess: its conftest lowers the cap of the module this process shares
    r = pytester.runpytest_subprocess(
        "--perf-devices", "cpu", "--perf-trace-dir", "t", "--perf-report", "r.md"
    )
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(
        [
            "*trace of test_long.py::test_long_loop_fails (failed; the whole "
            "test; *TRUNCATED: kept 40 of * events)*"
        ]
    )
    md = (pytester.path / "r.md").read_text(encoding="utf-8")
    assert "failed__test_long.py__test_long_loop_fails.json) (truncated: the first 40 of" in md


@pytest.mark.usefixtures("writes_a_trace")
def test_a_trace_over_the_byte_cap_is_truncated(tmp_path: Path) -> None:
    full = trace.trace_call(_loop, tmp_path / "full.json")
    assert not full.truncated and "perf_truncated" not in _doc(full.path)
    assert trace.truncation_of(full.path) is None
    assert "truncated" not in trace.markdown_section([full.path], tmp_path)
    size = full.path.stat().st_size
    res = trace.trace_call(_loop, tmp_path / "t.json", max_bytes=size // 4)
    assert res.truncated and 0 < res.kept_events < res.total_events
    assert res.path.stat().st_size <= size // 4


def test_chrome_events_put_device_records_on_their_device_and_stream() -> None:
    def ev(name, start, end, dtype, index, act, stream=7):
        return SimpleNamespace(
            name=name,
            time_range=SimpleNamespace(start=start, end=end),
            thread=1,
            device_type=dtype,
            device_index=index,
            activity_type=act,
            device_resource_id=stream,
        )

    out = trace.chrome_events(
        [
            ev("gemm", 5.0, 9.0, DeviceType.CUDA, 1, "kernel"),
            ev("aten::mm", 1.0, 6.0, DeviceType.CPU, 4242, "cpu_op"),
            ev("late", 20.0, 21.0, DeviceType.CPU, 4242, "cpu_op"),
        ],
        limit=2,
    )
    assert [(e["name"], e["pid"], e["tid"], e["cat"]) for e in out] == [
        ("aten::mm", "host", 1, "cpu_op"),
        ("gemm", "device 1", 7, "kernel"),
    ]
    assert out[1]["dur"] == 4.0
