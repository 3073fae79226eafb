"""Device parsing and the fingerprint."""

from __future__ import annotations

import pytest
import torch

from perf.core import devices


def test_parse_devices_cpu_and_all():
    assert devices.parse_devices("cpu", ["cpu"]) == ["cpu"]
    assert devices.parse_devices("all", ["cpu", "cuda:0", "cuda:1"]) == ["cpu", "cuda:0", "cuda:1"]
    assert devices.parse_devices("cpu,cuda", ["cpu", "cuda:0", "cuda:1"]) == [
        "cpu",
        "cuda:0",
        "cuda:1",
    ]
    assert devices.parse_devices("cuda:1", ["cpu", "cuda:0", "cuda:1"]) == ["cuda:1"]


def test_parse_devices_missing_cuda_names_what_exists():
    with pytest.raises(ValueError, match=r"no CUDA device.*devices here: cpu"):
        devices.parse_devices("cuda", ["cpu"])
    with pytest.raises(ValueError, match=r"'cuda:3'.*devices here: cpu, cuda:0"):
        devices.parse_devices("cuda:3", ["cpu", "cuda:0"])


def test_fingerprint_names_the_cpu_model():
    fp = devices.fingerprint()
    assert fp["cpu_model"]  # not platform.processor(), which is empty on Linux
    assert fp["torch"] and fp["cpu_count"] >= 1
    assert devices.fingerprint_diff(fp, dict(fp)) == {}
    other = dict(fp, torch="0.0.0")
    assert set(devices.fingerprint_diff(fp, other)) == {"torch"}
    assert devices.machine_id(fp) == devices.machine_id(dict(fp))
    assert devices.machine_id(fp) != devices.machine_id(other)


def test_parse_devices_sim():
    assert devices.parse_devices("sim", ["cpu", "sim"]) == ["sim"]
    assert devices.parse_devices("sim:0,cpu", ["cpu", "sim"]) == ["sim", "cpu"]
    assert devices.parse_devices("all", ["cpu", "sim"]) == ["cpu", "sim"]
    with pytest.raises(ValueError, match=r"'sim', the simulated accelerator.*devices here: cpu"):
        devices.parse_devices("sim", ["cpu", "cuda:0"])


@pytest.mark.skipif(
    devices._real_accelerator() is not None,
    reason="this machine has CUDA/MPS: the simulated device is only listed on CPU-only boxes",
)
def test_cpu_only_box_lists_and_makes_the_simulated_device():
    assert devices.available_devices() == ["cpu", "sim"]
    dev = devices.make_device("sim")
    assert dev.type == "sim" and devices.is_sim(dev) and not devices.is_sim(torch.device("cpu"))


@pytest.mark.skipif(
    devices._real_accelerator() is not None,
    reason="this machine has CUDA/MPS: the simulated device is only listed on CPU-only boxes",
)
def test_device_fixture_yields_sim_and_timing_tests_skip_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        def test_count(device):
            assert device.type in ("cpu", "sim")

        @pytest.mark.perf_timing
        def test_time(device):
            assert device.type == "cpu"
        """
    )
    r = pytester.runpytest("-rs", "-v")
    r.assert_outcomes(passed=3, skipped=1)
    r.stdout.fnmatch_lines(
        [
            "*test_count?sim? PASSED*",
            "*SKIPPED*timing on the simulated device is meaningless*",
        ]
    )
    r = pytester.runpytest("--perf-devices", "sim", "-v")
    r.assert_outcomes(passed=1, skipped=1)
