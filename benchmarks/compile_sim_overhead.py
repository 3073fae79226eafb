"""Cost of ``torch.compile`` on the simulated device: compiled-on-sim vs compiled-on-cpu.

A benchmark, not a test: ``python benchmarks/compile_sim_overhead.py [--out results.json]``.
One training step (forward, backward, AdamW step) of a small nanoGPT-shaped model
(``--layers`` blocks of width ``--width``, batch 8 x 64 tokens) and of a 3-layer MLP, each timed
with ``perf.compare`` (interleaved pairs, 95% interval of the median ratio) as:

- compiled on sim / compiled on cpu: what counting a compiled program on a CPU-only box costs
  over running the same compiled program on the CPU (Inductor's C++ kernels there; on ``sim``
  the graphs' aten ops run one by one through the simulated device);
- eager on sim / eager on cpu: the simulation's cost without compile, for reference;
- compiled on sim / eager on sim.

Compile time is excluded (each side is warmed up, compiled, before timing). On a shared box the
pairs still share its load alike; the figures say so in the output.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import perf
from perf.workloads.models import TransformerBlock


class GPT(torch.nn.Module):
    def __init__(self, layers: int, d: int, vocab: int = 65, ctx: int = 64) -> None:
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(ctx, d)
        blocks = [TransformerBlock(d, max(1, d // 16)) for _ in range(layers)]
        self.blocks = torch.nn.Sequential(*blocks)
        self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


def _step(model: torch.nn.Module, device: Any, compiled: bool, x: Any, y: Any) -> Callable[[], Any]:
    model = copy.deepcopy(model).to(device)
    net = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = x.to(device), y.to(device)

    def step() -> None:
        out = net(x)
        F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(3):  # compile (both graphs) and warm up outside the timing
        step()
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=21)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sim = perf.simulated_device()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    workloads = {
        f"gpt{args.layers}x{args.width}": (
            GPT(args.layers, args.width),
            torch.randint(0, 65, (8, 64), generator=g),
            torch.randint(0, 65, (8, 64), generator=g),
        ),
        "mlp512": (
            torch.nn.Sequential(
                torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                torch.nn.ReLU(), torch.nn.Linear(512, 10),
            ),
            torch.randn(256, 256, generator=g),
            torch.randint(0, 10, (256,), generator=g),
        ),
    }  # fmt: skip
    results: dict[str, Any] = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "note": "shared 2-core box, other jobs running: ratios are paired, absolute times noisy",
    }
    for name, (model, x, y) in workloads.items():
        steps = {
            (dev, compiled): _step(model, dev, compiled, x, y)
            for dev in ("cpu", sim)
            for compiled in (False, True)
        }
        rows = {}
        for label, a, b in [
            ("compiled_sim/compiled_cpu", (sim, True), ("cpu", True)),
            ("eager_sim/eager_cpu", (sim, False), ("cpu", False)),
            ("compiled_sim/eager_sim", (sim, True), (sim, False)),
            ("compiled_cpu/eager_cpu", ("cpu", True), ("cpu", False)),
        ]:
            c = perf.compare(steps[a], steps[b], pairs=args.pairs)
            rows[label] = {
                "ratio": round(c.ratio, 3),
                "ci95": [round(v, 3) for v in c.ci],
                "a_median_s": c.a.median_s,
                "b_median_s": c.b.median_s,
            }
            print(
                f"{name:10s} {label:28s} {c.ratio:6.2f}x  95% CI [{c.ci[0]:.2f}, {c.ci[1]:.2f}]"
                f"  ({c.a.median_s * 1e3:.1f} ms vs {c.b.median_s * 1e3:.1f} ms)",
                flush=True,
            )
        results[name] = rows
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
