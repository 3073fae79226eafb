"""The gate end to end through pytest: save, compare, fail, report (pytester)."""

from __future__ import annotations

from pathlib import Path

import pytest

# Imported here, in the outer process: pytester's in-process runs drop modules they imported,
# and a second import of the simulated device would register its kernels with torch twice.
import perf.sim.device  # noqa: F401

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
    r = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "--benchmark-compare", "--benchmark-save=xd"
    )
    r.assert_outcomes(passed=2)
    assert r.ret == 0
    r.stdout.fnmatch_lines(["*perf gate passed: 0 regressions, 0 improvements, 4 unchanged*"])
    saved = _stored(pytester)
    assert [p.name for p in saved] == ["0001_serial.json", "0002_xd.json"]
    from perf.store.runs import load

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
    r.stdout.fnmatch_lines(
        [
            "*REGRESSIONS (1):*",
            "*test_counts.py::test_logging*syncs*10 syncs*20 syncs*2.000x*exact*",
            "*perf gate FAILED: 1 regressions*",
        ]
    )


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
    r.stdout.fnmatch_lines(["*improvements (1): update the baseline*", "*syncs*20 syncs*10 syncs*"])
    md = report.read_text()
    assert "### Improvements" in md and "update the baseline" in md
    assert summary.read_text().strip() == md.strip()


def test_truncated_baseline_exits_nonzero_naming_file_untouched(pytester: pytest.Pytester) -> None:
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
    import re

    path.write_text(re.sub(r'"schema_version": \d+', '"schema_version": 7', path.read_text()))
    r = _run(pytester, "--benchmark-compare")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stdout.fnmatch_lines(["*unknown schema_version 7*"])


def test_missing_baseline_passes_with_message_unless_strict(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_counts=COUNTS)
    r = _run(pytester, "--benchmark-compare")
    assert r.ret == 0
    r.stdout.fnmatch_lines(
        [
            "*no baseline to compare with: no stored perf run for machine*",
            "*save one with --benchmark-autosave*",
        ]
    )
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
    r.stdout.fnmatch_lines(
        [
            "*not compared: 1 metrics*",
            "*timings not compared: machine fingerprint differs in cpu_model*Some Other CPU*",
            "*2 unchanged*",
        ]
    )


@pytest.mark.perf_timing
def test_forty_percent_more_time_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_timed=TIMED)
    _run(pytester, "--benchmark-autosave")
    r = _run(pytester, "--benchmark-compare")
    assert r.ret == 0, r.stdout.str()
    monkeypatch.setenv("WORK_FACTOR", "1.4")
    r = _run(pytester, "--benchmark-compare")
    assert r.ret == 1, r.stdout.str()
    r.stdout.fnmatch_lines(
        [
            "*REGRESSIONS (1):*",
            # 2 ms of sleep plus the host's overhead: 1.4x of 2.156 ms printed "3.014 ms"
            "*test_timed.py::test_step*step_time_s*[23].* ms*[234].* ms*1.[34]*x*10%*",
            "*confirmed by*re-measurement*",
            "*re-measured: test_timed.py::test_step*",
        ]
    )
    # the re-measuring children neither saved nor gated: still only the one stored run
    assert len(_stored(pytester)) == 1


@pytest.mark.perf_timing
def test_remeasuring_child_inherits_options_but_never_saves(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suspect found in a run that also saves: the fresh-process child runs it with the
    user's options (here a -k filter that still selects it) and writes nothing to the store.

    Timing (a neighbour can still hide a sleep's slowdown); the slowdown is 2x, far above the
    10% margin, since the subject is what the child does, not the smallest effect caught."""
    pytester.makepyfile(test_timed=TIMED)
    _run(pytester, "--benchmark-save=base")
    monkeypatch.setenv("WORK_FACTOR", "2")
    r = _run(pytester, "-k", "step", "--benchmark-compare", "--benchmark-save=pr")
    assert r.ret == 1, r.stdout.str()
    r.stdout.fnmatch_lines(["*re-measured: test_timed.py::test_step*"])
    assert [p.name for p in _stored(pytester)] == ["0001_base.json", "0002_pr.json"]


def test_benchmark_fixture_times_become_a_metric(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_b="def test_b(benchmark):\n    benchmark(lambda: sum(range(50)))\n")
    r = _run(
        pytester,
        "--benchmark-autosave",
        "-o",
        "perf_gate_benchmark=true",
        "--benchmark-max-time=0.05",
    )
    assert r.ret == 0
    from perf.store.runs import load

    (path,) = _stored(pytester)
    (m,) = load(path).tests["test_b.py::test_b"]["metrics"]
    assert m["name"] == "benchmark" and m["unit"] == "s"
    assert 5 <= len(m["samples"]) <= 500


def test_machine_info_gets_torch_versions(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_b="def test_b(benchmark):\n    benchmark(lambda: None)\n")
    _run(
        pytester,
        "--benchmark-json=out.json",
        "--benchmark-max-time=0.01",
        "-o",
        "perf_machine_info=true",
        "--perf-no-reference",
    ).assert_outcomes(passed=1)
    import json

    info = json.loads((pytester.path / "out.json").read_text())["machine_info"]
    import torch

    assert info["torch_version"] == torch.__version__
    assert {"cuda_version", "cudnn_version", "gpu_driver", "gpus"} <= set(info)


def test_cuda_benchmark_tests_get_the_synchronizing_timer(pytester: pytest.Pytester) -> None:
    """Only tests on perf's `device` fixture: a project's own "cuda" parameter is its own."""

    pytester.makepyfile(
        test_b="""
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
"""
    )
    from perf.core.devices import parse_devices

    n_dev = len(parse_devices("all"))  # cpu, each GPU, or the simulated device without one
    _run(pytester, "--benchmark-max-time=0.01").assert_outcomes(passed=2 + n_dev)


def test_synchronizing_timer_drains_every_device_before_reading_the_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Behaviour, on a fake two-GPU torch.cuda: every device is synchronised, and only then
    is the clock read (a timer that reads first measures the launch, not the kernel)."""
    import time

    import torch

    from perf.plugin import gate as plugin_gate

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda i=None: calls.append(f"sync {i}"))
    monkeypatch.setattr(time, "perf_counter", lambda: calls.append("clock") or 42.0)
    assert plugin_gate.synchronizing_timer() == 42.0
    assert calls == ["sync 0", "sync 1", "clock"]
    calls.clear()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # no CUDA work yet
    plugin_gate.synchronizing_timer()
    assert calls == ["clock"]


def test_nothing_to_save(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_p():\n    pass\n")
    r = _run(pytester, "--benchmark-autosave")
    assert r.ret == 0
    out = r.stdout.str()  # a run without perf metrics: perf says nothing
    assert "perf gate" not in out and "perf:" not in out and "perf metrics" not in out
    assert _stored(pytester) == []


# -- options checked before the first test (issue 8, items 2 and 3; issue 11) ---------------

RAN = "test_counts.py::test_logging PASSED"


def _usage_error(r: pytest.RunResult, *needles: str) -> None:
    assert r.ret == pytest.ExitCode.USAGE_ERROR, r.stdout.str() + r.stderr.str()
    err = r.stderr.str()
    for n in needles:
        assert n in err, err
    assert "passed" not in r.stdout.str(), "no test may run before a usage error"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ('say"hi', "must not contain"),
        ("tab\there", "control characters"),
        (" lead", "without leading or trailing spaces"),
        ("x" * 300, "longer than 200 bytes"),
    ],
)
def test_bad_save_name_is_a_usage_error_before_any_test(
    pytester: pytest.Pytester, name: str, problem: str
) -> None:
    """Names pytest-benchmark's own check (/:*?<>|\\) lets through, which used to fail only
    at the save, after every test ran."""
    pytester.makepyfile(test_counts=COUNTS)
    r = _run(pytester, f"--benchmark-save={name}")
    _usage_error(r, "--benchmark-save=", problem)


def test_report_path_that_is_a_folder_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_counts=COUNTS)
    (pytester.path / "out").mkdir()
    r = _run(pytester, "--benchmark-autosave", "--perf-report=out")
    _usage_error(r, "--perf-report='out' is a folder")


def test_report_path_under_a_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_counts=COUNTS)
    (pytester.path / "afile").write_text("x")
    r = _run(pytester, "--benchmark-autosave", "--perf-report=afile/r.md")
    _usage_error(r, "--perf-report='afile/r.md' cannot be created", "afile is not a folder")


def test_unwritable_storage_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_counts=COUNTS)
    (pytester.path / "afile").write_text("x")
    r = _run(pytester, "--benchmark-autosave", "--benchmark-storage=file://afile/store")
    _usage_error(r, "--benchmark-storage=", "afile is not a folder")


@pytest.mark.skipif(not Path("/proc/self/mounts").exists(), reason="needs Linux /proc")
def test_read_only_storage_is_a_usage_error(pytester: pytest.Pytester) -> None:
    """A real read-only mount (root ignores permission bits, so chmod would prove nothing)."""
    ro = _mount_tmpfs(pytester.path / "ro", "ro,size=64k")
    pytester.makepyfile(test_counts=COUNTS)
    try:
        r = _run(pytester, "--benchmark-autosave", f"--benchmark-storage=file://{ro}")
        _usage_error(r, f"{ro} is not writable")
    finally:
        _umount(ro)


@pytest.mark.parametrize(
    ("spec", "latest"),
    [("9999", "0001_main"), ("nonexistent", "0001_main"), ("Other-Machine/1", "none")],
)
def test_compare_target_naming_no_run_is_a_usage_error(
    pytester: pytest.Pytester, spec: str, latest: str
) -> None:
    """A typo used to turn the gate off ("Nothing gated", exit 0)."""
    pytester.makepyfile(test_counts=COUNTS)
    _run(pytester, "--benchmark-save=main").assert_outcomes(passed=1)
    r = _run(pytester, f"--benchmark-compare={spec}")
    _usage_error(
        r, f"--benchmark-compare={spec}", "no stored perf run matches", f"latest there: {latest}"
    )


@pytest.mark.parametrize("target", ["tests/", "tests", "tests/test_counts.py"])
def test_compare_option_that_swallowed_a_test_path_says_how_to_write_it(
    pytester: pytest.Pytester, target: str
) -> None:
    """`pytest --benchmark-compare tests/`: the option takes an optional value, so the path
    became the compare target; the user's test file is never called a corrupt baseline."""
    pytester.mkdir("tests")
    pytester.path.joinpath("tests", "test_counts.py").write_text(COUNTS)
    _run(pytester, "tests", "--benchmark-save=main").assert_outcomes(passed=1)
    r = _run(pytester, "--benchmark-compare", target)
    _usage_error(
        r,
        f"--benchmark-compare got {target!r}",
        "--benchmark-compare=NUM",
        f"pytest {target} --benchmark-compare",
    )
    assert "JSON" not in r.stderr.str() and "delete" not in r.stderr.str()
    assert pytester.path.joinpath("tests", "test_counts.py").read_text() == COUNTS
    # written the suggested way, it runs and gates
    ok = _run(pytester, target, "--benchmark-compare")
    assert ok.ret == 0 and "perf gate passed" in ok.stdout.str()


# -- faults at session end (issue 8, item 2) -------------------------------------------------


def _mount_tmpfs(path: Path, options: str) -> Path:
    import subprocess

    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
    return path


def _umount(path: Path) -> None:
    import subprocess

    subprocess.run(["umount", str(path)], check=False)


def _verdict_then_error(r: pytest.RunResult, *needles: str) -> None:
    out = r.stdout.str()
    assert r.ret == 6, out
    assert "Traceback" not in out and "INTERNALERROR" not in out, out
    gate = out.index("perf gate passed: 0 regressions")
    for n in needles:
        assert n in out, out
        assert out.index(n) > gate, "the verdict comes before the error"
    assert "perf: exit status 6" in out


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_report_on_a_full_disk_keeps_the_verdict_and_exits_6(pytester: pytest.Pytester) -> None:
    """/dev/full answers every write with ENOSPC: a real full-disk error, no mount needed."""
    pytester.makepyfile(test_counts=COUNTS)
    _run(pytester, "--benchmark-save=main")
    r = _run(pytester, "--benchmark-compare", "--perf-report=/dev/full")
    _verdict_then_error(
        r, "could not write --perf-report /dev/full: No space left on device [ENOSPC]"
    )


def test_step_summary_that_is_a_folder_exits_6_and_the_report_is_still_written(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_counts=COUNTS)
    _run(pytester, "--benchmark-save=main")
    summary = pytester.mkdir("summary_dir")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    r = _run(pytester, "--benchmark-compare", "--perf-report=perf.md")
    _verdict_then_error(
        r, f"could not append to $GITHUB_STEP_SUMMARY {summary}: Is a directory [EISDIR]"
    )
    assert "perf gate" in (pytester.path / "perf.md").read_text()


def test_storage_disk_full_at_session_end_keeps_the_verdict_and_exits_6(
    pytester: pytest.Pytester,
) -> None:
    """A 64 KiB tmpfs filled by the test itself: the save at session end hits ENOSPC."""
    store = _mount_tmpfs(pytester.path / "small", "size=64k")
    try:
        pytester.makepyfile(
            test_counts=COUNTS,
            test_fill=f"""
def test_fill():
    import os
    os.makedirs({str(store)!r}, exist_ok=True)
    try:
        with open({str(store / "filler")!r}, "wb") as fh:
            fh.write(b"x" * 200_000)
    except OSError:
        pass
""",
        )
        _run(pytester, "--benchmark-storage=file://base", "--benchmark-save=main", "-k", "logging")
        import shutil

        shutil.copytree(pytester.path / "base" / "perf", store / "perf")
        r = _run(
            pytester,
            f"--benchmark-storage=file://{store}",
            "--benchmark-compare",
            "--benchmark-save=pr",
        )
        _verdict_then_error(
            r, f"could not save this run under {store}/perf/", "No space left on device [ENOSPC]"
        )
        assert [p.name for p in (store / "perf").rglob("*.json")] == ["0001_main.json"]
        assert not list((store / "perf").rglob("*.part")), "no half-written temp file"
    finally:
        _umount(store)


def test_storage_file_size_limit_at_session_end_exits_6(pytester: pytest.Pytester) -> None:
    """`ulimit -f` (EFBIG on write): the portable stand-in for a full disk, no root needed."""
    import shlex
    import sys

    pytester.makepyfile(
        test_timed="""
def test_t(perf_metrics):
    perf_metrics.record("t_s", 0.001, unit="s", notes="x" * 8000)
"""
    )
    cmd = (
        f"ulimit -f 4 && {shlex.quote(sys.executable)} -m pytest -p no:cacheprovider "
        "--perf-no-reference -o perf_busy_cpu_fraction=1 --benchmark-save=big"
    )
    r = pytester.run("bash", "-c", cmd)
    out = r.stdout.str()
    assert r.ret == 6, out + r.stderr.str()
    assert "could not save this run under" in out and "File too large [EFBIG]" in out
    assert "1 passed" in out
    # what is left on disk: no half run file, no temp file (fault injection, issue 17)
    left = [f.name for f in (pytester.path / ".benchmarks" / "perf").rglob("*") if f.is_file()]
    assert left in ([], [".perf-store.lock"]), left


def test_ctrl_c_while_saving_is_pytests_interruption_and_leaves_no_file(
    pytester: pytest.Pytester,
) -> None:
    """Fault injection: KeyboardInterrupt after the run file's bytes are written, before it is
    linked into place. Exit 2 with pytest's interruption banner and a line saying nothing was
    saved (was: a bare traceback); no run file and no temporary file are left."""
    pytester.makeconftest(
        """
        import perf.store.files as files

        def _interrupt(fd):
            raise KeyboardInterrupt

        def pytest_sessionfinish(session):
            files.os.fsync = _interrupt  # the save is the next fsync (a process of its own)
        """
    )
    pytester.makepyfile(
        test_c="def test_c(perf_metrics):\n    perf_metrics.record('c', 3, unit='calls')\n"
    )
    r = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--perf-no-reference", "--benchmark-autosave"
    )
    assert r.ret == pytest.ExitCode.INTERRUPTED, r.outlines
    out = r.stdout.str()
    assert "perf: nothing saved: interrupted while saving (KeyboardInterrupt)" in out
    assert "!!! KeyboardInterrupt !!!" in out.replace("!!!!", "!!!")
    assert "Traceback" not in out and "INTERNALERROR" not in out
    left = [f.name for f in (pytester.path / ".benchmarks" / "perf").rglob("*") if f.is_file()]
    assert left == [".perf-store.lock"], left


# -- partial runs (issue 8, item 4) -------------------------------------------------------

TEN = "\n".join(
    f"""
def test_{i}(perf_metrics):
    import os
    assert os.environ.get("FAIL_AT") != "{i}"
    if os.environ.get("PYTEST_EXIT_AT") == "{i}":
        import pytest
        pytest.exit("stopping here", returncode=0)
    extra = 1 if os.environ.get("SLOWER") == "{i}" else 0
    perf_metrics.record("syncs", 10 + extra, unit="syncs")
"""
    for i in range(10)
)


@pytest.mark.parametrize(
    ("env", "args", "why"),
    [
        ({"FAIL_AT": "3"}, ("-x",), "stopped early"),
        ({"FAIL_AT": "3"}, (), "1 tests failed"),
        ({"PYTEST_EXIT_AT": "3"}, (), "6 of 10 selected tests did not run"),
    ],
)
def test_partial_run_is_saved_marked_and_never_the_default_baseline(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env, args, why
) -> None:
    """A run stopped by -x (4 of 10 tests) used to become the default baseline: a later
    regression in an unreached test was then listed as "new" and passed."""
    pytester.makepyfile(test_ten=TEN)
    _run(pytester, "--benchmark-save=full").assert_outcomes(passed=10)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    r = _run(pytester, "--benchmark-save=partial", *args)
    r.stdout.fnmatch_lines([f"*saved as a partial run*{why}*never picks it*"])
    from perf.store.runs import load

    saved = _stored(pytester)
    assert [p.name for p in saved] == ["0001_full.json", "0002_partial.json"]
    assert why in (load(saved[1]).partial or "")
    for k in env:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SLOWER", "8")  # test_8 never ran in the partial run
    r = _run(pytester, "--benchmark-compare")
    assert r.ret == 1, r.stdout.str()
    r.stdout.fnmatch_lines(
        ["*compared with *0001_full*", "*test_ten.py::test_8*syncs*10 syncs*11 syncs*"]
    )


def test_collection_errors_make_a_run_partial(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_ten=TEN, test_broken="import no_such_module_here\n")
    r = _run(pytester, "--continue-on-collection-errors", "--benchmark-save=x")
    r.stdout.fnmatch_lines(["*saved as a partial run (1 collection errors)*"])


def test_interrupted_session_gates_and_saves_nothing_and_says_so(
    pytester: pytest.Pytester,
) -> None:
    """Ctrl-C (KeyboardInterrupt, exit 2): the user asked to stop, so no reference workload,
    no gate, no save; the summary says so instead of staying silent."""
    pytester.makepyfile(test_ten=TEN, test_zz="def test_stop():\n    raise KeyboardInterrupt\n")
    r = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--perf-no-reference", "--benchmark-save=x"
    )  # in-process re-raises Ctrl-C
    assert r.ret == pytest.ExitCode.INTERRUPTED
    r.stdout.fnmatch_lines(["*perf: nothing saved: the session was interrupted*"])
    assert _stored(pytester) == []


def test_k_selection_is_not_partial(pytester: pytest.Pytester) -> None:
    """A -k / -m subset is complete for what it selected (README: saved as a normal run)."""
    pytester.makepyfile(test_ten=TEN)
    _run(pytester, "-k", "test_1 or test_2", "--benchmark-save=sub").assert_outcomes(passed=2)
    from perf.store.runs import load

    (path,) = _stored(pytester)
    assert load(path).partial is None


# -- record() accepts only what round-trips (issue 8, item 5) -----------------------------

BAD_EXTRA = """
import math, torch

def test_nan(perf_metrics):
    perf_metrics.record("syncs", 1, unit="syncs", ratio=math.nan)

def test_dtype(perf_metrics):
    perf_metrics.record("syncs", 1, unit="syncs", dtype=torch.float16)

def test_fine(perf_metrics):
    perf_metrics.record("flops", 2**53 + 1, unit="flops", dtype=str(torch.float16))
"""


@pytest.mark.parametrize("xdist", [False, True])
def test_bad_extras_fail_their_test_and_the_rest_is_saved(
    pytester: pytest.Pytester, xdist: bool
) -> None:
    """Was: serially the whole save crashed at session end; under -n 2 INTERNALERROR on the
    worker, the test silently dropped out, exit 0."""
    pytester.makepyfile(test_extra=BAD_EXTRA)
    args = ("-n", "2") if xdist else ()
    r = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--perf-no-reference", "--benchmark-save=x", *args
    )
    out = r.stdout.str()
    assert "INTERNALERROR" not in out and r.ret == 1, out
    r.assert_outcomes(passed=1, failed=2)
    assert "extra 'ratio': nan is not valid JSON" in out
    assert "extra 'dtype': a torch.dtype" in out
    from perf.store.runs import load

    (path,) = _stored(pytester)
    run = load(path)
    (m,) = run.tests["test_extra.py::test_fine"]["metrics"]
    assert m["value"] == 2**53 + 1 and m["extra"] == {"dtype": "torch.float16"}
    assert run.partial == "2 tests failed"
