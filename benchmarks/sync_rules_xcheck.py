"""Cross-check the two sides of ``count_syncs`` over PyTorch's own operator samples.

``python benchmarks/sync_rules_xcheck.py [--skip OP ...]`` (needs ``expecttest``, which
``torch.testing._internal`` imports)

Why: on ``sim`` every op a composite runs reaches the device, so its inner ``.item()`` is
counted; on ``cuda:0`` ``count_syncs``' dispatch mode sees a CompositeExplicitAutograd op as one
op and must know from ``perf.sim.kernel_syncs.COMPOSITE`` that it reads the device. This runs
the first two samples of every OpInfo on ``sim`` and, on CPU tensors, through that dispatch-mode
code (the stand-in mode, where every tensor counts as a device tensor) and prints where the
counts differ. Expected differences (the stand-in has no host side): host operands (a CPU
index or mask, a CPU ``start`` tensor of ``narrow``), host-to-device copies and
``torch.tensor(..., device=dev)``, and ``.to("cpu")`` of host tensors. Anything else is a
composite the table is missing. Ops that crash the simulated device can be skipped by name.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import torch

import perf


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip", nargs="*", default=[], help="OpInfo names not to run")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    dev = perf.simulated_device()
    compared, diffs = 0, []
    for op in op_db:
        if op.name in args.skip:
            continue
        try:
            on_sim = list(op.sample_inputs(dev, torch.float32))[:2]
            on_cpu = list(op.sample_inputs("cpu", torch.float32))[:2]
        except Exception:
            continue
        for s, c in zip(on_sim, on_cpu, strict=False):
            try:
                torch.manual_seed(0)
                with perf.count_syncs(dev) as a:
                    op(s.input, *s.args, **s.kwargs)
                torch.manual_seed(0)
                with perf.count_syncs("cpu", host_as_device=True) as b:
                    op(c.input, *c.args, **c.kwargs)
            except Exception:
                continue
            compared += 1
            if a.count != b.count:
                diffs.append((op.name, op.variant_test_name, a.by_op, b.by_op))
    print(f"compared {compared} samples; {len(diffs)} differ (sim, dispatch-mode side):")
    for d in diffs:
        print(" ", *d)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
