"""What the gate's warm starter saves: one ``--perf-against`` run on a small git project whose
tests import torch, with every child forked by the warm starter (the default) and with every
child a fresh interpreter (``PERF_WARM_START=0``), interleaved, ``--reps`` times each.

Prints the medians of wall clock and CPU (user + system of the gate and all its children),
and the children the gate ran; ``--json`` writes them too.

    python benchmarks/warm_start.py --reps 3 --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = """\
import time

import pytest
import torch

import perf
import work


def test_ops(perf_metrics):
    with perf.count_ops() as o:
        work.step(torch.ones(8))
    perf_metrics.record("ops", o.count, "ops")


@pytest.mark.perf_timing
def test_time(perf_metrics):
    t = perf.measure(lambda: time.sleep(0.002), number=1, samples=8, warmup=1)
    perf_metrics.record("step_s", t)
"""


def _project(root: Path, timed: bool) -> Path:
    proj = root / "proj"
    (proj / "work").mkdir(parents=True)
    (proj / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["."]\n')
    (proj / "test_step.py").write_text(TESTS if timed else TESTS.split("@pytest.mark")[0])
    (proj / "work" / "__init__.py").write_text("def step(x):\n    return (x * 2).exp()\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(proj), *args], check=True, env=env)
    return proj


def _once(proj: Path, pairs: int, warm: bool) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PERF_WARM_START"] = "1" if warm else "0"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q"]
    cmd += ["-o", "perf_busy_cpu_fraction=1", "--perf-no-reference"]
    cmd += ["--perf-against=HEAD", f"--perf-pairs={max(pairs, 5)}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=proj, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in (0, 1):
        raise SystemExit(f"the gate failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}")
    m = re.search(r"(\d+) child runs", r.stdout)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "children": float(m[1]) if m else float("nan")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--pairs",
        type=int,
        default=5,
        help="--perf-pairs of each gate run (5 at least); 0: no timed test, one base child",
    )
    ap.add_argument("--json", type=Path, help="also write the medians here")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="perf-warm-start-") as tmp:
        proj = _project(Path(tmp), timed=a.pairs > 0)
        runs: dict[str, list[dict[str, float]]] = {"warm": [], "fresh": []}
        for _ in range(a.reps):
            for name in ("warm", "fresh"):
                runs[name].append(_once(proj, a.pairs, name == "warm"))
    out = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }
    print(f"--perf-against, {a.pairs} pairs at most, median of {a.reps} runs each")
    print(f"{'children':<10}{'wall s':>10}{'CPU s':>10}{'child runs':>12}")
    for name, m in out.items():
        print(f"{name:<10}{m['wall_s']:>10.1f}{m['cpu_s']:>10.1f}{m['children']:>12.0f}")
    if a.json:
        a.json.write_text(json.dumps({"pairs": a.pairs, "reps": a.reps, **out}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
