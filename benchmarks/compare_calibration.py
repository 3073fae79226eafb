"""A/A calibration of ``perf.compare`` under CPU-bound neighbours (a measurement, not a test).

Why: a 95% interval must contain the truth at least 95% of the time on the machine it runs on,
not only on a quiet one. Here the truth is known: A and B are the same function ("same_fn") or
two equal-cost functions ("equal_cost", two copies of one tiny model), so the ratio is 1.0.
With 0, 1 and 2 neighbour processes that burn a core each (``while True: pass``), it runs N
comparisons per workload and counts how often the stated interval holds 1.0, how often the
verdict is inconclusive, and how often a conclusive interval excludes 1.0 (a wrong verdict).
The binomial interval of the median (``iid_ci``, what ``perf.compare`` stated before it
checked the pairs for independence) is scored on the same samples.

    python benchmarks/compare_calibration.py --hogs 0 1 2 --n 100 \\
        --out benchmarks/results/compare_calibration_2core.json

The load average (1 min) is recorded before and after each comparison: on a shared box the
"0 hogs" case is not a quiet machine, and the JSON says how busy it was.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import signal
import subprocess
import sys
import time
from typing import Any

import torch
from torch import nn

import perf


def _hogs(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def _workloads() -> dict[str, tuple[Any, Any]]:
    torch.manual_seed(0)
    m1 = nn.Linear(4, 4)
    m2 = copy.deepcopy(m1)
    x = torch.randn(2, 4)

    def f1() -> Any:
        return m1(x)

    def f2() -> Any:
        return m2(x)

    return {"same_fn": (f1, f1), "equal_cost": (f1, f2)}


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    held = sum(r["ci_low"] <= 1.0 <= r["ci_high"] for r in rows)
    inconclusive = sum(r["verdict"] == "inconclusive" for r in rows)
    wrong = sum(
        r["verdict"] != "inconclusive" and not r["ci_low"] <= 1.0 <= r["ci_high"] for r in rows
    )
    iid_held = sum(r["iid_low"] <= 1.0 <= r["iid_high"] for r in rows)
    widened = sum(r["verdict"] == "widened" for r in rows)
    loads = [r["loadavg_1m"] for r in rows]
    others = [r["others_cpu_fraction"] for r in rows if r["others_cpu_fraction"] is not None]
    return {
        "comparisons": n,
        "coverage_of_1": held / n,
        "wrong_verdicts": wrong,
        "inconclusive": inconclusive,
        "widened": widened,
        "iid_ci_coverage_of_1": iid_held / n,
        "iid_ci_excluding_1": n - iid_held,
        "median_ci_width_ratio": sorted(
            r["ci_high"] / r["ci_low"] for r in rows if r["verdict"] != "inconclusive"
        )[max(0, (n - inconclusive) // 2 - 1)]
        if n > inconclusive
        else None,
        "loadavg_1m_min": min(loads),
        "loadavg_1m_max": max(loads),
        "others_cpu_fraction_median": sorted(others)[len(others) // 2] if others else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hogs", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n", type=int, default=100, help="comparisons per workload and hog count")
    ap.add_argument("--pairs", type=int, default=25)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    # SIGTERM runs the ``finally`` that stops the hogs (the default handler would orphan them)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    torch.set_num_threads(1)
    work = _workloads()
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "pairs": args.pairs,
        "confidence": 0.95,
        "conditions": [],
    }
    for h in args.hogs:
        procs = _hogs(h)
        rows: dict[str, list[dict[str, Any]]] = {k: [] for k in work}
        t0 = time.time()
        try:
            time.sleep(1.0)
            for i in range(args.n):
                for name, (fa, fb) in work.items():
                    with torch.no_grad():
                        c = perf.compare(fa, fb, pairs=args.pairs, order_seed=i)
                    rows[name].append(
                        {
                            "ratio": c.ratio,
                            "ci_low": c.ci[0],
                            "ci_high": c.ci[1],
                            "iid_low": c.iid_ci[0],
                            "iid_high": c.iid_ci[1],
                            "verdict": c.verdict,
                            "reason": c.reason,
                            "others_cpu_fraction": c.others_cpu_fraction,
                            "loadavg_1m": os.getloadavg()[0],
                            "ratios": list(c.ratios),
                            "a_first": list(c.a_first),
                        }
                    )
        finally:
            _stop(procs)
        cond = {
            "hogs": h,
            "wall_s": time.time() - t0,
            "workloads": {k: {"summary": _summary(v), "runs": v} for k, v in rows.items()},
        }
        result["conditions"].append(cond)
        for k, v in cond["workloads"].items():
            print(h, "hogs", k, json.dumps(v["summary"]), flush=True)
        with open(args.out, "w", encoding="utf-8") as fh:  # after each condition: a cut run
            json.dump(result, fh, indent=1)  # keeps what it measured
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
