"""A failing memory test leaves a snapshot that PyTorch's own memory-viz reader opens."""

from __future__ import annotations

import pickle

import pytest

pytest_plugins = ["pytester"]

FAILING = """
import torch, perf

keep = []

@pytest.mark.perf_memory(device="sim")
def test_leaky():
    d = perf.simulated_device()
    for _ in range(3):
        keep.append(torch.ones(1000, device=d))  # LEAK
    assert torch.accelerator.memory_allocated() == 0, "leaked"

def test_passing_memory_test_writes_nothing(perf_metrics):
    perf_metrics.record("x_bytes", 1, "bytes")
"""


def test_failing_memory_test_leaves_a_snapshot_pytorch_reads(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    from torch.cuda import _memory_viz

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # sim needs a CPU-only child

    pytester.makepyfile(test_leak="import pytest\n" + FAILING)
    trace_dir = pytester.path / "traces"
    res = pytester.runpytest_subprocess(
        "-p", "no:xdist", "-p", "no:cacheprovider", f"--perf-trace-dir={trace_dir}"
    )
    res.assert_outcomes(passed=1, failed=1)
    res.stdout.fnmatch_lines(["*perf memory snapshots*", "*memory__test_leak.py__test_leaky*"])
    pickles = sorted(trace_dir.glob("memory__*.pickle"))
    assert [p.name for p in pickles] == ["memory__test_leak.py__test_leaky.pickle"]
    assert (trace_dir / "memory__test_leak.py__test_leaky.html").is_file()
    snap = pickle.loads(pickles[0].read_bytes())
    summary = _memory_viz.segsum(snap)
    # 3 x 4000 B requested (segsum counts requested bytes) in one 2 MiB small segment
    assert "total_reserved: 2.0MiB" in summary and "total_allocated: 11.7KiB" in summary
    trace = _memory_viz.trace(snap)
    assert trace.count("= a[") == 3  # three allocations in the history
    frames = [
        f for seg in snap["segments"] for b in seg["blocks"] if b["frames"] for f in b["frames"]
    ]
    assert any(f["filename"].endswith("test_leak.py") and f["name"] == "test_leaky" for f in frames)


def test_cuda_recording_leaves_a_users_recording_running(monkeypatch: pytest.MonkeyPatch):
    """The failure-snapshot recording on CUDA (faked: the calls are CUDA-only) starts one only
    where none runs, and stops only its own."""
    import torch

    from perf.instruments import memviz

    state = {"on": True}
    calls: list[dict] = []

    def record(**kw):
        calls.append(kw)
        state["on"] = kw.get("enabled", "all") is not None

    monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", lambda: state["on"], raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record)
    with memviz.recording("cuda:0"):
        pass
    memviz.stop_recording("cuda:0")
    assert calls == [] and state["on"]  # the user's recording: untouched
    state["on"] = False
    with memviz.recording("cuda:0"):
        assert state["on"]
    memviz.stop_recording("cuda:0")
    assert calls == [{"max_entries": 100_000, "stacks": "python"}, {"enabled": None}]
    assert not state["on"]
