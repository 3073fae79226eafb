"""The plugin, driven through pytester: options, fixtures, markers and the metric channel."""

from __future__ import annotations

import pytest
import torch

# Imported here, in the outer process: pytester's in-process runs drop modules they imported,
# and a second import of the simulated device would register its kernels with torch twice.
import perf.sim.device  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

HAS_CUDA = torch.cuda.is_available()


def test_device_fixture_parametrizes_over_cpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_dev(device):
            assert str(device) == "cpu"
        """
    )
    result = pytester.runpytest("--perf-devices", "cpu", "-v")
    result.stdout.fnmatch_lines(["*test_dev[[]cpu[]] PASSED*"])
    result.assert_outcomes(passed=1)


@pytest.mark.skipif(HAS_CUDA, reason="checks the error on a machine without CUDA")
def test_missing_cuda_is_a_usage_error_naming_the_devices(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(device): pass")
    result = pytester.runpytest("--perf-devices", "cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no CUDA device*devices here: cpu*"])


def test_bad_sizes_say_what_a_size_looks_like(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(tensor_size): pass")
    result = pytester.runpytest("--perf-sizes", "64,abc")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'abc' is not a size; a size is a positive integer*"])


def test_sizes_from_option_and_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nperf_sizes = 8,16\n")
    pytester.makepyfile("def test_x(tensor_size): assert tensor_size in (8, 16, 32)")
    pytester.runpytest().assert_outcomes(passed=2)
    result = pytester.runpytest("--perf-sizes", "32", "-v")
    result.stdout.fnmatch_lines(["*test_x[[]n32[]] PASSED*"])


@pytest.mark.skipif(HAS_CUDA, reason="checks the skip on a machine without CUDA")
def test_cuda_marker_skips_with_a_reason_naming_cuda(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.perf_cuda
        def test_plain():
            raise AssertionError("must not run")

        @pytest.mark.perf_cuda
        def test_with_device(device):
            raise AssertionError("must not run")

        @pytest.mark.perf_cuda(min_devices=2)
        def test_two():
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["*needs CUDA*"])
    assert "must not run" not in result.stdout.str()


def test_record_rejects_bad_values(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import math, pytest

        def test_bad(perf_metrics):
            with pytest.raises(ValueError, match="finite"):
                perf_metrics.record("x", math.nan, "count")
            with pytest.raises(ValueError, match="negative"):
                perf_metrics.record("x", -1, "syncs")
            with pytest.raises(ValueError, match="unknown unit"):
                perf_metrics.record("x", 1, "furlongs")
            perf_metrics.record("x", 1, "count")
            with pytest.raises(ValueError, match="already recorded"):
                perf_metrics.record("x", 2, "count")
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


METRIC_TESTS = """
    import pytest
    import perf

    @pytest.mark.perf_tolerance(0.2, act=0.05)
    def test_one(perf_metrics):
        m = perf_metrics.record("act", 1024, "bytes")
        assert m.tolerance == 0.05
        assert perf_metrics.record("other", 3, "count").tolerance == 0.2

    def test_two(perf_metrics):
        import torch
        x = torch.ones(1, device=perf.simulated_device())
        with perf.count_syncs() as s:
            x.item()
        perf_metrics.record("syncs", s.count, "syncs")
"""


@pytest.mark.parametrize("args", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_metrics_reach_the_summary(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # test_two's sim needs a CPU-only child
    pytester.makepyfile(METRIC_TESTS)
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["*perf metrics*", "*test_one*act*1.00 KiB*", "*test_two*syncs*1 syncs*"]
    )


def test_metrics_key_on_the_test_id_without_xdist_group_suffix() -> None:
    from perf.plugin.metrics import canonical_nodeid

    assert canonical_nodeid("t.py::test[cpu]@perf-timing") == "t.py::test[cpu]"
    assert canonical_nodeid("t.py::test@ddp") == "t.py::test"
    assert canonical_nodeid("t.py::test[user@host]") == "t.py::test[user@host]"
