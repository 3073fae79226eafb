"""Device parsing and the fingerprint."""

from __future__ import annotations

import pytest

from perf import devices


def test_parse_devices_cpu_and_all():
    assert devices.parse_devices("cpu", ["cpu"]) == ["cpu"]
    assert devices.parse_devices("all", ["cpu", "cuda:0", "cuda:1"]) == ["cpu", "cuda:0", "cuda:1"]
    assert devices.parse_devices("cpu,cuda", ["cpu", "cuda:0", "cuda:1"]) == [
        "cpu", "cuda:0", "cuda:1"]
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
