"""Scripts that name CUDA and NCCL on ``sim`` (``perf/sim/cuda_names.py``): with the
``as_cuda`` opt-in, ``torch.cuda.set_device`` / ``current_device`` / ``device_count``,
``init_process_group("nccl")`` and ``torch.load(map_location="cuda:N")`` act on ``sim``.

The two-process facts come from docs/sim.md's command, run exactly as written in a CPU-only
child. The mappings patch torch for the whole process, so the unit cases (a snapshot loaded
with a CUDA ``map_location`` among them) run in a child process too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="needs torch.distributed with gloo (the sim backend rides it)",
)


def _documented_command() -> str:
    section = (ROOT / "docs" / "sim.md").read_text().split("### Scripts that name CUDA and NCCL")[1]
    m = re.search(r"```bash\n(python -m perf sim .*?)```", section, re.S)
    assert m, "docs/sim.md's section shows the torchrun command"
    return m.group(1)


def _cpu_only_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERF_SIM")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", **extra)
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """docs/sim.md's command as written."""
    tmp = tmp_path_factory.mktemp("cuda_names")
    (tmp / "benchmarks").symlink_to(ROOT / "benchmarks")
    results = []
    for _ in range(1):
        proc = subprocess.run(
            ["bash", "-c", _documented_command()], cwd=tmp, env=_cpu_only_env(),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        results.append({
            "ranks": [json.loads((tmp / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)],
            "counts": [json.loads((tmp / "counts" / f"collectives-rank{r}.json").read_text())
                       for r in (0, 1)],
        })  # fmt: skip
    return results


def test_a_script_naming_cuda_and_nccl_trains_on_two_sim_devices(runs: list[dict]) -> None:
    for run in runs:
        ranks = run["ranks"]
        assert [r["device"] for r in ranks] == ["sim:0", "sim:1"]
        assert [r["current_device"] for r in ranks] == [0, 1]
        assert {r["backend"] for r in ranks} == {"sim"}
        # all-reduced gradients: both ranks hold the same weights after different batches
        assert ranks[0]["weight_sum"] == pytest.approx(ranks[1]["weight_sum"], abs=1e-6)


def test_the_run_saved_a_snapshot_for_the_next_to_resume_from(runs: list[dict]) -> None:
    assert [r["resumed_at"] for r in runs[0]["ranks"]] == [0, 0]
    assert [r["saved"] for r in runs[0]["ranks"]] == [2, 2]  # --epochs 2 by default


def test_every_step_all_reduces_every_gradient_once_as_on_nccl(runs: list[dict]) -> None:
    for run in runs:
        r = run["ranks"][0]
        for c in run["counts"]:
            assert c["calls"]["allreduce"] == r["steps"], c  # one bucket per step
            assert c["bytes"]["allreduce"] == r["steps"] * r["params"] * 4, c


_PROBE = textwrap.dedent(
    """
    import json, os, torch, perf
    import torch.distributed as dist
    from perf.sim.cuda_names import backend_for, location_for

    sim = perf.simulated_device(count=2)
    out = {"count": torch.cuda.device_count()}
    try:
        torch.cuda.set_device(1)
        out["set"] = str(torch.empty(1, device="sim").device)
        out["current"] = torch.cuda.current_device()
    except Exception as e:
        out["set"] = type(e).__name__
    try:
        torch.cuda.set_device(2)
    except Exception as e:
        out["past_the_end"] = str(e).split(" (")[0]
    out["backends"] = [backend_for(b) for b in ("nccl", "NCCL", "gloo", "cpu:gloo,cuda:nccl")]
    out["locations"] = [str(location_for(w)) for w in
                        ("cuda:1", torch.device("cuda", 0), "cuda", "cpu", None)]
    out["location_dict"] = {k: str(v) for k, v in location_for({"cuda:0": "cuda:1"}).items()}
    torch.save({"w": torch.ones(2, device=sim)}, os.environ["SNAP"])
    try:
        out["loaded"] = str(torch.load(os.environ["SNAP"], map_location="cuda:1")["w"].device)
    except Exception as e:
        out["loaded"] = type(e).__name__
    store = dist.FileStore(os.environ["STORE"], 1)
    try:
        dist.init_process_group("nccl", store=store, rank=0, world_size=1)
        out["group"] = dist.get_backend()
        dist.destroy_process_group()
    except Exception as e:
        out["group"] = type(e).__name__
    print(json.dumps(out))
    """
)


def _probe(tmp_path: Path, **env: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300,
        env=_cpu_only_env(STORE=str(tmp_path / "store"), SNAP=str(tmp_path / "s.pt"), **env),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_with_the_opt_in_cuda_names_mean_sim(tmp_path: Path) -> None:
    got = _probe(tmp_path, PERF_SIM_AS_CUDA="1")
    assert got["count"] == 2
    assert (got["set"], got["current"]) == ("sim:1", 1)
    assert got["past_the_end"] == "CUDA error: invalid device ordinal"
    assert got["backends"] == ["sim", "sim", "gloo", "cpu:gloo,sim:sim"]
    assert got["locations"] == ["sim:1", "sim:0", "sim", "cpu", "None"]
    assert got["location_dict"] == {"cuda:0": "sim:1"}
    assert got["loaded"] == "sim:1"  # a snapshot resumed with map_location=f"cuda:{rank}"
    assert got["group"] == "sim"


def test_without_the_opt_in_cuda_names_stay_cudas(tmp_path: Path) -> None:
    """As torch has it on a CPU-only box: no device, set_device fails, no NCCL."""
    got = _probe(tmp_path)
    assert got["count"] == 0
    assert got["set"] in ("AttributeError", "RuntimeError", "AssertionError")
    assert got["backends"] == ["nccl", "NCCL", "gloo", "cpu:gloo,cuda:nccl"]
    assert got["locations"] == ["cuda:1", "cuda:0", "cuda", "cpu", "None"]
    assert got["loaded"] == "RuntimeError"  # "Attempting to deserialize object on a CUDA device"
    assert got["group"] != "sim"
