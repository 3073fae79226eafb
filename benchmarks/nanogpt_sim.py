"""Count syncs and transfers of karpathy/nanoGPT's unmodified ``train.py`` on the simulated device.

A field check, not a test: ``python benchmarks/nanogpt_sim.py /path/to/nanoGPT``. It writes a
synthetic ``data/shakespeare_char`` (random tokens; the real one is downloaded by nanoGPT's
prepare.py) unless one exists, and runs a tiny CPU config with ``--device=sim``. nanoGPT picks
its code paths by ``device_type = 'cuda' if 'cuda' in device else 'cpu'``, so on ``sim`` it takes
its non-CUDA branches (blocking ``x.to(device)`` in get_batch, no autocast, for-each AdamW):
the counts are CUDA's for *those* branches. Derivation for the config below (20 iterations,
evaluation at iteration 0 only, 5 eval batches per split, loss logged every 5th iteration):
15 parameter copies in ``model.to(device)`` + 2 blocking copies per get_batch call
(1 + 2 x 5 + 21 calls = 32 calls: 64) + 10 eval ``loss.item()`` + 5 logged ``loss.item()``
= 94 syncs, 79 host-to-device copies.
"""

from __future__ import annotations

import json
import os
import pickle
import runpy
import sys

import numpy as np

import perf

ARGS = [
    "config/train_shakespeare_char.py",
    "--device=sim",
    "--compile=False",
    "--dtype=float32",
    "--batch_size=4",
    "--block_size=32",
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    "--dropout=0.0",
    "--max_iters=20",
    "--eval_interval=1000",
    "--eval_iters=5",
    "--log_interval=5",
    "--warmup_iters=0",
    "--lr_decay_iters=20",
]


def synthetic_data() -> None:
    """Random tokens as nanoGPT's ``data/shakespeare_char`` (in the working directory), unless
    the real data set is there (nanoGPT's prepare.py downloads it; nothing is downloaded here)."""
    data = os.path.join("data", "shakespeare_char")
    if not os.path.exists(os.path.join(data, "train.bin")):
        rng = np.random.default_rng(0)
        rng.integers(0, 65, 20000).astype(np.uint16).tofile(os.path.join(data, "train.bin"))
        rng.integers(0, 65, 4000).astype(np.uint16).tofile(os.path.join(data, "val.bin"))
        with open(os.path.join(data, "meta.pkl"), "wb") as f:
            pickle.dump({"vocab_size": 65}, f)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    os.chdir(argv[0])
    synthetic_data()
    perf.simulated_device()
    sys.argv = ["train.py", *ARGS]
    sys.path.insert(0, os.getcwd())
    with perf.count_syncs() as s, perf.count_transfers() as t:
        runpy.run_path("train.py", run_name="__main__")
    r = s.result()
    print(
        json.dumps(
            {
                "syncs": r.count,
                "by_op": r.by_op,
                "by_site": r.by_site,
                "h2d_copies": t.h2d_copies,
                "h2d_bytes": t.h2d_bytes,
                "d2h_copies": t.d2h_copies,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
