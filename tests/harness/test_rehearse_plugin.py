"""The rehearsal's pytest side (``--perf-rehearse-cuda``) and the GPU pool
(``--perf-gpu-per-worker``), in pytest subprocesses (the fake must never patch this
process's torch), plus the pool's and the timing locks' pure parts."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from perf.core import gpu_pool, rehearse

REHEARSED = """
import pytest, torch

def test_reaches_cuda(device):
    if device.type == "cuda":
        torch.ones(1, device=device)  # the first real CUDA call

def test_no_cuda(device):
    assert torch.cuda.device_count() == 2
"""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS", "CUDA_VISIBLE_DEVICES", rehearse.ENV,
                gpu_pool.PINNED_ENV, "PERF_REHEARSE_CUDA_ANNOUNCED"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_a_test_that_reaches_real_cuda_is_skipped_saying_where(
    pytester: pytest.Pytester, clean_env: pytest.MonkeyPatch
) -> None:
    if torch.cuda.is_available() and not rehearse.active():  # a real GPU, not rehearsed
        pytest.skip("this machine has a GPU: the first real CUDA call succeeds here, where the "
                    "rehearsal (for CPU-only boxes) would stop it")  # fmt: skip
    cpu_build = not torch.backends.cuda.is_built()  # a rehearsal fakes torch.version.cuda
    pytester.makepyfile(test_r=REHEARSED)
    pytester.makepyfile(test_import="import torch\nX = torch.zeros(1).cuda()\n")
    if cpu_build:  # a CPU build refuses to make a CUDA event; a CUDA build makes it lazily
        pytester.makepyfile(test_event="import torch\nE = torch.cuda.Event()\n")
    res = pytester.runpytest_subprocess("-p", "no:xdist", "--perf-rehearse-cuda=2", "-rs", "-v")
    # 2 on cuda, and each module stopped at import
    res.assert_outcomes(passed=4, skipped=4 if cpu_build else 3)
    event = (
        f"SKIPPED [[]1[]] test_event.py: {rehearse.STOP_PREFIX} at import, which this CPU "
        "build of torch refused: RuntimeError: Tried to instantiate dummy base class Event"
    )
    res.stdout.fnmatch_lines(
        [
            "perf: CUDA rehearsal: 2 simulated H100 device(s)*",
            "*test_reaches_cuda?cuda:1? SKIPPED*",
            *([event] if cpu_build else []),
            f"SKIPPED [[]1[]] test_import.py: {rehearse.STOP_PREFIX} at *test_import.py:2 *",
            f"SKIPPED [[]2[]] test_r.py:3: {rehearse.STOP_PREFIX} at *test_r.py:5 *",
        ]
    )
    bad = pytester.runpytest_subprocess("--perf-rehearse-cuda=many", "--co")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--perf-rehearse-cuda='many': give the number of CUDA devices*"])


CHILD = """
import subprocess, sys
import pytest, torch

def test_child_reaches_cuda(device):
    if device.type != "cuda":
        return
    code = "import perf, torch; torch.cuda.synchronize()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
"""


def test_a_child_process_that_reaches_real_cuda_is_skipped_saying_where(
    pytester: pytest.Pytester, clean_env: pytest.MonkeyPatch
) -> None:
    """A test that runs CUDA code in a child and asserts on its exit (P14's allocator rules)
    gets the child's traceback as its error: the rehearsal reads the stop there too (it
    failed those tests before)."""
    if torch.cuda.is_available() and not rehearse.active():  # a real GPU, not rehearsed
        pytest.skip("this machine has a GPU: the child's CUDA call succeeds here")
    pytester.makepyfile(test_child=CHILD)
    res = pytester.runpytest_subprocess("-p", "no:xdist", "--perf-rehearse-cuda=1", "-rs")
    res.assert_outcomes(passed=1, skipped=1)
    where = f"{rehearse.STOP_PREFIX} at <string>:1 *(in a child process)"
    res.stdout.fnmatch_lines([f"SKIPPED [[]1[]] test_child.py:4: {where}"])


POOLED = """
import json, os
import pytest, torch

@pytest.mark.parametrize("i", range(6))
def test_where(device, i, perf_metrics):
    p = torch.cuda.get_device_properties(0)
    rec = [os.environ["PYTEST_XDIST_WORKER"], os.environ["CUDA_VISIBLE_DEVICES"],
           torch.cuda.device_count(), p.uuid, str(device)]
    with open(f"where_{os.environ['PYTEST_XDIST_WORKER']}_{i}_{device}.json", "w") as fh:
        json.dump(rec, fh)
    if device.type == "cuda":
        perf_metrics.record("n", i, "count")

@pytest.mark.perf_cuda(min_devices=2)
def test_two_gpus():
    pass
"""

POOL_CONFTEST = """
import json

def pytest_runtest_logreport(report):
    for m in getattr(report, "perf_metrics", None) or []:
        with open("metrics.jsonl", "a") as fh:
            fh.write(json.dumps(m) + "\\n")
"""


def test_each_xdist_worker_gets_its_own_gpu_and_metrics_name_it(
    pytester: pytest.Pytester, clean_env: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_pool=POOLED)
    pytester.makeconftest(POOL_CONFTEST)
    res = pytester.runpytest_subprocess(
        "-n", "2", "--perf-rehearse-cuda=2", "--perf-gpu-per-worker", "-rs"
    )
    res.assert_outcomes(passed=12, skipped=1)  # cpu and cuda:0 on each worker's one GPU
    res.stdout.fnmatch_lines(
        ["*needs 2 CUDA devices, this machine has 1 (this xdist worker sees GPU ?: --perf-gpu*"]
    )
    seen = [json.loads(p.read_text()) for p in sorted(pytester.path.glob("where_*.json"))]
    by_worker = {w: (cvd, n, uuid) for w, cvd, n, uuid, _ in seen}
    assert by_worker == {
        "gw0": ("0", 1, rehearse.properties(0).uuid),
        "gw1": ("1", 1, rehearse.properties(1).uuid),
    }, seen
    assert {dev for *_, dev in seen} == {"cpu", "cuda:0"}
    metrics = [json.loads(x) for x in (pytester.path / "metrics.jsonl").read_text().splitlines()]
    gpus = {(m["extra"]["gpu"]["physical"], m["extra"]["gpu"]["uuid"]) for m in metrics}
    assert gpus == {(str(i), rehearse.properties(i).uuid) for i in (0, 1)}, metrics
    assert all(m["extra"]["gpu"]["name"] == "NVIDIA H100 80GB HBM3" for m in metrics)


def test_pin_indexes_into_the_outer_visible_devices() -> None:
    env = {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "4,6"}
    assert gpu_pool.pin_this_worker(env) == "6"
    assert env["CUDA_VISIBLE_DEVICES"] == "6" == env[gpu_pool.PINNED_ENV]
    assert gpu_pool.pin_this_worker(env) == "6"  # a pytest started by that worker: unchanged
    env = {"PYTEST_XDIST_WORKER": "gw2", "CUDA_VISIBLE_DEVICES": "4,6"}
    assert gpu_pool.pin_this_worker(env) == "4"  # more workers than GPUs: they share
    assert gpu_pool.pin_this_worker({"CUDA_VISIBLE_DEVICES": "4,6"}) is None  # not a worker
    no_gpu = {"PYTEST_XDIST_WORKER": "gw0", "CUDA_VISIBLE_DEVICES": ""}
    assert gpu_pool.pin_this_worker(no_gpu) is None and "CUDA_VISIBLE_DEVICES" in no_gpu
    with pytest.raises(gpu_pool.PoolError, match="worker number"):
        gpu_pool.pin_this_worker({"PYTEST_XDIST_WORKER": "main", "CUDA_VISIBLE_DEVICES": "0"})


def test_physical_gpu_of_a_device() -> None:
    assert gpu_pool.physical("cuda:0", {gpu_pool.PINNED_ENV: "6"}) == "6"
    assert gpu_pool.physical("cuda:1", {"CUDA_VISIBLE_DEVICES": "3,5"}) == "5"
    assert gpu_pool.physical("cuda:1", {}) == "1"
    assert gpu_pool.physical("cpu", {}) is None and gpu_pool.physical("sim", {}) is None


_waiting: list[threading.Thread] = []


def _acquired_within(locks: gpu_pool.DeviceLocks, gpu: str | None, seconds: float) -> bool:
    """Whether another thread gets ``gpu``'s locks within ``seconds`` (a thread still waiting
    takes them later and lets go at once)."""
    got = threading.Event()
    release = threading.Event()

    def take() -> None:
        with locks.hold(gpu):
            got.set()
            release.wait(10)

    t = threading.Thread(target=take, daemon=True)
    t.start()
    ok = got.wait(seconds)
    release.set()
    if ok:
        t.join(10)
    else:
        _waiting.append(t)
    return ok


def test_timing_locks_are_per_gpu_and_the_host_clock_excludes_all(tmp_path: Path) -> None:
    locks = gpu_pool.DeviceLocks(str(tmp_path / "perf-timing"))
    with locks.hold("0"):
        assert _acquired_within(locks, "1", 5.0)  # another GPU: at once
        assert not _acquired_within(locks, "0", 0.3)  # the same GPU: waits
        assert not _acquired_within(locks, None, 0.3)  # a cpu timing test: waits
    with locks.hold(None):
        assert not _acquired_within(locks, "1", 0.3)
    for t in _waiting:
        t.join(10)
    assert _acquired_within(locks, None, 5.0)  # everything released
    assert sorted(Path(p).name for p in locks.files()) == [
        "perf-timing.gpu-0", "perf-timing.gpu-1", "perf-timing.host"
    ]  # fmt: skip


def test_a_nested_hold_in_the_same_thread_does_not_wait_on_itself(tmp_path: Path) -> None:
    """A timing test that runs an in-process pytest whose timing items take the same locks:
    flock is per open file, so reopening the host lock would wait forever on the outer hold."""
    locks = gpu_pool.DeviceLocks(str(tmp_path / "perf-timing"))
    done = threading.Event()

    def nested() -> None:
        with locks.hold(None), locks.hold(None), locks.hold("0"):
            done.set()

    t = threading.Thread(target=nested, daemon=True)
    t.start()
    assert done.wait(5.0), "a nested hold waited on its own lock"
    t.join(5)
    with locks.hold("0"):
        assert not _acquired_within(locks, None, 0.3)  # another thread still waits
    for w in _waiting:
        w.join(10)
    assert _acquired_within(locks, None, 5.0)  # all released after the nested holds
