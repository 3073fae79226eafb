"""Overhead of each counter on a 100-step training loop: instrumented time / plain time.

A benchmark, not a test: run it by hand (``python benchmarks/counter_overhead.py``) and copy the
table into the README. Each ratio is measured with ``perf.compare`` (interleaved pairs, 95%
interval of the median ratio), so a busy neighbour slows both sides alike.

``--device sim``: the loop runs on the simulated accelerator (``perf.simulated_device()``), as
counts are taken on CPU-only boxes, and every ratio is against the *plain CPU* loop: the cost
of the simulation itself, and of the simulation plus each counter.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

import perf
from perf.workloads.data import iris_split, synthetic_classification
from perf.workloads.loops import train_loop
from perf.workloads.models import mlp

COUNTERS: dict[str, Callable[[], Any]] = {
    "count_syncs": perf.count_syncs,
    "count_ops": lambda: perf.count_ops(kernels=False),
    "count_transfers": perf.count_transfers,
    "saved_activations": perf.saved_activations,
    "count_flops": perf.count_flops,
}


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def workloads() -> dict[str, tuple[torch.nn.Module, torch.Tensor, torch.Tensor]]:
    X, y, _, _ = iris_split()
    Xm, ym = synthetic_classification(512, 256, 10)
    return {
        "iris 4-16-3, batch 120": (mlp(4, 16, 1, 3), X, y),
        "mlp 256-1024x2-10, batch 512": (mlp(256, 1024, 2, 10), Xm, ym),
    }


SIM_COUNTERS: dict[str, Callable[[], Any]] = {
    "none (simulation only)": _nothing,
    "count_syncs": perf.count_syncs,
    "count_transfers": perf.count_transfers,
    "count_syncs + count_transfers": lambda: _both(perf.count_syncs, perf.count_transfers),
    "count_ops": lambda: perf.count_ops(kernels=False),
}


@contextlib.contextmanager
def _both(a: Callable[[], Any], b: Callable[[], Any]) -> Iterator[None]:
    with a(), b():
        yield


def main_sim(args: argparse.Namespace) -> int:
    """Each counter on the simulated device / the same loop plain on the CPU."""
    sim = perf.simulated_device()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{perf.fingerprint()['cpu_model']}; sim + counter / plain CPU"
    )
    print("| workload | on `sim` with | / plain CPU | 95% interval |")
    print("|---|---|---|---|")
    for wname, (model, X, y) in workloads().items():
        import copy

        cpu_opt = torch.optim.Adam(model.parameters(), foreach=True)
        sim_model = copy.deepcopy(model).to(sim)
        sim_opt = torch.optim.Adam(sim_model.parameters(), foreach=True)
        Xs, ys = X.to(sim), y.to(sim)
        train_loop(model, cpu_opt, X, y, steps=3, log_every=0)
        train_loop(sim_model, sim_opt, Xs, ys, steps=3, log_every=0)

        def plain(model=model, opt=cpu_opt, X=X, y=y) -> None:
            train_loop(model, opt, X, y, steps=args.steps, log_every=10)

        for cname, cm in SIM_COUNTERS.items():

            def on_sim(cm=cm, model=sim_model, opt=sim_opt, X=Xs, y=ys) -> None:
                with cm():
                    train_loop(model, opt, X, y, steps=args.steps, log_every=10)

            c = perf.compare(on_sim, plain, pairs=args.pairs, min_sample_time_s=0.0)
            lo, hi = c.ci
            print(f"| {wname} | {cname} | {c.ratio:.2f}x | [{lo:.2f}, {hi:.2f}] |", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--pairs", type=int, default=11)
    ap.add_argument("--device", choices=["cpu", "sim"], default="cpu")
    args = ap.parse_args(argv)
    if args.device == "sim":
        return main_sim(args)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{perf.fingerprint()['cpu_model']}"
    )
    print("| workload | counter | instrumented / plain | 95% interval |")
    print("|---|---|---|---|")
    for wname, (model, X, y) in workloads().items():
        opt = torch.optim.Adam(model.parameters(), foreach=True)
        train_loop(model, opt, X, y, steps=3, log_every=0)

        def run(cm: Callable[[], Any], model=model, opt=opt, X=X, y=y) -> None:
            with cm():
                train_loop(model, opt, X, y, steps=args.steps, log_every=10)

        for cname, cm in COUNTERS.items():
            c = perf.compare(
                lambda cm=cm: run(cm),
                lambda: run(_nothing),
                pairs=args.pairs,
                min_sample_time_s=0.0,
            )
            lo, hi = c.ci
            print(f"| {wname} | `{cname}` | {c.ratio:.2f}x | [{lo:.2f}, {hi:.2f}] |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
