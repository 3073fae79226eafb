"""What perf costs a test suite that does not use it (issue 11, issue 8 item 10).

Times whole pytest processes, wall clock, for four projects that use nothing of perf:
``pytest --help``; 2000 trivial tests serially and with ``-n 2``; a one-test
pytest-benchmark project with ``--benchmark-autosave``. Each is run with perf installed and
without it, interleaved (with, without, with, ...), ``--reps`` times; the medians are
reported, wall clock and CPU time (user + system of the pytest process and its xdist workers:
on a shared box CPU time is the steadier of the two). "Without" is a second interpreter
(``--without-python``: a venv with the same packages but no perf) or, by default, the same
one with perf's plugin blocked (``-p no:perf``).

    python benchmarks/guest_footprint.py --without-python /tmp/noperf/bin/python --reps 7
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BLOCK = ["-p", "no:perf"]


def _project(root: Path, n_tests: int) -> dict[str, tuple[Path, list[str]]]:
    """name -> (directory, pytest arguments)."""
    help_dir = root / "help"
    help_dir.mkdir()
    trivial = root / "trivial"
    trivial.mkdir()
    per_file = 100
    for f in range(max(1, n_tests // per_file)):
        body = "".join(f"def test_{i}():\n    pass\n\n" for i in range(min(per_file, n_tests)))
        (trivial / f"test_{f:03d}.py").write_text(body)
    bench = root / "bench"
    bench.mkdir()
    (bench / "test_bench.py").write_text(
        "def test_sum(benchmark):\n    benchmark(sum, range(100))\n"
    )
    common = ["-p", "no:cacheprovider", "-q"]
    return {
        "help": (help_dir, ["--help"]),
        "trivial_serial": (trivial, common),
        "trivial_n2": (trivial, [*common, "-n", "2"]),
        "benchmark_autosave": (
            bench,
            [
                *common,
                "--benchmark-autosave",
                "--benchmark-max-time=0.05",
                f"--benchmark-storage=file://{root / 'store'}",
            ],
        ),
    }


def _cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _time(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree)."""
    c0, t0 = _cpu_children(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    dt, dc = time.perf_counter() - t0, _cpu_children() - c0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}")
    return dt, dc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--with-python", default=sys.executable, help="interpreter with perf")
    ap.add_argument(
        "--without-python",
        default=None,
        help="interpreter without perf (default: --with-python and -p no:perf)",
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tests", type=int, default=2000, help="number of trivial tests")
    ap.add_argument("--only", default=None, help="comma list of scenarios")
    ap.add_argument("--out", default=None, help="write the raw times as JSON here")
    args = ap.parse_args(argv)
    with_cmd = [args.with_python, "-m", "pytest"]
    without_cmd = (
        [args.without_python, "-m", "pytest"]
        if args.without_python
        else [args.with_python, "-m", "pytest", *BLOCK]
    )
    results: dict[str, dict[str, list[list[float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="perf-footprint-") as tmp:
        scenarios = _project(Path(tmp), args.tests)
        names = args.only.split(",") if args.only else list(scenarios)
        for name in names:
            cwd, extra = scenarios[name]
            _time([*with_cmd, *extra], cwd)  # warm the page cache for both
            _time([*without_cmd, *extra], cwd)
            res = results[name] = {"with": [], "without": []}
            for _ in range(args.reps):
                res["with"].append(_time([*with_cmd, *extra], cwd))
                res["without"].append(_time([*without_cmd, *extra], cwd))
            line = f"{name:20s}"
            for i, what in ((0, "wall"), (1, "cpu")):
                w = statistics.median(t[i] for t in res["with"])
                wo = statistics.median(t[i] for t in res["without"])
                line += f"  {what}: with {w:6.2f} s, without {wo:6.2f} s, ratio {w / wo:5.3f}"
            print(f"{line}  (medians of {args.reps})", flush=True)
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "reps": args.reps,
                    "tests": args.tests,
                    "without": args.without_python or "-p no",
                    "times_s [wall, cpu]": results,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
