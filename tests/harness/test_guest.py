"""perf as a guest in other projects' test suites (issue 11, issue 8 items 1 and 10).

The rule: a test that uses nothing of perf runs exactly as if perf were not installed, and a
project that uses pytest-benchmark alone keeps pytest-benchmark's behaviour. Each test below
is written the way the peer project would have it, and most run it twice: with perf and with
perf's plugin blocked (``-p no:perf``, which is what "not installed" means to pytest: the
entry point is never loaded, and with it none of its parts).
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perf.plugin import guest

WITHOUT_PERF = ("-p", "no:perf")

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    # Inside an outer xdist worker, pytest-benchmark would disable itself in the inner run.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)


def _outcomes(r: pytest.RunResult) -> dict[str, int]:
    # in-process runs warn that the already imported `perf` cannot be assertion-rewritten,
    # with and without perf's plugins: not an outcome
    return {k: v for k, v in r.parseoutcomes().items() if k not in ("warnings", "warning")}


def _both(pytester: pytest.Pytester, *args: str, subprocess: bool = False):
    run = pytester.runpytest_subprocess if subprocess else pytester.runpytest
    return run("-p", "no:cacheprovider", *args), run("-p", "no:cacheprovider", *WITHOUT_PERF, *args)


# -- names: fixtures and markers ------------------------------------------------------------


def test_projects_own_device_fixture_wins(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def device():
            return "my-accelerator"

        @pytest.fixture
        def tensor_size():
            return 7
        """
    )
    pytester.makepyfile(
        """
        def test_dev(device, tensor_size):
            assert device == "my-accelerator" and tensor_size == 7
        """
    )
    with_perf, without = _both(pytester, "-v")
    assert _outcomes(with_perf) == _outcomes(without) == {"passed": 1}
    with_perf.stdout.fnmatch_lines(["*::test_dev PASSED*"])  # no [cpu] id


def test_projects_own_parametrize_device_wins(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("device", ["cpu", "meta"])
        @pytest.mark.parametrize("tensor_size", [3])
        def test_dev(device, tensor_size):
            assert isinstance(device, str) and tensor_size == 3
        """
    )
    with_perf, without = _both(pytester, "-v")
    assert _outcomes(with_perf) == _outcomes(without) == {"passed": 2}
    with_perf.stdout.fnmatch_lines(
        ["*test_dev[[]3-cpu[]] PASSED*", "*test_dev[[]3-meta[]] PASSED*"]
    )


def test_projects_own_generate_tests_hook_wins(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        def pytest_generate_tests(metafunc):
            if "device" in metafunc.fixturenames:
                metafunc.parametrize("device", ["a", "b", "c"])
        """
    )
    pytester.makepyfile("def test_dev(device):\n    assert device in 'abc'\n")
    with_perf, without = _both(pytester)
    assert _outcomes(with_perf) == _outcomes(without) == {"passed": 3}


def test_an_override_that_builds_on_perfs_device_keeps_perfs_parametrization(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def device(device):
            return ("wrapped", device)
        """
    )
    pytester.makepyfile(
        """
        def test_dev(device):
            assert device[0] == "wrapped" and str(device[1]) == "cpu"
        """
    )
    r = pytester.runpytest("--perf-devices", "cpu", "-v")
    r.assert_outcomes(passed=1)
    r.stdout.fnmatch_lines(["*test_dev[[]cpu[]] PASSED*"])


def test_projects_own_cuda_and_timing_markers_are_left_alone(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        """
        [pytest]
        addopts = --strict-markers
        markers =
            cuda(arch): needs a GPU of this architecture (the project's own marker)
            timing: the project's own slow tests
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.cuda("sm80")
        def test_arch(request):
            assert request.node.get_closest_marker("cuda").args == ("sm80",)

        @pytest.mark.cuda
        def test_plain():
            pass

        @pytest.mark.timing
        def test_timing(request):
            assert request.node.get_closest_marker("xdist_group") is None
        """
    )
    for args in ((), ("-n", "2")):
        with_perf, without = _both(pytester, *args, subprocess=bool(args))
        assert with_perf.ret == without.ret == 0, with_perf.outlines
        assert _outcomes(with_perf) == _outcomes(without) == {"passed": 3}


@pytest.mark.parametrize(
    ("mark", "message"),
    [
        ('perf_cuda("sm80")', "perf_cuda(min_devices='sm80') is not a device count"),
        ("perf_cuda(gpus=2)", "perf_cuda got unknown argument(s) gpus"),
        ("perf_cuda(0)", "perf_cuda(min_devices=0) is not a device count"),
        ("perf_timing(1)", "perf_timing takes no arguments"),
    ],
)
def test_malformed_perf_marker_is_a_clear_error_not_internalerror(
    pytester: pytest.Pytester, mark: str, message: str
) -> None:
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.{mark}\ndef test_x():\n    pass\n")
    r = pytester.runpytest()
    assert r.ret not in (pytest.ExitCode.OK, pytest.ExitCode.INTERNAL_ERROR)
    assert "INTERNALERROR" not in r.stdout.str() + r.stderr.str()
    r.stdout.fnmatch_lines([f"*test_x*{message}*write @pytest.mark.*"])


def test_perf_timing_under_no_xdist_and_strict_markers(pytester: pytest.Pytester) -> None:
    """Issue 8 item 1: what .github/workflows run (`-p no:xdist`) with --strict-markers."""
    pytester.makeini("[pytest]\naddopts = --strict-markers\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.perf_timing
        def test_t():
            pass
        """
    )
    r = pytester.runpytest("-p", "no:xdist", "-m", "perf_timing")
    assert r.ret == 0, r.outlines
    r.assert_outcomes(passed=1)


# -- xdist: scheduling, crashes, the timing lock, threads ----------------------------------

CRASH = """
import os

def test_crash():
    os._exit(1)

def test_ok():
    pass
"""


@pytest.mark.parametrize("workers", ["1", "2"])
def test_worker_crash_is_reported_once_as_without_perf(
    pytester: pytest.Pytester, workers: str
) -> None:
    pytester.makepyfile(test_crash=CRASH)
    runs = [
        pytester.runpytest_subprocess("-p", "no:cacheprovider", *extra, "-n", workers, timeout=120)
        for extra in ((), WITHOUT_PERF)
    ]
    for r in runs:
        assert r.ret == pytest.ExitCode.TESTS_FAILED, r.outlines
        assert _outcomes(r) == {"failed": 1, "passed": 1}, r.outlines
        assert "INTERNALERROR" not in r.stdout.str()


def test_handlecrashitem_hook_reschedules_the_crashed_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest-xdist's documented ``pytest_handlecrashitem`` (re-run a crashed test)."""
    pytester.makeconftest(
        """
        def pytest_handlecrashitem(crashitem, report, sched):
            if not crashitem.endswith("test_crash_once"):
                return
            sched.mark_test_pending(crashitem)
            report.outcome = "rerun"
        """
    )
    pytester.makepyfile(
        """
        import os, pathlib

        def test_crash_once(tmp_path_factory):
            flag = pathlib.Path(os.environ["CRASH_FLAG"])
            if not flag.exists():
                flag.write_text("crashed")
                os._exit(1)
        """
    )
    flag = pytester.path / "crashed.flag"
    outcomes = []
    for extra in ((), WITHOUT_PERF):
        flag.unlink(missing_ok=True)
        monkeypatch.setenv("CRASH_FLAG", str(flag))
        r = pytester.runpytest_subprocess("-p", "no:cacheprovider", *extra, "-n", "1", timeout=120)
        assert "INTERNALERROR" not in r.stdout.str(), r.outlines
        assert flag.exists()
        outcomes.append((r.ret, r.parseoutcomes().get("passed")))
    assert outcomes[0] == outcomes[1] == (0, 1)


TIMED_INTERVALS = """
import json, os, pathlib, time
import pytest

{mark}
@pytest.mark.parametrize("i", range(4))
def test_t(i):
    start = time.monotonic()
    time.sleep(0.4)
    out = pathlib.Path(os.environ["INTERVALS"]) / "{name}" / f"{{i}}.json"
    out.write_text(json.dumps([start, time.monotonic()]))
"""


def _overlaps(folder: Path) -> int:
    spans = sorted(json.loads(p.read_text()) for p in folder.glob("*.json"))
    assert len(spans) == 4
    return sum(1 for a, b in itertools.pairwise(spans) if b[0] < a[1])


def test_perf_timing_tests_never_run_at_once_under_xdist(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timing lock: with -n 2 (default --dist load) perf_timing tests wait for each other.
    The control in the same run (no marker) shows the same tests do overlap, so this check
    can fail."""
    monkeypatch.setenv("INTERVALS", str(pytester.path))
    for name, mark in (("timed", "@pytest.mark.perf_timing"), ("control", "")):
        pytester.mkdir(name)
        pytester.makepyfile(**{f"test_{name}": TIMED_INTERVALS.format(mark=mark, name=name)})
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", timeout=120)
    r.assert_outcomes(passed=8)
    assert _overlaps(pytester.path / "timed") == 0, r.outlines
    assert _overlaps(pytester.path / "control") > 0, r.outlines


def test_torch_threads_shared_only_while_a_perf_test_runs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = int(
        subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("DEFAULT_THREADS", str(default))
    pytester.makepyfile(
        """
        import os
        import pytest
        import torch

        @pytest.mark.parametrize("i", range(3))
        def test_plain(i):
            assert torch.get_num_threads() == int(os.environ["DEFAULT_THREADS"])

        @pytest.mark.parametrize("i", range(3))
        def test_perf(i, perf_metrics):
            want = max(1, os.cpu_count() // 2)
            assert torch.get_num_threads() == want
        """
    )
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", timeout=120)
    r.assert_outcomes(passed=6)


# -- pytest-benchmark alone -----------------------------------------------------------------

BENCH = """
import os, time

def test_sleep(benchmark):
    benchmark.pedantic(time.sleep, args=(float(os.environ.get("NAP", "0.001")),),
                       rounds=5, iterations=1)

def test_sum(benchmark):
    benchmark(sum, range(100))
"""


def _strip_times(text: str) -> str:
    return re.sub(r'(time|timestamp|hostname)="[^"]*"', r'\1=""', text)


def test_benchmark_only_project_junit_xml_is_unchanged(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench=BENCH)
    sizes = {}
    for label, extra in (
        ("perf", ()),
        ("perf-gated", ("-o", "perf_gate_benchmark=true")),
        ("without", WITHOUT_PERF),
    ):
        xml = pytester.path / f"{label}.xml"
        r = pytester.runpytest(
            "-p", "no:cacheprovider", *extra, f"--junitxml={xml}", "--benchmark-max-time=0.02"
        )
        r.assert_outcomes(passed=2)
        sizes[label] = _strip_times(xml.read_text())
    for label in ("perf", "perf-gated"):  # opted in: a metric exists, but not in JUnit
        diff = "\n".join(
            difflib.unified_diff(
                sizes["without"].splitlines(), sizes[label].splitlines(), lineterm=""
            )
        )
        assert sizes[label] == sizes["without"], diff
    assert "<properties>" not in sizes["perf-gated"]


def test_benchmark_only_project_prints_nothing_of_perf(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench=BENCH)
    r = pytester.runpytest(
        "-p", "no:cacheprovider", "--benchmark-max-time=0.02", "--benchmark-autosave"
    )
    r.assert_outcomes(passed=2)
    out = r.stdout.str()
    assert "perf metrics" not in out and "perf gate" not in out and "perf:" not in out
    assert not (pytester.path / ".benchmarks" / "perf").exists()


def test_benchmark_only_project_machine_info_keys_unchanged(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench=BENCH)
    keys = []
    for extra in ((), WITHOUT_PERF):
        r = pytester.runpytest(
            "-p",
            "no:cacheprovider",
            *extra,
            "--benchmark-max-time=0.02",
            "--benchmark-json=out.json",
        )
        r.assert_outcomes(passed=2)
        keys.append(set(json.loads((pytester.path / "out.json").read_text())["machine_info"]))
    assert keys[0] == keys[1]
    assert "torch_version" not in keys[0]


@pytest.mark.parametrize(
    "fail_opt", [(), ("--benchmark-compare-fail=mean:50%",)], ids=["compare", "compare-fail"]
)
def test_benchmark_only_project_compare_keeps_pytest_benchmarks_verdict(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fail_opt: tuple[str, ...]
) -> None:
    """Saved baseline, then a 20x slower `test_sleep`: pytest-benchmark alone reports it
    (exit 0) and fails it only with --benchmark-compare-fail; perf must not change either,
    nor re-run anything in child processes."""
    pytester.makepyfile(test_bench=BENCH)
    base = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", *WITHOUT_PERF, "--benchmark-autosave", "--benchmark-max-time=0.02"
    )
    base.assert_outcomes(passed=2)
    monkeypatch.setenv("NAP", "0.02")
    rets = []
    for extra in ((), WITHOUT_PERF):
        r = pytester.runpytest_subprocess(
            "-p",
            "no:cacheprovider",
            *extra,
            "--benchmark-compare",
            *fail_opt,
            "--benchmark-max-time=0.02",
            timeout=300,
        )
        out = r.stdout.str()
        assert "perf gate" not in out and "re-measured" not in out and "perf:" not in out
        rets.append(r.ret)
    expected = pytest.ExitCode.TESTS_FAILED if fail_opt else pytest.ExitCode.OK
    assert rets == [expected, expected]


# -- start-up cost --------------------------------------------------------------------------


def test_loading_the_plugin_imports_no_torch_scipy_or_instruments() -> None:
    code = textwrap.dedent(
        """
        import sys
        import perf, perf.plugin.core, perf.plugin.gate
        heavy = {"torch", "scipy", "numpy", "perf.instruments.counters",
                 "perf.instruments.timing", "perf.instruments.memory",
                 "perf.gate.compare", "perf.core.devices", "filelock"}
        print(sorted(heavy & set(sys.modules)))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_suite_without_perf_tests_never_imports_torch(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import sys

        def pytest_sessionfinish(session):
            with open("imported.txt", "w") as f:
                f.write(",".join(m for m in ("torch", "scipy", "numpy") if m in sys.modules))
        """
    )
    pytester.makepyfile(
        test_plain="def test_a():\n    pass\n",
        test_bench="def test_b(benchmark):\n    benchmark(sum, [1])\n",
    )
    for args in (("--benchmark-autosave",), ("-n", "2")):
        # what the environment's other plugins import anyway (a GPU image's imported numpy)
        pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:perf", *args)
        without = (pytester.path / "imported.txt").read_text()
        r = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
        r.assert_outcomes(passed=2)
        assert (pytester.path / "imported.txt").read_text() == without, args


def test_counting_imports_no_dynamo_and_still_counts_compiled_code() -> None:
    """Every counter (and the GPU model) on a fresh interpreter: ``torch._dynamo`` and sympy
    stay unimported (torch's wrapper around a mode's ``__torch_dispatch__`` imported them on
    the first op: 0.8 s of CPU in every process that counts), and compiled code, which
    imports them itself, is still counted op by op."""
    code = textwrap.dedent(
        """
        import sys
        import torch, perf
        dev = perf.simulated_device()
        x = torch.ones(4, 4, device=dev)
        with perf.count_ops(dev) as o, perf.count_syncs(dev) as s, \\
                perf.count_transfers() as t, perf.count_flops() as f, \\
                perf.model_gpu_time(dev) as m:
            (x @ x).sum().item()
            torch.ones(8).to(dev)
        print(o.count, s.count, t.h2d_copies, f.total, m.launches,
              sorted({"torch._dynamo", "sympy"} & set(sys.modules)))
        fn = torch.compile(lambda a: (a * 2).sin(), backend="eager")
        y = torch.ones(4)
        with perf.count_ops() as c:
            fn(y)
        print(c.count, "torch._dynamo" in sys.modules)
        """
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # sim: a CPU-only child on a GPU box too
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stdout + out.stderr
    first, compiled = out.stdout.split("\n")[:2]
    ops, syncs, h2d, flops, launches, imported = first.split(" ", 5)
    assert int(ops) >= 3 and int(syncs) == 2 and int(h2d) == 1 and int(flops) == 128, first
    assert int(launches) >= 2 and imported == "[]", first
    assert compiled == "2 True", compiled  # mul and sin, counted inside the compiled frame


def test_lazy_package_names_match_all() -> None:
    import perf

    assert sorted(perf.__all__) == sorted(perf._EXPORTS)
    for name in perf.__all__:
        assert callable(getattr(perf, name)), name
    assert perf.core.stats.median([1.0, 3.0]) == 2.0


# -- pure rules -----------------------------------------------------------------------------


def test_cuda_marker_arguments() -> None:
    assert guest.cuda_marker_need((), {}) == 1
    assert guest.cuda_marker_need((2,), {}) == 2
    assert guest.cuda_marker_need((), {"min_devices": 3}) == 3
    for args, kwargs in (
        ((True,), {}),
        (("x",), {}),
        ((1, 2), {}),
        ((1,), {"min_devices": 1}),
        ((), {"devices": 2}),
    ):
        with pytest.raises(ValueError, match=r"write @pytest\.mark\.perf_cuda"):
            guest.cuda_marker_need(args, kwargs)


def test_parametrize_argnames() -> None:
    assert guest.parametrize_argnames(("device, size", []), {}) == ["device", "size"]
    assert guest.parametrize_argnames((["device"], []), {}) == ["device"]
    assert guest.parametrize_argnames((), {"argnames": "device"}) == ["device"]


def test_resolves_to_follows_pytests_override_rule() -> None:
    class FD:
        def __init__(self, argnames: tuple[str, ...], ours: bool = False) -> None:
            self.argnames, self.ours = argnames, ours

    def is_ours(fd: FD) -> bool:
        return fd.ours

    ours = FD((), ours=True)
    assert guest.resolves_to([ours], is_ours, "device")
    assert not guest.resolves_to([ours, FD(())], is_ours, "device")  # project's own wins
    assert guest.resolves_to([ours, FD(("device",))], is_ours, "device")  # builds on ours
    assert not guest.resolves_to([FD(())], is_ours, "device")


def test_thread_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert guest.thread_share(8, 2) == 4
    assert guest.thread_share(2, 4) == 1
    assert guest.thread_share(8, 1) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert guest.thread_share(8, 2) is None


def test_footprint_script_runs(tmp_path: Path) -> None:
    """benchmarks/guest_footprint.py (README, "perf in other projects' suites"), small."""
    script = Path(__file__).parents[2] / "benchmarks" / "guest_footprint.py"
    out = tmp_path / "f.json"
    subprocess.run(
        [
            sys.executable,
            str(script),
            "--reps",
            "1",
            "--tests",
            "100",
            "--only",
            "trivial_serial,benchmark_autosave",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    times = json.loads(out.read_text())["times_s [wall, cpu]"]
    assert set(times) == {"trivial_serial", "benchmark_autosave"}
    assert all(len(v["with"]) == len(v["without"]) == 1 for v in times.values())
