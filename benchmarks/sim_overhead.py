"""What the simulated device costs: one training step (forward, backward, AdamW step) of small
real-ish models on ``sim`` against the same step on plain CPU tensors, interleaved.

``python benchmarks/sim_overhead.py [--steps N] [--models a,b] [--profile MODEL] [--json F]``

Models: ``cnn`` and ``transformer`` (convolution- and matmul-bound), and three small-op loops
shaped as the public programs where the simulation cost most: ``lstm`` (a 2-layer LSTM language
model), ``ppo`` (a PPO rollout of 32 policy steps, GAE, and a clipped-objective update of an
actor-critic MLP) and ``ssm`` (a selective-scan state-space layer, Mamba-style, scanned step by
step in Python).

Prints per model the median step time on each side and the ratio sim / cpu with a bootstrap
95% interval over the paired steps. ``--profile MODEL`` prints where the
simulation's time goes (cProfile of 10 sim steps, top functions by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

import perf
import perf.sim.tensors


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


class ActorCritic(nn.Module):
    def __init__(self, obs: int = 8, actions: int = 4, hidden: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs, hidden), nn.Tanh(), nn.Linear(hidden, hidden))
        self.pi = nn.Linear(hidden, actions)
        self.v = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.body(x))
        return self.pi(h), self.v(h).squeeze(-1)


def _ppo_step(device: torch.device) -> Callable[[], None]:
    """Rollout (32 steps of 16 envs, policy under no_grad, a toy on-device environment), GAE
    in a Python loop, one clipped-objective update: the op mix of a small PPO loop."""
    model = ActorCritic().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    n_env, horizon, gamma, lam = 16, 32, 0.99, 0.95
    obs0 = torch.randn(n_env, 8, device=device)
    drift = torch.randn(4, 8, device=device) * 0.1

    def step() -> None:
        obs, buf = obs0, []
        with torch.no_grad():
            for _ in range(horizon):
                logits, value = model(obs)
                dist = torch.distributions.Categorical(logits=logits)
                action = dist.sample()
                reward = -(obs * obs).mean(-1) + 0.1 * (action == 0).float()
                done = (obs[:, 0] > 2.0).float()
                buf.append((obs, action, dist.log_prob(action), value, reward, done))
                obs = obs * 0.95 + drift[action] + 0.05 * torch.randn_like(obs)
            last = model(obs)[1]
        adv, gae = [], torch.zeros(n_env, device=device)
        for t in reversed(range(horizon)):
            nxt = last if t == horizon - 1 else buf[t + 1][3]
            _, _, _, v, r, d = buf[t]
            delta = r + gamma * nxt * (1 - d) - v
            gae = delta + gamma * lam * (1 - d) * gae
            adv.append(gae)
        advs = torch.stack(adv[::-1]).flatten()
        returns = advs + torch.stack([b[3] for b in buf]).flatten()
        advs = (advs - advs.mean()) / (advs.std() + 1e-8)
        b_obs = torch.cat([b[0] for b in buf])
        b_act = torch.cat([b[1] for b in buf])
        b_logp = torch.cat([b[2] for b in buf])
        logits, value = model(b_obs)
        dist = torch.distributions.Categorical(logits=logits)
        ratio = (dist.log_prob(b_act) - b_logp).exp()
        pg = -torch.min(ratio * advs, ratio.clamp(0.8, 1.2) * advs).mean()
        loss = pg + 0.5 * (value - returns).pow(2).mean() - 0.01 * dist.entropy().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()

    return step


class SelectiveScan(nn.Module):
    """A Mamba-style selective state-space layer whose scan is a Python loop over time."""

    def __init__(self, d: int = 32, n: int = 8, vocab: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.in_proj = nn.Linear(d, d + 2 * n + d)
        self.a_log = nn.Parameter(torch.log(torch.arange(1, n + 1).float()).repeat(d, 1))
        self.out = nn.Linear(d, vocab)
        self.d, self.n = d, n

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        u, b, c, dt = self.in_proj(x).split([self.d, self.n, self.n, self.d], -1)
        dt = nn.functional.softplus(dt)
        a = -torch.exp(self.a_log)
        h = x.new_zeros(x.size(0), self.d, self.n)
        ys = []
        for t in range(x.size(1)):
            da = torch.exp(dt[:, t, :, None] * a)
            h = da * h + dt[:, t, :, None] * b[:, t, None, :] * u[:, t, :, None]
            ys.append((h * c[:, t, None, :]).sum(-1))
        return self.out(torch.stack(ys, 1) * torch.sigmoid(u))


def _setup(name: str, device: torch.device) -> Callable[[], None]:
    torch.manual_seed(0)
    if name == "ppo":
        return _ppo_step(device)
    if name == "ssm":
        model: nn.Module = SelectiveScan()
        x, y = torch.randint(0, 64, (4, 48)), torch.randint(0, 64, (4, 48))
    elif name == "cnn":
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


MODELS = ("cnn", "transformer", "lstm", "ppo", "ssm")


def _read_memory_after(step: Callable[[], None]) -> Callable[[], None]:
    """The sim step, then a read of the memory model: its figures are brought up to date when
    read (the C++ path logs allocations and frees), so the model's cost is in each step."""

    def run() -> None:
        step()
        torch.sim.max_memory_allocated()  # type: ignore[attr-defined]

    return run


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--profile", choices=MODELS)
    p.add_argument("--json", help="write the paired times and ratios to this file")
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
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    path = "C++" if perf.sim.tensors.native is not None else "Python"
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, steps {args.steps}, "
        f"load average at start {load:.1f} on {os.cpu_count()} cores, sim's {path} path"
    )
    results: dict[str, dict[str, object]] = {}
    for name in args.models.split(","):
        steps = {"sim": _read_memory_after(_setup(name, sim)), "cpu": _setup(name, cpu)}
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
        results[name] = {"cpu_s": times["cpu"], "sim_s": times["sim"], "ratio": [med, lo, hi]}
    if args.json:
        meta = {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "load": load,
            "sim_path": path,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"meta": meta, "models": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
