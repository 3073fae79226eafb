"""CUDA-named AMP on ``sim`` (perf/sim/amp.py): with ``as_cuda`` / ``PERF_SIM_AS_CUDA=1``, a
step written with ``torch.cuda.amp`` or ``torch.autocast("cuda")`` autocasts on ``sim``, its
scaler is enabled, and its syncs are those of the same step written for ``sim``. Each case runs
in a child process: the opt-in changes torch's AMP classes for the whole process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from _sim import needs_sim

from perf.sim import amp

pytestmark = needs_sim

_LOOP = textwrap.dedent(
    """
    import json, os, sys, warnings
    import torch
    from torch.nn import functional as F
    import perf

    warnings.simplefilter("ignore", FutureWarning)  # torch.cuda.amp's deprecation
    style = sys.argv[1]
    sim = perf.simulated_device(as_cuda=os.environ.get("AS_CUDA_ARG") == "1")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    ).to(sim)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if style == "cuda.amp":
        scaler = torch.cuda.amp.GradScaler()
        cast = lambda: torch.cuda.amp.autocast()
    elif style == "amp-cuda":
        scaler = torch.amp.GradScaler("cuda")
        cast = lambda: torch.autocast("cuda", dtype=torch.float16)
    elif style == "keywords":
        scaler = torch.amp.GradScaler(device="cuda")
        cast = lambda: torch.autocast(device_type="cuda")
    else:
        scaler = torch.amp.GradScaler("sim")
        cast = lambda: torch.autocast("sim", dtype=torch.float16)
    X, y = torch.randn(16, 8).to(sim), torch.randint(0, 3, (16,)).to(sim)
    dtypes = []
    with perf.count_syncs() as s:
        for step in range(1, 7):
            opt.zero_grad(set_to_none=True)
            with cast():
                out = model(X)
                dtypes.append(str(out.dtype))
                loss = F.cross_entropy(out, y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if step % 3 == 0:
                loss.item()
    print(json.dumps({"enabled": scaler.is_enabled(), "syncs": s.by_op,
                      "dtypes": sorted(set(dtypes)),
                      "weight": model[0].weight.sum().item()}))
    """
)


def _run(style: str, *, env: dict[str, str] | None = None, arg: bool = False) -> dict:
    child_env = {k: v for k, v in os.environ.items() if k != amp.ENV}
    child_env.update(env or {})
    child_env["AS_CUDA_ARG"] = "1" if arg else "0"
    proc = subprocess.run(
        [sys.executable, "-c", _LOOP, style],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cuda_named_amp_counts_as_the_same_step_on_sim() -> None:
    ref = _run("sim")
    assert ref["enabled"] and ref["syncs"] == {"item": 8}  # 6 scaler reads + 2 loss.item()
    got = _run("cuda.amp", arg=True)
    assert got == ref | {"dtypes": got["dtypes"]}
    assert got["dtypes"] == ["torch.float16"]


@pytest.mark.parametrize("style", ["amp-cuda", "keywords"])
def test_cuda_named_amp_through_the_environment(style: str) -> None:
    got = _run(style, env={amp.ENV: "1"})
    assert got["enabled"] and got["syncs"] == {"item": 8}
    assert got["dtypes"] == ["torch.float16"]


def test_without_the_opt_in_cuda_named_amp_stays_disabled_as_torch_has_it() -> None:
    got = _run("cuda.amp")
    assert not got["enabled"] and got["syncs"] == {"item": 2}
    assert got["dtypes"] == ["torch.float32"]


def test_a_bad_environment_value_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(amp.ENV, "maybe")
    with pytest.raises(ValueError, match="PERF_SIM_AS_CUDA='maybe'"):
        amp.requested()
    monkeypatch.setenv(amp.ENV, "0")
    assert not amp.requested() and amp.requested(as_cuda=True)
