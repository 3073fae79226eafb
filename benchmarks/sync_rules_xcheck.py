"""Cross-check the two sides of ``count_syncs`` over PyTorch's own operator samples.

``python benchmarks/sync_rules_xcheck.py [--skip OP ...]`` (needs ``expecttest``, which
``torch.testing._internal`` imports)

Why: on ``sim`` every op a composite runs reaches the device, so its inner ``.item()`` is
counted by the device; on ``cuda:0`` ``count_syncs``' dispatch mode sees a
CompositeExplicitAutograd op as one op and must know from ``perf.sim.kernel_syncs.COMPOSITE``
that it reads the device, and sees no copy made below it. This runs the first two samples of
every OpInfo on ``sim`` twice: counted by ``sim``'s device, and counted by the dispatch-mode
code that runs on CUDA (``perf.instruments.syncs.dispatch_side``, on the same sim tensors,
host operands included), and prints where the counts differ. Each difference is a sync the
CUDA side would miss or invent. Ops that crash the simulated device can be skipped by name.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Iterable
from typing import Any

import torch

import perf
from perf.instruments.syncs import dispatch_side


def compare(ops: Iterable[Any], dev: torch.device, skip: Iterable[str] = ()) -> tuple[int, list]:
    """(samples compared, differences) over OpInfo-like ``ops``: each has ``name``,
    ``variant_test_name``, ``sample_inputs(device, dtype)`` and is callable; a difference is
    ``(name, variant, sim's by_op, CUDA side's by_op)``. Samples that raise are skipped."""
    compared, diffs = 0, []
    for op in ops:
        if op.name in skip:
            continue
        try:
            samples = list(op.sample_inputs(dev, torch.float32))[:2]
        except Exception:
            continue
        for s in samples:
            try:
                torch.manual_seed(0)
                with perf.count_syncs(dev) as a:
                    op(s.input, *s.args, **s.kwargs)
                torch.manual_seed(0)
                with dispatch_side(dev) as b:
                    op(s.input, *s.args, **s.kwargs)
            except Exception:
                continue
            compared += 1
            if a.count != sum(b.by_op.values()):
                diffs.append((op.name, op.variant_test_name, a.by_op, dict(b.by_op)))
    return compared, diffs


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip", nargs="*", default=[], help="OpInfo names not to run")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    compared, diffs = compare(op_db, perf.simulated_device(), args.skip)
    print(f"compared {compared} samples; {len(diffs)} differ (sim's device, CUDA's side):")
    for d in diffs:
        print(" ", *d)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
