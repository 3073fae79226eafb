"""The gate end to end through pytest: save, compare, fail, report (pytester)."""

from __future__ import annotations

from pathlib import Path

import pytest

COUNTS = """
import os

def test_logging(perf_metrics):
    steps, every = 100, 10
    extra = int(os.environ.get("EXTRA_SYNC_EVERY_10", "0"))
    perf_metrics.record("syncs", steps // every * (1 + extra), unit="syncs")
    perf_metrics.record("activation_bytes", 4096, unit="bytes")
"""

# Sleep-bound, so CPU neighbours (other xdist workers) cannot fake or hide the 40%.
TIMED = """
import os, time
import perf

WORK_S = 0.002 * float(os.environ.get("WORK_FACTOR", "1"))

def test_step(perf_metrics):
    perf_metrics.record("step_time_s", perf.measure(lambda: time.sleep(WORK_S), number=1,
                                                    samples=12, warmup=1))
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    # Inside an outer xdist worker, pytest-benchmark would disable itself in the inner run.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


pytestmark = pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """In-process pytest; no reference workload (1-2 s per run on a busy box) unless asked.

    The busy-CPU check is off: under ``pytest -n 2`` the other worker is a CPU neighbour, and
    these tests are about the gate's mechanics (the check has its own tests in test_gate)."""
    extra = ("-o", "perf_busy_cpu_fraction=1")
    extra += () if "--perf-reference" in args else ("--perf-no-reference",)
    args = tuple(a for a in args if a != "--perf-reference")
    return pytester.runpytest("-p", "no:cacheprovider", *extra, *args)


def _stored(pytester: pytest.Pytester) -> list[Path]:
    return sorted((pytester.path / ".benchmarks" / "perf").rglob("*.json"))


def test_save_then_compare_unchanged_passes_repeatedly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_counts=COUNTS)
    _run(pytester, "--benchmark-autosave").assert_outcomes(passed=1)
    assert len(_stored(pytester)) == 1
    for _ in range(2):
        r = _run(pytester, "--benchmark-compare")
        r.assert_outcomes(passed=1)
        assert r.ret == 0
        r.stdout.fnmatch_lines(["*perf gate passed: 0 regressions, 0 improvements, 2 unchanged*"])


def test_save_and_compare_under_xdist(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_counts=COUNTS, test_more=COUNTS.replace("test_logging", "test_x"))
    _run(pytester, "--benchmark-save=serial").assert_outcomes(passed=2)
    # one xdist session both gates against the serial run and saves (controller only)
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--benchmark-compare",
                                      "--benchmark-save=xd")
    r.assert_outcomes(passed=2)
    assert r.ret == 0
    r.stdout.fnmatch_lines(["*perf gate passed: 0 regressions, 0 improvements, 4 unchanged*"])
    saved = _stored(pytester)
    assert [p.name for p in saved] == ["0001_serial.json", "0002_xd.json"]
    from perf.baseline import load

    run = load(saved[1])
    assert run.workers == 2 and len(run.tests) == 2
    assert run.reference == {}, "no reference workload under xdist"


def test_one_extra_sync_per_10_steps_fails_naming_metric_and_values(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_counts=COUNTS)
    _run(pytester, "--benchmark-autosave")
    monkeypatch.setenv("EXTRA_SYNC_EVERY_10", "1")
    r = _run(pytester, "--benchmark-compare")
    assert r.ret == 1
    r.stdout.fnmatch_lines([
        "*REGRESSIONS (1):*",
        "*test_counts.py::test_logging*syncs*10 syncs*20 syncs*2.000x*exact*",
        "*perf gate FAILED: 1 regressions*",
    ])


def test_improvement_passes_and_proposes_new_baseline(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_counts=COUNTS)
    monkeypatch.setenv("EXTRA_SYNC_EVERY_10", "1")
    _run(pytester, "--benchmark-autosave")
    monkeypatch.delenv("EXTRA_SYNC_EVERY_10")
    report = pytester.path / "out" / "perf.md"
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    r = _run(pytester, "--benchmark-compare", f"--perf-report={report}")
    assert r.ret == 0
    r.stdout.fnmatch_lines(["*improvements (1): update the baseline*",
                            "*syncs*20 syncs*10 syncs*"])
    md = report.read_text()
    assert "### Improvements" in md and "update the baseline" in md
    assert summary.read_text().strip() == md.strip()


def test_truncated_baseline_exits_nonzero_naming_file_untouched(
    pytester: pytest.Pytester
) -> None:
    pytester.makepyfile(test_counts=COUNTS)
    _run(pytester, "--benchmark-autosave")
    (path,) = _stored(pytester)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    before = path.read_bytes()
    r = _run(pytester, "--benchmark-compare")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stdout.fnmatch_lines([f"*ERROR: baseline /*{path.name}: truncated JSON*"])
    assert path.read_bytes() == before


def test_unknown_schema_exits_nonzero(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_counts=COUNTS)
    _run(pytester, "--benchmark-autosave")
    (path,) = _stored(pytester)
    path.write_text(path.read_text().replace('"schema_version": 2', '"schema_version": 7'))
    r = _run(pytester, "--benchmark-compare")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stdout.fnmatch_lines(["*unknown schema_version 7*"])


def test_missing_baseline_passes_with_message_unless_strict(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_counts=COUNTS)
    r = _run(pytester, "--benchmark-compare")
    assert r.ret == 0
    r.stdout.fnmatch_lines(["*no baseline to compare with: no stored perf run for machine*",
                            "*save one with --benchmark-autosave*"])
    r = _run(pytester, "--benchmark-compare", "--perf-strict")
    assert r.ret == 1


def test_cross_machine_refuses_timings_with_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_timed=TIMED, test_counts=COUNTS)
    _run(pytester, "--benchmark-autosave")
    (path,) = _stored(pytester)
    import json

    d = json.loads(path.read_text())
    d["run"]["fingerprint"]["cpu_model"] = "Some Other CPU"
    other = path.parent.parent / "Other-Machine" / "0001_other.json"
    other.parent.mkdir()
    other.write_text(json.dumps(d))
    r = _run(pytester, "--benchmark-compare=Other-Machine/1")
    assert r.ret == 0
    r.stdout.fnmatch_lines([
        "*not compared: 1 metrics*",
        "*timings not compared: machine fingerprint differs in cpu_model*Some Other CPU*",
        "*2 unchanged*",
    ])


@pytest.mark.perf_timing
def test_forty_percent_more_time_fails(pytester: pytest.Pytester,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_timed=TIMED)
    _run(pytester, "--benchmark-autosave")
    r = _run(pytester, "--benchmark-compare")
    assert r.ret == 0, r.stdout.str()
    monkeypatch.setenv("WORK_FACTOR", "1.4")
    r = _run(pytester, "--benchmark-compare")
    assert r.ret == 1, r.stdout.str()
    r.stdout.fnmatch_lines([
        "*REGRESSIONS (1):*",
        "*test_timed.py::test_step*step_time_s*2.* ms*2.* ms*1.[34]*x*10%*",
        "*confirmed by*re-measurement*",
        "*re-measured: test_timed.py::test_step*",
    ])
    # the re-measuring children neither saved nor gated: still only the one stored run
    assert len(_stored(pytester)) == 1


def test_remeasuring_child_inherits_options_but_never_saves(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suspect found in a run that also saves: the fresh-process child runs it with the
    user's options (here a -k filter that still selects it) and writes nothing to the store."""
    pytester.makepyfile(test_timed=TIMED)
    _run(pytester, "--benchmark-save=base")
    monkeypatch.setenv("WORK_FACTOR", "1.4")
    r = _run(pytester, "-k", "step", "--benchmark-compare", "--benchmark-save=pr")
    assert r.ret == 1, r.stdout.str()
    r.stdout.fnmatch_lines(["*re-measured: test_timed.py::test_step*"])
    assert [p.name for p in _stored(pytester)] == ["0001_base.json", "0002_pr.json"]


def test_benchmark_fixture_times_become_a_metric(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_b="def test_b(benchmark):\n    benchmark(lambda: sum(range(50)))\n")
    r = _run(pytester, "--benchmark-autosave", "-o", "perf_gate_benchmark=true",
             "--benchmark-max-time=0.05")
    assert r.ret == 0
    from perf.baseline import load

    (path,) = _stored(pytester)
    (m,) = load(path).tests["test_b.py::test_b"]["metrics"]
    assert m["name"] == "benchmark" and m["unit"] == "s"
    assert 5 <= len(m["samples"]) <= 500


def test_machine_info_gets_torch_versions(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_b="def test_b(benchmark):\n    benchmark(lambda: None)\n")
    _run(pytester, "--benchmark-json=out.json", "--benchmark-max-time=0.01",
         "-o", "perf_machine_info=true", "--perf-no-reference").assert_outcomes(passed=1)
    import json

    info = json.loads((pytester.path / "out.json").read_text())["machine_info"]
    import torch

    assert info["torch_version"] == torch.__version__
    assert {"cuda_version", "cudnn_version", "gpu_driver", "gpus"} <= set(info)


def test_cuda_benchmark_tests_get_the_synchronizing_timer(pytester: pytest.Pytester) -> None:
    """Only tests on perf's `device` fixture: a project's own "cuda" parameter is its own."""
    import torch

    pytester.makepyfile(test_b='''
import pytest

@pytest.mark.benchmark(min_rounds=3)
def test_perf_device(benchmark, device, request):
    mark = request.node.get_closest_marker("benchmark")
    timer = mark.kwargs.get("timer")
    if device.type == "cuda":
        assert timer.__name__ == "synchronizing_timer" and mark.kwargs["min_rounds"] == 3
    else:
        assert timer is None
    benchmark(lambda: None)

@pytest.mark.parametrize("dev", ["cuda:0", "cpu"])
@pytest.mark.benchmark(min_rounds=3)
def test_own_param(benchmark, dev, request):
    assert request.node.get_closest_marker("benchmark").kwargs.get("timer") is None
    benchmark(lambda: None)
''')
    n_dev = 1 + (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    _run(pytester, "--benchmark-max-time=0.01").assert_outcomes(passed=2 + n_dev)


def test_synchronizing_timer_reads_a_clock() -> None:
    from perf import plugin_gate

    assert isinstance(plugin_gate.synchronizing_timer(), float)


def test_nothing_to_save(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_p():\n    pass\n")
    r = _run(pytester, "--benchmark-autosave")
    assert r.ret == 0
    out = r.stdout.str()  # a run without perf metrics: perf says nothing
    assert "perf gate" not in out and "perf:" not in out and "perf metrics" not in out
    assert _stored(pytester) == []
