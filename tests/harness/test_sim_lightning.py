"""Lightning's ``Trainer`` on ``sim`` (``perf.sim.lightning``): one device in this process, DDP
over two simulated devices in a CPU-only child, each against the same training on the CPU.

Lightning's own ``accelerator="auto"`` trains on the CPU on a box without CUDA; the test of
that fact is the reason the module exists (the last test).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _sim import SIM, needs_sim

import perf

L = pytest.importorskip(
    "lightning", reason="needs Lightning (the 'lightning' extra: pip install -e '.[lightning]')"
)

ROOT = Path(__file__).resolve().parents[2]

MODULE = """
import torch
import lightning as L


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
        )
        self.devices_seen = set()
        self.dtypes_seen = set()

    def training_step(self, batch, i):
        x, y = batch
        self.devices_seen.add(str(self.net[0].weight.device))
        out = self.net(x)
        self.dtypes_seen.add(str(out.dtype))
        loss = torch.nn.functional.cross_entropy(out, y)
        self.last_loss = loss.item()  # one sync a step, on CUDA as on sim
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), 1e-2)


def loader():
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(
        torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)
    )
    return torch.utils.data.DataLoader(ds, batch_size=8)


QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False,
             enable_model_summary=False, max_steps=6)
"""


def _module() -> Any:
    ns: dict[str, Any] = {}
    exec(compile(MODULE, "lightning_module.py", "exec"), ns)
    return ns


def _fit(ns: dict[str, Any], **trainer: Any) -> Any:
    net = ns["Net"]()
    L.Trainer(**trainer, **ns["QUIET"]).fit(net, ns["loader"]())
    return net


@needs_sim
def test_one_sim_device_trains_as_the_cpu_does_and_counts_the_steps_syncs() -> None:
    from perf.sim.lightning import sim_trainer_kwargs

    ns = _module()
    cpu = _fit(ns, accelerator="cpu", devices=1)
    with perf.count_syncs(SIM) as s:
        sim = _fit(ns, **sim_trainer_kwargs(devices=1))
    assert sim.devices_seen == {"sim:0"} and cpu.devices_seen == {"cpu"}
    for a, b in zip(sim.parameters(), cpu.parameters(), strict=True):
        assert torch.equal(a.detach().cpu(), b.detach())
    assert sim.last_loss == cpu.last_loss
    at = {k.rsplit(":", 1)[0].rsplit("/", 1)[-1]: n for k, n in s.by_site.items()}
    assert s.by_site and s.by_op["item"] == 6, s.by_op  # the module's loss.item(), each step
    assert at.get("lightning_module.py") == 6, s.by_site


@needs_sim
@pytest.mark.parametrize("given_to", ["trainer", "sim_trainer_kwargs"])
@pytest.mark.parametrize(
    ("precision", "dtype", "scaler_reads"),
    [("bf16-mixed", "torch.bfloat16", 0), ("16-mixed", "torch.float16", 6)],
)
def test_mixed_precision_autocasts_on_sim_with_a_sim_grad_scaler(
    precision: str, dtype: str, scaler_reads: int, given_to: str
) -> None:
    """Lightning autocasts for "cuda" off the CPU and MPS (on ``sim`` tensors: nothing, fp32)
    and its ``GradScaler("cuda")`` is disabled without CUDA; on ``sim`` the layers run in the
    precision's dtype and 16-mixed's scaler reads its inf check once a step, as on CUDA."""
    from perf.sim.lightning import sim_trainer_kwargs

    ns = _module()
    if given_to == "trainer":
        kw = {**sim_trainer_kwargs(devices=1), "precision": precision}
    else:
        kw = sim_trainer_kwargs(devices=1, precision=precision)
    with perf.count_syncs(SIM) as s:
        net = _fit(ns, **kw)
    assert net.dtypes_seen == {dtype}
    assert s.by_op["item"] == 6 + scaler_reads, s.by_op  # + the module's loss.item()
    with pytest.raises(ValueError, match="'16-mixed' or 'bf16-mixed'"):
        sim_trainer_kwargs(precision="16-true")


@needs_sim
def test_bad_devices_and_packages_are_refused_naming_what_to_do() -> None:
    from perf.sim.lightning import sim_accelerator_class, sim_trainer_kwargs

    with pytest.raises(ValueError, match=r"devices=2: there are 1 simulated device\(s\)"):
        sim_trainer_kwargs(devices=2)
    with pytest.raises(ValueError, match=r"the simulated devices are sim:0..0"):
        sim_trainer_kwargs(devices=[1])
    with pytest.raises(ValueError, match="package must be one of lightning, pytorch_lightning"):
        sim_trainer_kwargs(package="lightning_fabric")
    acc = sim_accelerator_class()()
    with pytest.raises(ValueError, match="places a single-device run of a custom accelerator"):
        acc.setup_device(torch.device("cpu"))
    assert acc.auto_device_count() == 1 and acc.name() == "sim"
    assert acc.get_parallel_devices("auto") == [torch.device("sim", 0)]
    assert "allocated_bytes.all.current" in acc.get_device_stats(SIM)


DDP_SCRIPT = (
    MODULE
    + """
import sys
import perf

if __name__ == "__main__":
    if sys.argv[1] == "sim":
        from perf.sim.lightning import sim_trainer_kwargs

        dev = perf.simulated_device(count=2)
        trainer = L.Trainer(**sim_trainer_kwargs(devices=2), **QUIET)
    else:
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", **QUIET)
    net = Net()
    trainer.fit(net, loader())
    sums = [round(float(p.detach().cpu().double().sum()), 12) for p in net.parameters()]
    with open(f"{sys.argv[1]}-rank{trainer.global_rank}.txt", "w") as f:  # ranks share stdout
        f.write(f"RANK {trainer.global_rank} {sorted(net.devices_seen)} {sums}")
"""
)


def test_ddp_over_two_sim_devices_trains_as_ddp_over_two_cpu_processes(tmp_path: Path) -> None:
    """Lightning starts rank 1 by running the script again; the sim run and the CPU (gloo)
    run end with the same parameters on both ranks, each rank on its own device."""
    script = tmp_path / "train_ddp.py"
    script.write_text(DDP_SCRIPT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PERF_SIM"))}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the simulated device runs in a CPU-only process
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = {}
    for side in ("sim", "cpu"):
        proc = subprocess.run(
            [sys.executable, str(script), side], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        out[side] = [(tmp_path / f"{side}-rank{r}.txt").read_text() for r in (0, 1)]
    assert [ln.split(" ", 2)[1:] for ln in out["sim"]] == [
        ["0", "['sim:0'] " + out["cpu"][0].split("['cpu'] ")[1]],
        ["1", "['sim:1'] " + out["cpu"][1].split("['cpu'] ")[1]],
    ]


@needs_sim
def test_lightning_auto_trains_on_the_cpu_beside_sim() -> None:
    """Why the module exists: Lightning picks its own device, and on a box without CUDA that
    is the CPU, whatever ``sim`` is; a count around it counts no device work."""
    ns = _module()
    with perf.count_syncs(SIM) as s:
        net = _fit(ns, accelerator="auto", devices=1)
    assert net.devices_seen == {"cpu"} and s.count == 0
