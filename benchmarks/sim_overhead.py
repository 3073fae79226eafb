"""What the simulated device costs: one training step (forward, backward, AdamW step) of three
small real-ish models on ``sim`` against the same step on plain CPU tensors, interleaved.

``python benchmarks/sim_overhead.py [--steps N] [--profile MODEL]``

Prints per model the median step time on each side and the ratio sim / cpu with a bootstrap
95% interval over the paired steps. ``--profile cnn|transformer|lstm`` prints where the
simulation's time goes (cProfile of 10 sim steps, top functions by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

import perf


class SmallResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(32, 32, 3, padding=1),
                nn.BatchNorm2d(32),
                nn.ReLU(),
                nn.Conv2d(32, 32, 3, padding=1),
                nn.BatchNorm2d(32),
            )
            for _ in range(3)
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.blocks:
            x = torch.relu(x + b(x))
        return self.head(x.mean((2, 3)))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 256, d: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.size(1), device=x.device)
        return self.head(self.enc(self.emb(x), mask=mask, is_causal=True))


class LSTMLM(nn.Module):
    def __init__(self, vocab: int = 256, d: int = 128) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, d, num_layers=2, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.emb(x))[0])


def _setup(name: str, device: torch.device) -> Callable[[], None]:
    torch.manual_seed(0)
    if name == "cnn":
        model: nn.Module = SmallResNet()
        x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    elif name == "transformer":
        model = TinyTransformer()
        x, y = torch.randint(0, 256, (8, 64)), torch.randint(0, 256, (8, 64))
    else:
        model = LSTMLM()
        x, y = torch.randint(0, 256, (8, 32)), torch.randint(0, 256, (8, 32))
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        out = model(x)
        loss = nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _ratio_ci(a: list[float], b: list[float]) -> tuple[float, float, float]:
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    g = torch.Generator().manual_seed(0)
    n = len(ratios)
    boots = []
    for _ in range(2000):
        idx = torch.randint(0, n, (n,), generator=g).tolist()
        boots.append(statistics.median(ratios[i] for i in idx))
    boots.sort()
    return statistics.median(ratios), boots[49], boots[1949]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--models", default="cnn,transformer,lstm")
    p.add_argument("--profile", choices=["cnn", "transformer", "lstm"])
    args = p.parse_args(argv)
    sim = perf.simulated_device()
    cpu = torch.device("cpu")
    if args.profile:
        step = _setup(args.profile, sim)
        step()
        prof = cProfile.Profile()
        # backward on sim runs on autograd's device thread, which cProfile does not see:
        # run it on this thread while profiling
        with torch.autograd.set_multithreading_enabled(False):
            prof.enable()
            for _ in range(10):
                step()
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        return 0
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, steps {args.steps}")
    for name in args.models.split(","):
        steps = {"sim": _setup(name, sim), "cpu": _setup(name, cpu)}
        for s in steps.values():
            s()
            s()
        times: dict[str, list[float]] = {"sim": [], "cpu": []}
        for _ in range(args.steps):
            for side in ("cpu", "sim"):
                t0 = time.perf_counter()
                steps[side]()
                times[side].append(time.perf_counter() - t0)
        med, lo, hi = _ratio_ci(times["sim"], times["cpu"])
        print(
            f"{name:12s} cpu {statistics.median(times['cpu']) * 1e3:8.2f} ms  "
            f"sim {statistics.median(times['sim']) * 1e3:8.2f} ms  "
            f"sim/cpu {med:5.2f}x (95% CI {lo:.2f}-{hi:.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
