"""Every instrument leaves the program it measures alone: the same values, the same random
stream, whether or not it is inside the block.

Why: a counter that changes what it counts is worse than none. ``count_syncs`` did: its
one-time probe of torch's ``multinomial`` drew from the program's generator, and
stable-baselines3's A2C trained to other weights under it. One-time work (probes, imports,
caches) happens on first use in a process, so the program runs in a fresh child, first under
every instrument at once, then plain with the same seed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from perf.sim.device import unavailable_reason

CHILD = textwrap.dedent(
    """
    import contextlib, hashlib, json, sys
    import torch, perf
    dev = perf.simulated_device()

    def program():
        # a stochastic training loop: dropout, sampled actions, a shuffle, noise, a mask
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.2),
                                  torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(dev)
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        x = torch.randn(32, 4).to(dev)
        out = []
        for _ in range(3):
            order = torch.randperm(32, device=dev)
            logits = net(x[order] + 0.1 * torch.randn(32, 4, device=dev))
            act = torch.distributions.Categorical(logits=logits).sample()
            loss = torch.nn.functional.cross_entropy(logits, act)
            loss = loss + logits[act == 0].sum() * 0.0
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        params = torch.cat([p.detach().cpu().flatten() for p in net.parameters()])
        state = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()
        return {"losses": out, "params": params.tolist(), "rng": state,
                "next": torch.rand(2).tolist()}

    with contextlib.ExitStack() as stack:
        for cm in (perf.count_syncs(dev), perf.count_transfers(), perf.count_ops(dev),
                   perf.count_flops(), perf.model_gpu_time(dev), perf.peak_memory(dev),
                   perf.saved_activations(), perf.count_compiles()):
            stack.enter_context(cm)
        measured = program()
    plain = program()
    print(json.dumps({"measured": measured, "plain": plain}))
    """
)


def test_every_instrument_leaves_values_and_the_random_stream_alone() -> None:
    reason = unavailable_reason(allow_with_accelerator=True)
    if reason is not None:
        pytest.skip(f"needs the simulated device: {reason}")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # sim in a CPU-only child, on any box
    r = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["measured"] == got["plain"]
