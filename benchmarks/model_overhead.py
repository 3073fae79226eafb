"""Cost of ``perf.model_gpu_time`` on the ``sim`` run it rides on: modelled / plain sim.

Target (the model's issue): modelling costs at most 1.2x the simulated run. Each ratio is
measured with ``perf.compare`` (interleaved pairs A B A B ..., 95% interval of the median
ratio), so a busy neighbour slows both sides alike. Run by hand on a CPU-only box::

    python benchmarks/model_overhead.py --out benchmarks/results/model_overhead_2core.json

The workloads are the suite's: the Iris loop (launch-bound, tiny ops: the worst case for a
per-op mode) and a wider MLP, each ``--steps`` Adam steps logging ``loss.item()`` every 10.
Each is also run under an empty dispatch mode: the floor any per-op Python instrument pays.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch

import perf
from perf.instruments.gpu_model import model_gpu_time
from perf.instruments.modes import CountingDispatchMode
from perf.workloads.data import iris_split, synthetic_classification
from perf.workloads.loops import train_loop
from perf.workloads.models import mlp

LIMIT = 1.2


class _EmptyMode(CountingDispatchMode):
    """The floor: a dispatch mode that does nothing but call the op (what any per-op Python
    instrument pays before it does any work)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def workloads() -> dict[str, tuple[torch.nn.Module, torch.Tensor, torch.Tensor]]:
    X, y, _, _ = iris_split()
    Xm, ym = synthetic_classification(512, 256, 10)
    return {
        "iris 4-16-3, batch 120": (mlp(4, 16, 1, 3), X, y),
        "mlp 256-1024x2-10, batch 512": (mlp(256, 1024, 2, 10), Xm, ym),
    }


def measure(steps: int, pairs: int) -> list[dict[str, Any]]:
    """One paired comparison per workload: the loop on sim inside ``model_gpu_time`` / the
    same loop on sim without it."""
    sim = perf.simulated_device()
    rows = []
    for name, (model, X, y) in workloads().items():
        m = copy.deepcopy(model).to(sim)
        opt = torch.optim.Adam(m.parameters(), foreach=True)
        Xs, ys = X.to(sim), y.to(sim)
        train_loop(m, opt, Xs, ys, steps=3, log_every=0)

        def plain(m=m, opt=opt, X=Xs, y=ys) -> None:
            train_loop(m, opt, X, y, steps=steps, log_every=10)

        def modelled(m=m, opt=opt, X=Xs, y=ys) -> None:
            with model_gpu_time(sim):
                train_loop(m, opt, X, y, steps=steps, log_every=10)

        def empty_mode(m=m, opt=opt, X=Xs, y=ys) -> None:
            with _EmptyMode():
                train_loop(m, opt, X, y, steps=steps, log_every=10)

        c = perf.compare(modelled, plain, pairs=pairs, min_sample_time_s=0.0)
        floor = perf.compare(empty_mode, plain, pairs=pairs, min_sample_time_s=0.0)
        with model_gpu_time(sim) as t:
            train_loop(m, opt, Xs, ys, steps=steps, log_every=10)
        rows.append(
            {
                "workload": name,
                "ratio": c.ratio,
                "ci95": list(c.ci),
                "empty_mode_ratio": floor.ratio,
                "empty_mode_ci95": list(floor.ci),
                "pairs": pairs,
                "steps": steps,
                "within_limit": c.ratio <= LIMIT,
                "modelled_total_s": t.total_s,
                "modelled_launches": t.launches,
                "modelled_bound": t.bound,
            }
        )
        lo, hi = c.ci
        flo, fhi = floor.ci
        print(
            f"| {name} | {c.ratio:.3f}x | [{lo:.3f}, {hi:.3f}] | {floor.ratio:.3f}x "
            f"[{flo:.3f}, {fhi:.3f}] |",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--pairs", type=int, default=11)
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    args = ap.parse_args(argv)
    fp = perf.fingerprint()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {fp['cpu_model']}")
    print("| workload (sim) | with model / without | 95% interval | empty mode / without |")
    print("|---|---|---|---|")
    rows = measure(args.steps, args.pairs)
    if args.out is not None:
        doc = {
            "benchmark": "model_overhead",
            "limit": LIMIT,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu_model": fp["cpu_model"],
            "rows": rows,
        }
        args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0 if all(r["within_limit"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
