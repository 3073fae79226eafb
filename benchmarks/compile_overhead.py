"""Overhead of ``perf.count_compiles`` against plain ``torch.compile``, paired in one run.

A benchmark, not a test: run it by hand (``python benchmarks/compile_overhead.py``) and copy
the table into docs/compile.md. Each ratio (counted / plain) is measured with
``perf.compare`` (interleaved pairs, 95% interval of the median ratio):

- cold: ``torch._dynamo.reset()``, compile an MLP and run one training step (forward,
  backward, SGD step): the block spans a whole compile;
- warm: 20 training steps of an already compiled MLP inside one block;
- and the bare cost of entering and leaving an empty block.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

import perf
from perf.workloads.models import mlp


@contextlib.contextmanager
def _plain() -> Iterator[None]:
    yield


def _step_fn(
    backend: str, device: torch.device, cold: bool, steps: int
) -> Callable[[Callable[[], Any]], Callable[[], None]]:
    model = mlp(64, 256, 2, 10).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 64, device=device)
    compiled = torch.compile(model, backend=backend)

    def make(block: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            nonlocal compiled
            if cold:
                torch._dynamo.reset()
                compiled = torch.compile(model, backend=backend)
            with block():
                for _ in range(steps):
                    opt.zero_grad()
                    compiled(x).sum().backward()
                    opt.step()

        return run

    return make


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu", help="cpu or sim")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20, help="training steps of the warm case")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared box)")
    ap.add_argument("--cases", default="aot_eager:warm,aot_eager:cold,inductor:warm,inductor:cold")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = perf.simulated_device() if args.device == "sim" else torch.device(args.device)

    def enter_exit() -> None:
        with perf.count_compiles():
            pass

    bare = perf.measure(enter_exit, device="cpu")
    print(f"device {device}, torch {torch.__version__}, {args.pairs} pairs each")
    print(f"entering + leaving an empty block: {bare.median_s * 1e6:.1f} us (median)")
    print("| backend | block | counted / plain | 95% interval |")
    print("|---|---|---|---|", flush=True)
    for case in args.cases.split(","):
        backend, kind = case.split(":")
        cold, steps = (True, 1) if kind == "cold" else (False, args.steps)
        make = _step_fn(backend, device, cold, steps)
        counted, plain = make(perf.count_compiles), make(_plain)
        plain()  # compile once (warm case) / warm the caches (cold case)
        c = perf.compare(
            counted,
            plain,
            pairs=args.pairs,
            warmup=1,
            min_sample_time_s=0.0,
            labels=("count_compiles", "plain"),
        )
        what = "cold: reset, compile, 1 step" if cold else f"warm: {steps} compiled steps"
        lo, hi = c.ci
        print(f"| {backend} | {what} | {c.ratio:.3f}x | [{lo:.3f}, {hi:.3f}] |", flush=True)


if __name__ == "__main__":
    main()
