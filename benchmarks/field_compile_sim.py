"""Run real training code under ``torch.compile`` on the simulated device; print its counts.

A field check, not a test (the checkout is not committed)::

    python benchmarks/field_compile_sim.py CHECKOUT SCRIPT [SCRIPT ARGS...]
    python benchmarks/field_compile_sim.py /path/to/nanoGPT --nanogpt   # tiny nanoGPT config

The script runs unmodified with ``runpy`` from ``CHECKOUT`` (as ``python SCRIPT ARGS``) in this
process, after ``perf.simulated_device()`` installed ``sim``: pass the script its own flags to
pick ``sim`` and to compile (nanoGPT: ``--device=sim --compile=True``); run it eagerly by
passing its own flag again (``--compile=False``). Prints one JSON object: whether it ran (and
the error, type and first line, where it did not), the syncs (by op and by site) and
transfers counted over the whole run, and TorchDynamo's own bookkeeping: graphs compiled,
graph breaks (reason, first line), frames, and recompiles (guard failures).

``--nanogpt`` writes a synthetic ``data/shakespeare_char`` (random tokens) unless one exists,
and runs ``train.py`` with the tiny config of ``benchmarks/nanogpt_sim.py`` and
``--compile=True`` (add ``--eager`` for ``--compile=False``).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections import Counter
from typing import Any

import perf

NANOGPT_ARGS = [
    "config/train_shakespeare_char.py", "--device=sim", "--dtype=float32",
    "--batch_size=4", "--block_size=32", "--n_layer=2", "--n_head=2", "--n_embd=32",
    "--dropout=0.0", "--max_iters=20", "--eval_interval=1000", "--eval_iters=5",
    "--log_interval=5", "--warmup_iters=0", "--lr_decay_iters=20",
]  # fmt: skip


def _nanogpt_data() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from nanogpt_sim import synthetic_data  # the same synthetic data as the eager field check

    synthetic_data()


def _dynamo_counts() -> dict[str, Any]:
    import torch._dynamo.utils as dynamo_utils

    counters = dynamo_utils.counters
    breaks: Counter[str] = Counter()
    for reason, n in counters["graph_break"].items():
        breaks[reason.strip().split("\n")[0]] += n
    recompiles = sum(len(v) for v in dynamo_utils.guard_failures.values())
    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": sum(breaks.values()),
        "break_reasons": dict(breaks),
        "frames": int(counters["frames"]["ok"]),
        "recompiles": recompiles,
    }


def run(checkout: str, script: str, args: list[str]) -> dict[str, Any]:
    """Run ``script`` from ``checkout`` on ``sim``; the counts and whether it ran."""
    dev = perf.simulated_device()
    os.chdir(checkout)
    sys.path.insert(0, os.getcwd())
    sys.argv = [script, *args]
    error = None
    with perf.count_syncs(dev) as s, perf.count_transfers() as t:
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                error = f"SystemExit: {e.code}"
        except Exception as e:  # a field run reports what failed instead of dying
            error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
    syncs = s.result()
    return {
        "ran": error is None,
        "error": error,
        "syncs": syncs.count,
        "syncs_by_op": syncs.by_op,
        "syncs_by_site": syncs.by_site,
        "h2d_copies": t.h2d_copies,
        "h2d_bytes": t.h2d_bytes,
        "d2h_copies": t.d2h_copies,
        "d2h_bytes": t.d2h_bytes,
        "compile": _dynamo_counts(),
    }


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    checkout, rest = os.path.abspath(argv[0]), argv[1:]
    if not os.path.isdir(checkout):
        print(f"field_compile_sim.py: {checkout!r} is not a folder (a checkout of the code to run)")
        return 2
    if rest[0] == "--nanogpt":
        os.chdir(checkout)
        _nanogpt_data()
        compile_flag = "--compile=False" if "--eager" in rest else "--compile=True"
        script, args = "train.py", [*NANOGPT_ARGS, compile_flag]
    else:
        script, args = rest[0], rest[1:]
    if not os.path.isfile(os.path.join(checkout, script)):
        print(f"field_compile_sim.py: no {script!r} in {checkout!r}")
        return 2
    print(json.dumps(run(checkout, script, args), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
