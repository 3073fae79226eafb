"""The GPU job, rehearsed on a CPU box (design: "the GPU job is rehearsed on every CPU run").

Each command the GPU runner executes runs here in a child process with CUDA reported present
(``PERF_REHEARSE_CUDA``, :mod:`perf.core.rehearse`): the collection of ``gpu.yml``'s two pytest
commands (the gated suite, ``tests/benchmarks``; perf's own tests, ``tests/harness``), read
from the workflow, with two H100s, and ``benchmarks/gpu_check.py``'s driver with one, up to
its first real CUDA call. Asserted: no collection errors, every CUDA-parametrized test on
each rehearsed GPU, every test that uses the simulated device skipped with a reason or running
it in a CPU-only child, and a valid results file when the run stops early. What only a GPU can
show is listed in docs/gpu.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from perf.core import rehearse

yaml = pytest.importorskip("yaml", reason="reading gpu.yml needs PyYAML (the test extra)")

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
GPU_YML = ROOT / ".github" / "workflows" / "gpu.yml"


def _step_command(step_id: str) -> str:
    """The pytest command of gpu.yml's step ``step_id``, with its continuation lines."""
    steps = yaml.safe_load(GPU_YML.read_text(encoding="utf-8"))["jobs"]["gpu"]["steps"]
    script = next(s["run"] for s in steps if s.get("id") == step_id)
    lines = script.splitlines()
    start = next(i for i, ln in enumerate(lines) if re.match(r"\s*(python3? -m )?pytest\s", ln))
    cmd = [lines[start]]
    while cmd[-1].rstrip().endswith("\\"):
        cmd.append(lines[start + len(cmd)])
    return "\n".join(cmd)


def _env(tmp: Path, devices: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CUDA_"))}
    env.pop(rehearse.ENV, None)
    rehearse.activate(devices, env)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(HERE)])
    env.update(PERF_STORE=str(tmp / "store"), PERF_TRACES=str(tmp / "traces"), **extra)
    return env


#: gpu.yml's two pytest steps: the gated suite, then perf's own tests
GPU_STEPS = ("suite", "harness")


@pytest.fixture(scope="module")
def gpu_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """gpu.yml's pytest commands (the suite's and the harness's steps), each collected with 2
    rehearsed GPUs (the suite as a PR run: compare)."""
    tmp = tmp_path_factory.mktemp("gpu_job")
    out: dict[str, Any] = {"commands": {}, "procs": {}, "items": [], "collect_skips": []}
    for step in GPU_STEPS:
        probe = tmp / f"probe_{step}.json"
        cmd = _step_command(step)
        script = f"mode=--benchmark-compare\n{cmd} --co -q -p _rehearse_probe -p no:cacheprovider\n"
        out["commands"][step] = cmd
        out["procs"][step] = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
            cwd=ROOT, env=_env(tmp, 2, REHEARSE_PROBE_OUT=str(probe)),
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        data = json.loads(probe.read_text()) if probe.exists() else {}
        out["items"] += data.get("items", [])
        out["collect_skips"] += data.get("collect_skips", [])
    return out


def test_the_gpu_job_collects_the_whole_suite_without_errors(gpu_job: dict[str, Any]) -> None:
    """Both steps collect without errors, and together they cover every test of the repo:
    the suite's step tests/benchmarks, the harness's step tests/harness."""
    for step, proc in gpu_job["procs"].items():
        assert proc.returncode == 0, (step, proc.stdout[-4000:] + proc.stderr[-2000:])
        assert re.search(r"^\d+ tests collected in ", proc.stdout, re.M), proc.stdout[-2000:]
        assert " error" not in proc.stdout.splitlines()[-1]
    assert "tests/benchmarks" in gpu_job["commands"]["suite"]
    assert "tests/harness" in gpu_job["commands"]["harness"]
    roots = {it["nodeid"].split("/")[1] for it in gpu_job["items"]}
    assert roots == {"benchmarks", "harness"}, roots
    assert len(gpu_job["items"]) > 500


def test_every_cuda_parametrized_test_runs_on_each_rehearsed_gpu(gpu_job: dict[str, Any]) -> None:
    devices: dict[str, set[str]] = defaultdict(set)
    for it in gpu_job["items"]:
        if it["device"] is not None:
            devices[it["nodeid"].replace(f"[{it['device']}]", "[]").replace(it["device"], "*")].add(
                it["device"]
            )
    seen = set().union(*devices.values())
    assert seen == {"cpu", "cuda:0", "cuda:1"}, seen  # no sim beside CUDA, no bare "cuda"
    on_cuda = {k: v for k, v in devices.items() if v & {"cuda:0", "cuda:1"}}
    assert len(on_cuda) >= 22, sorted(on_cuda)  # docs/gpu.md: the suite's CUDA tests
    partial = {k: sorted(v) for k, v in on_cuda.items() if not {"cuda:0", "cuda:1"} <= v}
    assert not partial, partial


def test_sim_tests_skip_with_a_reason_or_run_sim_in_a_cpu_only_child(
    gpu_job: dict[str, Any],
) -> None:
    items = gpu_job["items"]
    in_process = [it for it in items if it["sim"] == "in-process"]
    assert len(in_process) > 100  # the probe sees them (else this test could not fail)
    unskipped = [it["nodeid"] for it in in_process if it["skip"] is None]
    assert not unskipped, f"uses sim in a process with CUDA, not skipped: {unskipped}"
    silent = [it["nodeid"] for it in items if it["skip"] is not None and not it["skip"].strip()]
    assert not silent, f"skipped without a reason: {silent}"
    sim_reasons = {it["skip"] for it in in_process}
    assert all("this process has CUDA" in r for r in sim_reasons), sim_reasons


@pytest.fixture(scope="module")
def gpu_check(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """benchmarks/gpu_check.py with one rehearsed GPU, stopped at its first real CUDA call."""
    tmp = tmp_path_factory.mktemp("gpu_check")
    proc = subprocess.run(
        [sys.executable, "-m", "perf", "rehearse-cuda", "--devices", "1", "--",
         sys.executable, "benchmarks/gpu_check.py", "--out-dir", str(tmp / "results"),
         "--", "--perf-rehearse-stop", "-p", "no:cacheprovider"],
        cwd=ROOT, env=_env(tmp, 1), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    files = sorted((tmp / "results").glob("*.json"))
    return {"proc": proc, "files": files}


def test_gpu_check_stops_at_the_first_real_cuda_call_with_a_valid_result(
    gpu_check: dict[str, Any],
) -> None:
    proc = gpu_check["proc"]
    out = proc.stdout + proc.stderr
    assert len(gpu_check["files"]) == 1, out[-4000:]
    path = gpu_check["files"][0]
    assert path.name.startswith("rehearsal_gpu_NVIDIA-H100-80GB-HBM3_"), path.name
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
    assert spec is not None and spec.loader is not None
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert gc.validate(data) == [], data
    assert data["rehearsal"] == 1 and data["pytest_exit_code"] == 2  # stopped: "Interrupted"
    assert data["summary"] == {"passed": 0, "failed": 0, "skipped": 1, "error": 0}, data["tests"]
    (test,) = data["tests"]
    assert test["nodeid"].endswith("[cuda:0]")
    assert test["message"].startswith(rehearse.STOP_PREFIX + " at ")
    assert re.search(r"\.py:\d+", test["message"]), test["message"]
    gpus = data["fingerprint"]["gpus"]
    assert [g["name"] for g in gpus] == ["NVIDIA H100 80GB HBM3"] and gpus[0]["sm_count"] == 132
    assert "Interrupted: " + rehearse.STOP_PREFIX in out


def test_validate_names_what_is_wrong_with_a_result_file() -> None:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
    assert spec is not None and spec.loader is not None
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    assert gc.validate([]) == ["not a JSON object"]
    problems = gc.validate({"schema": "x", "tests": [{"nodeid": "t", "outcome": "odd"}]})
    assert "rehearsal: missing" in problems
    assert "schema: 'x', expected 'perf-gpu-check/1'" in problems
    assert any(p.startswith("test 't': bad") for p in problems)
    lines = [{"nodeid": "tests/x.py", "when": "collect", "outcome": "failed", "message": "boom"}]
    assert gc.tests_from_reports(lines) == [
        {"nodeid": "tests/x.py", "outcome": "error", "duration_s": 0.0, "metrics": [],
         "message": "boom"}
    ]  # fmt: skip


def test_the_fake_answers_as_an_h100_and_stops_at_the_first_real_call(tmp_path: Path) -> None:
    """In a child (the fake must never touch this process's torch)."""
    code = (
        "import torch, perf\n"
        "p = torch.cuda.get_device_properties(1)\n"
        "print(torch.cuda.is_available(), torch.cuda.device_count(), p.name, p.major, p.uuid)\n"
        "print(len(perf.fingerprint()['gpus']))\n"
        "try:\n"
        "    torch.ones(1, device='cuda')\n"
        "except BaseException as e:\n"
        "    print(type(e).__name__, e)\n"
        "import os\n"
        "os.environ['CUDA_VISIBLE_DEVICES'] = ''\n"  # every device hidden: a CPU-only process
        "try:\n"
        "    torch.cuda.current_device()\n"
        "except BaseException as e:\n"
        "    print(torch.cuda.is_available(), type(e).__name__)\n"
    )
    env = _env(tmp_path, 3, CUDA_VISIBLE_DEVICES="2,0,7")
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    first, count, stop, hidden = proc.stdout.splitlines()
    # CUDA_VISIBLE_DEVICES=2,0,7 of 3 devices: 2 and 0 (the list ends at 7); cuda:1 is GPU 0
    assert first == "True 2 NVIDIA H100 80GB HBM3 9 " + rehearse.properties(0).uuid
    assert count == "2"
    assert stop.startswith(f"CudaRehearsalStop {rehearse.STOP_PREFIX} at <string>:6 ")
    # the build's own answer, not the rehearsal's: a CPU build has no CUDA to initialise
    # (is_built, not torch.version.cuda, which a rehearsal of this process would fake)
    own = "RuntimeError" if torch.backends.cuda.is_built() else "AssertionError"
    assert hidden == f"False {own}"


def test_sim_inside_a_rehearsal_runs_each_sitecustomize_once_and_answers_over_it(
    tmp_path: Path,
) -> None:
    """gpu.yml's harness step runs `python -m perf sim -- ...` (docs/sim.md's commands) with
    the rehearsal's folder on PYTHONPATH: both `sitecustomize` folders, and a user's after them.
    They ran each other until the recursion limit ("Error in sitecustomize", the rehearsal's
    fake installed over `--as-cuda`: "needs 2 GPUs, found 0")."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('user site')\n")
    env = _env(tmp_path, 2)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(site)])
    code = (
        "import torch\n"
        "x = torch.ones(2, device='sim:1')\n"
        "print(torch.cuda.device_count(), torch.cuda.is_available(), x.device, torch.version.cuda)"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "perf", "sim", "--devices", "2", "--as-cuda", "--",
         sys.executable, "-c", code],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "sitecustomize" not in proc.stderr, proc.stderr
    # once in `perf sim`'s process, once in the child; sim's 2 devices answer for CUDA, over a
    # CUDA build (the rehearsal's version) whose devices `perf sim` hides
    assert proc.stdout.splitlines() == [
        "user site",
        "user site",
        f"2 False sim:1 {rehearse.CUDA_VERSION}",
    ], proc.stdout


def test_visible_devices_parse_as_the_cuda_driver_does() -> None:
    assert rehearse.visible(2, None) == [0, 1]
    assert rehearse.visible(2, "") == [] and rehearse.visible(2, "-1") == []
    assert rehearse.visible(4, "3, 1") == [3, 1]
    assert rehearse.visible(4, "1,1,2") == [1]  # a repeated device ends the list
    assert rehearse.visible(4, rehearse.properties(2).uuid) == [2]
    assert rehearse.visible(4, "GPU-5e4ea75e") == []  # a prefix of every device: ambiguous
    with pytest.raises(ValueError, match="1 to 8"):
        rehearse.parse_count("9")
    assert rehearse.parse_count(None) == 0 and rehearse.parse_count("2") == 2


def test_the_gpu_jobs_cuda_check_and_cache_key_steps_see_the_rehearsed_gpus(
    tmp_path: Path,
) -> None:
    """gpu.yml's own `CUDA must be visible` and cache-key scripts, run as GitHub runs them."""
    if torch.backends.cuda.is_built():  # not torch.version.cuda: a rehearsal fakes that
        pytest.skip(
            f"torch {torch.__version__} is a CUDA {torch.version.cuda} build: the steps read its "
            "real CUDA version, where this test checks the rehearsal's (a CPU build's stand-in)"
        )
    from test_workflows import GPU, _run_step, _step

    env: dict[str, str] = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    rehearse.activate(2, env)
    proc, _ = _run_step(_step(GPU, "gpu", name="CUDA must be visible"), tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "cuda:1: NVIDIA H100 80GB HBM3" in proc.stdout
    fingerprint = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert [g["capability"] for g in fingerprint["gpus"]] == ["9.0", "9.0"]
    assert fingerprint["cuda"] == rehearse.CUDA_VERSION == "12.8"
    # a pool that asks for another CUDA build than the one installed is refused
    from test_workflows import CONTEXT

    proc, _ = _run_step(
        _step(GPU, "gpu", name="CUDA must be visible"),
        tmp_path,
        env=env,
        context={**CONTEXT, "matrix.torch_cuda": "cu130"},
    )
    assert proc.returncode != 0
    assert "is a CUDA 12.8 build, but this pool asks for cu130" in proc.stderr
    env.update(GITHUB_RUN_ID="777", GITHUB_RUN_ATTEMPT="1")
    proc, out = _run_step(_step(GPU, "gpu", id="key"), tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert out["prefix"].startswith("perf-gpu-2xNVIDIA-H100-80GB-HBM3-"), out
