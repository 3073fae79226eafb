"""Checkpointing on ``sim`` as on CUDA: ``torch.save`` / ``torch.load`` (``map_location`` to
``sim`` and to ``cpu``), pickling and ``copy.deepcopy`` of tensors, modules, state dicts and
optimizer states, with CUDA's copy counts (one blocking copy per distinct storage)."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

import perf
from perf.sim.device import unavailable_reason

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None,
    reason=f"simulated device unavailable: {unavailable_reason()}",
)


def _trained(dev: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3)).to(dev)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 4, device=dev)).sum().backward()
    opt.step()
    return m, opt


def _equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k].cpu(), b[k].cpu())


def test_issue_repro_state_dict_save() -> None:
    dev = perf.simulated_device()
    m = torch.nn.Linear(4, 3).to(dev)
    torch.save(m.state_dict(), io.BytesIO())  # raised "invalid python storage"


@pytest.mark.parametrize("where", ["default", "sim", "cpu"])
def test_save_load_model_and_optimizer(where: str) -> None:
    dev = perf.simulated_device()
    m, opt = _trained(dev)
    buf = io.BytesIO()
    with perf.count_syncs(dev) as s, perf.count_transfers() as t:
        torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, buf)
    # 4 parameters + 2 x 4 Adam moments: one blocking device-to-host copy each
    # (serialization.py _save: storage.cpu() for every non-CPU storage); Adam's `step`
    # tensors are host tensors on CUDA too
    assert (s.count, t.d2h_copies, t.h2d_copies) == (12, 12, 0)
    buf.seek(0)
    location = {"default": None, "sim": dev, "cpu": "cpu"}[where]
    with perf.count_syncs(dev) as s, perf.count_transfers() as t:
        ck = torch.load(buf, map_location=location)
    expected_dev = torch.device("cpu") if where == "cpu" else dev
    assert ck["model"]["0.weight"].device == expected_dev
    assert ck["opt"]["state"][0]["exp_avg"].device == expected_dev
    # loading onto the device: one blocking host-to-device copy per device storage (and the
    # 4 host `step` tensors too where map_location sends everything to the device)
    expected_h2d = {"default": 12, "sim": 16, "cpu": 0}[where]
    assert (s.count, t.h2d_copies) == (expected_h2d, expected_h2d)
    _equal(ck["model"], m.state_dict())
    m2, opt2 = _trained(dev)
    m2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    _equal(m2.state_dict(), m.state_dict())
    torch.testing.assert_close(
        opt2.state[m2[0].weight]["exp_avg"].cpu(), opt.state[m[0].weight]["exp_avg"].cpu()
    )


def test_views_and_tied_weights_survive_a_round_trip() -> None:
    dev = perf.simulated_device()
    base = torch.arange(12.0, device=dev)
    view = base[2:8].view(2, 3)
    a, b = torch.nn.Linear(4, 4).to(dev), torch.nn.Linear(4, 4).to(dev)
    b.weight = a.weight
    buf = io.BytesIO()
    torch.save({"view": view, "model": torch.nn.Sequential(a, b)}, buf)
    buf.seek(0)
    ck = torch.load(buf, weights_only=False)
    assert torch.equal(ck["view"].cpu(), torch.arange(2.0, 8.0).view(2, 3))
    assert ck["model"][0].weight is ck["model"][1].weight


def test_deepcopy_and_pickle() -> None:
    dev = perf.simulated_device()
    m, opt = _trained(dev)
    m2 = copy.deepcopy(m)
    _equal(m2.state_dict(), m.state_dict())
    assert m2[0].weight.device == dev
    with torch.no_grad():
        m2[0].weight.add_(1.0)  # a copy, not an alias
    assert not torch.equal(m2[0].weight.cpu(), m[0].weight.cpu())
    sd = copy.deepcopy(opt.state_dict())
    assert sd["state"][0]["exp_avg"].device == dev
    t = torch.arange(6.0, device=dev).view(2, 3)[:, 1:]
    t2 = pickle.loads(pickle.dumps(t))
    assert t2.device == dev and torch.equal(t2.cpu(), torch.tensor([[1.0, 2.0], [4.0, 5.0]]))
    buf = copy.deepcopy(torch.arange(3.0, device=dev))
    assert buf.device == dev and torch.equal(buf.cpu(), torch.arange(3.0))


def test_a_sim_checkpoint_loads_where_perf_is_not_installed(tmp_path):
    """Saved on sim, read by a plain torch process with map_location="cpu" (as a cuda
    checkpoint reads on a CPU-only box): the file holds standard storages and locations."""
    import subprocess
    import sys

    dev = perf.simulated_device()
    m = torch.nn.Linear(3, 2).to(dev)
    path = tmp_path / "ck.pt"
    torch.save(m.state_dict(), path)
    code = (
        "import torch, sys; sd = torch.load(sys.argv[1], map_location='cpu'); "
        "print(sd['weight'].device, tuple(sd['weight'].shape), float(sd['bias'].sum()))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:3] == ["cpu", "(2,", "3)"]
    assert float(proc.stdout.split()[-1]) == pytest.approx(float(m.bias.sum()))
