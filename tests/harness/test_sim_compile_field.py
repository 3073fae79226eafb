"""``benchmarks/field_compile_sim.py`` on a tiny training program written here: it runs the
program compiled on ``sim`` in a fresh process and prints whether it ran and its counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "field_compile_sim.py"

PROGRAM = """
import sys
import torch

device = torch.device(sys.argv[1])  # "sim": installed by the field script
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
model.to(device)                                    # 4 blocking parameter copies
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
net = torch.compile(model)
data = torch.randn(5, 4, 8)
for step in range(5):
    x = data[step].to(device)                       # 1 blocking copy per step
    loss = net(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step % 2 == 0:
        print(f"step {step} loss {loss.item():.4f}")  # steps 0, 2, 4: one sync each
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),  # sim needs a CPU-only child
    )


def _report(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout[proc.stdout.index("{\n") :])


def test_field_script_runs_a_compiled_program_on_sim_and_prints_its_counts(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    report = _report(_run(tmp_path, "train.py", "sim"))
    assert report["ran"] is True and report["error"] is None
    # derived for cuda:0: 4 + 5 blocking host-to-device copies, 3 loss.item()
    assert report["syncs_by_op"] == {"h2d_copy": 9, "item": 3}
    assert (report["h2d_copies"], report["d2h_copies"]) == (9, 0)
    assert report["syncs_by_site"] == {"train.py:8": 4, "train.py:13": 5, "train.py:19": 3}
    compiled = report["compile"]
    assert isinstance(compiled, dict)
    assert (compiled["graphs"], compiled["graph_breaks"], compiled["recompiles"]) == (1, 0, 0)


def test_field_script_reports_a_program_that_fails(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        PROGRAM.replace("torch.randn(5, 4, 8)", "torch.randn(5, 4, 9)")
    )
    report = _report(_run(tmp_path, "train.py", "sim"))
    assert report["ran"] is False
    # Dynamo meets the bad shape while tracing (on fake tensors), as it would on CUDA
    assert str(report["error"]).startswith("TorchRuntimeError: RuntimeError when making fake")


def test_field_script_without_a_checkout_prints_its_usage(tmp_path: Path) -> None:
    proc = _run(tmp_path / "missing", "train.py")
    assert proc.returncode == 2
    assert "is not a folder" in proc.stdout
