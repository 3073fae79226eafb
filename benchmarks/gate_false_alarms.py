"""Acceptance measurement of the timing gate (a benchmark, not a test).

For each repetition i: save a baseline run of a small set of timing tests, then compare an
unchanged run against it (A/A: any failure is a false alarm), and, for the first
``--planted-reps`` repetitions, compare runs with a planted slowdown of 5..40% (caught = the
gate fails with a regression). pytest-benchmark's ``--benchmark-compare-fail=median:5%`` and
``median:25%`` are evaluated on exactly the same runs (from the JSON that pytest-benchmark
writes with ``--benchmark-json``), for its ``benchmark``-fixture tests.

torch runs with one thread (``--threads 1``, i.e. ``OMP_NUM_THREADS=1``) by default: on a
shared 2-core box a 2-thread torch step collapses under oversubscription (measured: up to
~100x), which no gate can tell apart from a regression; ``--threads 0`` keeps torch's default.

``--interleaved`` also gates every compare with ``--perf-against=<base commit>`` in the same
pytest run: the work folder is a git repository, the planted slowdown lives in the project's
code (``planted.py``, committed: the base commit has 0, the head commit the planted level),
and the interleaved gate's verdict is read from its own report section, so the stored-baseline
gate, the interleaved gate and pytest-benchmark judge exactly the same runs.

``--busy FRACTION`` runs a CPU-burning neighbour process (``while True: pass``) during a
random FRACTION of all pytest runs (baselines and compares alike), the way a shared CI box
behaves.

    python benchmarks/gate_false_alarms.py --reps 20 --planted-reps 10 --out results.json

Prints a summary table and writes every verdict as JSON.

``--matrix`` (issue 28) measures the four verdicts instead: for each load (quiet, and with
``--hogs`` CPU-burning neighbours during every pytest run) and each workload (sleep-bound,
CPU-bound pure Python), ``--reps`` baselines each followed by an A/A compare, and for the
first ``--planted-reps`` of them one compare per planted slowdown (``--matrix-levels``,
default +10%, +30%, 3x). Every compare runs the stored gate (``--benchmark-compare``, its
doubts settled against the baseline's commit within the default budget) and
``--perf-against=<base commit>`` in the same pytest run, and each gate's verdict on the
one metric is tabulated: regression / improvement / unchanged / undecided. ``--estimate``
prints how long the full matrix would take from the run's own timings.

    python benchmarks/gate_false_alarms.py --matrix --reps 20 --planted-reps 10 --out m.json
    python benchmarks/gate_false_alarms.py --matrix --reps 1 --planted-reps 1 --estimate
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

TESTS = textwrap.dedent(
    """
    import os

    import torch

    import perf

    from planted import SLOWDOWN

    # Planted slowdown: each call runs round(STEPS * (1 + SLOWDOWN)) steps instead of STEPS.
    STEPS = 20
    N = round(STEPS * (1 + SLOWDOWN))
    torch.manual_seed(0)
    MODEL = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    OPT = torch.optim.SGD(MODEL.parameters(), lr=0.01)
    X, Y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    A = torch.randn(96, 96)


    def train_steps():
        for _ in range(N):
            OPT.zero_grad()
            torch.nn.functional.cross_entropy(MODEL(X), Y).backward()
            OPT.step()


    def matmuls():
        for _ in range(N):
            A @ A


    def python_loop():
        for _ in range(N):
            sum(range(400))


    def test_train_step(perf_metrics):
        perf_metrics.record("step_time_s", perf.measure(train_steps))


    def test_python(perf_metrics):
        perf_metrics.record("loop_s", perf.measure(python_loop))


    def test_bench_train_step(benchmark):
        benchmark(train_steps)


    def test_bench_python(benchmark):
        benchmark(python_loop)
    """
)

# Control: sleep-bound tests (CPU neighbours barely move them), gated without the reference
# workload: shows what the statistics alone resolve when the noise is scheduler jitter.
TESTS_SLEEP = textwrap.dedent(
    """
    import time

    import perf
    from planted import SLOWDOWN

    WORK_S = 0.002 * (1 + SLOWDOWN)


    def test_sleep(perf_metrics):
        perf_metrics.record("sleep_s", perf.measure(lambda: time.sleep(WORK_S), number=1,
                                                    samples=15, warmup=1))


    def test_bench_sleep(benchmark):
        benchmark.pedantic(time.sleep, args=(WORK_S,), rounds=15, iterations=1)
    """
)

LEVELS = (0.05, 0.10, 0.15, 0.20, 0.30, 0.40)


def git(work: Path, *args: str) -> str:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="bench",
        GIT_AUTHOR_EMAIL="bench@localhost",
        GIT_COMMITTER_NAME="bench",
        GIT_COMMITTER_EMAIL="bench@localhost",
    )
    return subprocess.run(
        ["git", "-C", str(work), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def plant(work: Path, slowdown: float, commit: bool) -> str | None:
    """Write the planted slowdown into the project's code; with ``commit``, commit it and
    return the commit's hash."""
    (work / "planted.py").write_text(f"SLOWDOWN = {slowdown!r}\n")
    if not commit:
        return None
    git(work, "add", "-A")
    git(work, "commit", "-q", "--allow-empty", "-m", f"slowdown {slowdown}")
    return git(work, "rev-parse", "HEAD")


def sections(out: str) -> dict[str, str]:
    """pytest's terminal output split at its ``==== title ====`` section lines."""
    parts: dict[str, str] = {}
    title = ""
    for line in out.splitlines():
        stripped = line.strip()
        if stripped.startswith("==") and stripped.endswith("==") and " " in stripped:
            title = stripped.strip("= ").strip()
            parts.setdefault(title, "")
            continue
        parts[title] = parts.get(title, "") + line + "\n"
    return parts


def pair_ratios(out: str) -> dict[str, list[float]]:
    """metric -> head/base ratio of each interleaved pair, from the gate's reasons (-v)."""
    found: dict[str, list[float]] = {}
    for line in out.splitlines():
        if "interleaved pairs [" not in line:
            continue
        key = line.split(": ", 1)[0].strip()
        inside = line.split("interleaved pairs [", 1)[1].split("]", 1)[0]
        found[key] = [float(x) for x in inside.split(", ") if x]
    return found


def children_and_seconds(text: str) -> tuple[int | None, float | None]:
    """From the interleaved gate's note "...: N child runs, S s"."""
    m = re.search(r": (\d+) child runs, ([0-9.]+) s", text)
    return (int(m.group(1)), float(m.group(2))) if m else (None, None)


def gate_verdict(text: str) -> dict[str, bool]:
    lines = text.splitlines()
    return {
        "failed": any(line.startswith("REGRESS") for line in lines),
        # "UNDECIDED (": the section of the four verdicts (issue 28), was "inconclusive ("
        "inconclusive": "UNDECIDED (" in text or "inconclusive (" in text,
    }


def run_pytest(work: Path, args: list[str], busy: bool | int, threads: int) -> tuple[int, str]:
    """One pytest run in ``work``; ``busy``: that many CPU-burning neighbours beside it."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    env.pop("GITHUB_STEP_SUMMARY", None)
    env.pop("GITHUB_ACTIONS", None)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(int(busy))]
    try:
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:xdist",
                "--benchmark-max-time=0.3",
                "test_timed.py",
                *args,
            ],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    return p.returncode, p.stdout + p.stderr


def bench_medians(path: Path) -> dict[str, float]:
    data = json.loads(path.read_text())
    return {b["name"]: b["stats"]["median"] for b in data["benchmarks"]}


def pb_verdicts(base: dict[str, float], new: dict[str, float]) -> dict[str, bool]:
    """Would pytest-benchmark's median:5% / median:25% have failed this compare?"""
    ratios = [new[k] / base[k] for k in base if k in new]
    return {f"median:{p}%": any(r > 1 + p / 100 for r in ratios) for p in (5, 25)}


# -- the four-verdict matrix (issue 28) ---------------------------------------------------------

#: One timed metric per workload, so a gate's summary line is that metric's verdict.
MATRIX_TESTS = {
    "sleep": textwrap.dedent(
        """
        import time

        import perf
        from planted import SLOWDOWN

        WORK_S = 0.002 * (1 + SLOWDOWN)


        def test_step(perf_metrics):
            perf_metrics.record("step_s", perf.measure(lambda: time.sleep(WORK_S), number=1,
                                                       samples=15, warmup=1))
        """
    ),
    "cpu": textwrap.dedent(
        """
        import perf
        from planted import SLOWDOWN

        N = round(20 * (1 + SLOWDOWN))


        def python_loop():
            for _ in range(N):
                sum(range(400))


        def test_step(perf_metrics):
            perf_metrics.record("step_s", perf.measure(python_loop))
        """
    ),
}
MATRIX_LEVELS = (0.10, 0.30, 2.0)
VERDICTS = ("regression", "improvement", "unchanged", "undecided")
_SUMMARY = re.compile(
    r"perf gate (?:passed|FAILED): (\d+) regressions, (\d+) improvements, (\d+) unchanged"
    r"(?:, (\d+) undecided)?"
)


def verdict_of(section: str) -> str:
    """The one metric's verdict from a gate section's summary line ("other": no verdict,
    e.g. not compared, or the gate did not run)."""
    m = _SUMMARY.search(section)
    if not m:
        return "other"
    counts = [int(g or 0) for g in m.groups()]
    return VERDICTS[counts.index(1)] if sum(counts) == 1 else "other"


def settle_seconds(section: str) -> float:
    """Seconds the stored gate spent settling against the baseline's commit (0: none)."""
    m = re.search(r"against the baseline's commit \w+[^:]*: \d+ child runs, ([0-9.]+) s", section)
    return float(m.group(1)) if m else 0.0


def matrix(ns: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (load, workload) cell: baselines, A/A and planted compares; one record each."""
    records: list[dict[str, Any]] = []
    loads = [("quiet", 0)] + ([(f"{ns.hogs} hogs", ns.hogs)] if ns.hogs else [])
    levels = [float(x) for x in ns.matrix_levels.split(",") if x]
    t0 = time.time()
    for load, hogs in loads:
        for workload in ns.workloads.split(","):
            with tempfile.TemporaryDirectory(prefix="perf-verdicts-bench-") as tmp:
                work = Path(tmp)
                (work / "test_timed.py").write_text(MATRIX_TESTS[workload])
                git(work, "init", "-q")
                (work / ".gitignore").write_text(".benchmarks/\n*.json\n__pycache__/\n*.md\n")
                extra = ["-v", *ns.pytest_args]
                if workload == "sleep":  # CPU neighbours cannot slow a sleep
                    extra += ["--perf-no-reference", "-o", "perf_busy_cpu_fraction=1"]
                for i in range(ns.reps):
                    base_commit = plant(work, 0.0, True)
                    t_save = time.perf_counter()
                    rc, out = run_pytest(
                        work, [*extra, "--benchmark-save", f"rep{i:02d}"], hogs, ns.threads
                    )
                    save_s = time.perf_counter() - t_save
                    if rc != 0:
                        print(out[-3000:])
                        raise SystemExit(f"baseline {load}/{workload}/{i} failed (exit {rc})")
                    noisy = "NOISY baseline" in out
                    for s in [0.0] + (levels if i < ns.planted_reps else []):
                        plant(work, s, True)
                        t_cmp = time.perf_counter()
                        rc, out = run_pytest(
                            work,
                            [
                                *extra,
                                f"--benchmark-compare=rep{i:02d}",
                                f"--perf-against={base_commit}",
                            ],
                            hogs,
                            ns.threads,
                        )
                        parts = sections(out)
                        stored = parts.get("perf gate", "")
                        inter = next(
                            (v for k, v in parts.items() if k.startswith("perf gate against")), ""
                        )
                        rec = {
                            "load": load,
                            "workload": workload,
                            "rep": i,
                            "slowdown": s,
                            "exit": rc,
                            "stored": verdict_of(stored),
                            "interleaved": verdict_of(inter),
                            "settle_s": settle_seconds(stored),
                            "noisy_baseline": noisy,
                            "save_s": round(save_s, 1),
                            "wall_s": round(time.perf_counter() - t_cmp, 1),
                        }
                        records.append(rec)
                        print(
                            f"[{time.time() - t0:6.0f}s] {load:>7} {workload:>5} rep {i:2d} "
                            f"{s:+5.0%}: stored {rec['stored']}, interleaved "
                            f"{rec['interleaved']} (settle {rec['settle_s']:.0f} s, "
                            f"compare {rec['wall_s']:.0f} s)",
                            flush=True,
                        )
                        if ns.keep and (
                            ns.keep_all or "other" in (rec["stored"], rec["interleaved"])
                        ):
                            ns.keep.mkdir(parents=True, exist_ok=True)
                            name = f"{load.replace(' ', '')}_{workload}_{i:02d}_{s:.2f}.txt"
                            (ns.keep / name).write_text(out)
                        if ns.out:
                            write_matrix(ns, records, partial=True)
    return records


def matrix_table(records: list[dict[str, Any]]) -> list[str]:
    """The Markdown table: one row per (load, workload, gate, planted level)."""
    head = (
        "| load | workload | gate | planted | runs | regression | improvement | "
        "unchanged | undecided | other | settle s (max) |"
    )
    lines = [head, "|" + "---|" * 11]
    keys = sorted(
        {(r["load"], r["workload"], r["slowdown"]) for r in records},
        key=lambda k: (k[0] != "quiet", k[0], k[1], k[2]),
    )
    for load, workload, s in keys:
        rs = [
            r for r in records if (r["load"], r["workload"], r["slowdown"]) == (load, workload, s)
        ]
        for gate in ("stored", "interleaved"):
            n = {v: sum(r[gate] == v for r in rs) for v in (*VERDICTS, "other")}
            settle = max(r["settle_s"] for r in rs) if gate == "stored" else None
            planted = "A/A" if s == 0 else f"x{1 + s:g}" if s >= 1 else f"+{s:.0%}"
            lines.append(
                f"| {load} | {workload} | {gate} | {planted} | {len(rs)} | "
                + " | ".join(str(n[v]) for v in (*VERDICTS, "other"))
                + f" | {'-' if settle is None else f'{settle:.0f}'} |"
            )
    return lines


def estimate_s(
    records: list[dict[str, Any]], reps: int, planted: int, levels: int, cells: int
) -> float:
    """The full matrix's duration from this run's own per-run times (median save, median
    A/A compare, median planted compare), for ``cells`` (load, workload) cells."""

    def med(xs: list[float]) -> float:
        xs = sorted(xs)
        return xs[len(xs) // 2] if xs else 0.0

    save = med([r["save_s"] for r in records if r["slowdown"] == 0])
    aa = med([r["wall_s"] for r in records if r["slowdown"] == 0])
    planted_s = med([r["wall_s"] for r in records if r["slowdown"] > 0])
    return cells * (reps * (save + aa) + planted * levels * planted_s)


def write_matrix(ns: argparse.Namespace, records: list[dict[str, Any]], partial: bool) -> None:
    write_out(ns, records, partial, table=matrix_table(records))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--planted-reps", type=int, default=10)
    ap.add_argument("--levels", default=",".join(str(x) for x in LEVELS))
    ap.add_argument(
        "--busy",
        type=float,
        default=0.0,
        help="fraction of pytest runs with a CPU-burning neighbour",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS for the pytest runs (0: torch's default)",
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--interleaved",
        action="store_true",
        help="also gate every compare with --perf-against=<base commit>",
    )
    ap.add_argument(
        "--sleep-workload",
        action="store_true",
        help="control run: sleep-bound tests, --perf-no-reference",
    )
    ap.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="folder for the pytest output of every run our gate failed",
    )
    ap.add_argument(
        "--keep-all",
        action="store_true",
        help="with --keep: keep the output of every compare, not only failures",
    )
    ap.add_argument(
        "--pytest-args",
        default="",
        help="extra pytest arguments for every run, e.g. '-o perf_time_tolerance=0.15'",
    )
    ap.add_argument(
        "--matrix",
        action="store_true",
        help="the four-verdict matrix (issue 28): quiet and --hogs, sleep and cpu, "
        "stored gate and --perf-against, A/A and --matrix-levels",
    )
    ap.add_argument(
        "--hogs",
        type=int,
        default=2,
        help="--matrix: CPU-burning neighbours in the loaded half (0: quiet only)",
    )
    ap.add_argument("--workloads", default="sleep,cpu", help="--matrix: workloads to run")
    ap.add_argument(
        "--matrix-levels",
        default=",".join(str(x) for x in MATRIX_LEVELS),
        help="--matrix: planted slowdowns (2.0 = 3x)",
    )
    ap.add_argument(
        "--estimate",
        action="store_true",
        help="--matrix: print how long the full matrix (20 reps, 10 planted) "
        "would take, from this run's timings",
    )
    ns = ap.parse_args(argv)
    ns.pytest_args = shlex.split(ns.pytest_args)
    if ns.matrix:
        t0 = time.time()
        records = matrix(ns)
        print("\n".join(matrix_table(records)))
        print(f"wall: {time.time() - t0:.0f} s for {len(records)} compares")
        if ns.estimate:
            cells = (2 if ns.hogs else 1) * len(ns.workloads.split(","))
            levels_n = len([x for x in ns.matrix_levels.split(",") if x])
            full = estimate_s(records, 20, 10, levels_n, cells)
            print(
                f"estimated full matrix (20 A/A, 10 per level, {cells} cells): {full / 3600:.1f} h"
            )
        if ns.out:
            write_matrix(ns, records, partial=False)
        return 0
    levels = [float(x) for x in ns.levels.split(",") if x]
    rng = random.Random(ns.seed)
    records: list[dict[str, Any]] = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="perf-gate-bench-") as tmp:
        work = Path(tmp)
        (work / "test_timed.py").write_text(TESTS_SLEEP if ns.sleep_workload else TESTS)
        if ns.interleaved:
            git(work, "init", "-q")
            (work / ".gitignore").write_text(".benchmarks/\n*.json\n__pycache__/\n")
        # sleep-bound tests: CPU neighbours cannot slow a sleep, so no busy-CPU check either
        extra = (
            ["--perf-no-reference", "-o", "perf_busy_cpu_fraction=1"] if ns.sleep_workload else []
        )
        extra += ns.pytest_args
        for i in range(ns.reps):
            busy = rng.random() < ns.busy
            bjson = work / f"base{i}.json"
            base_commit = plant(work, 0.0, ns.interleaved)
            rc, out = run_pytest(
                work,
                [*extra, "--benchmark-save", f"rep{i:02d}", f"--benchmark-json={bjson}"],
                busy,
                ns.threads,
            )
            if rc != 0:
                print(out[-3000:])
                raise SystemExit(f"baseline run {i} failed (exit {rc})")
            base = bench_medians(bjson)
            plan = [0.0] + (levels if i < ns.planted_reps else [])
            for s in plan:
                cbusy = rng.random() < ns.busy
                cjson = work / f"cmp{i}_{s}.json"
                plant(work, s, ns.interleaved)
                against = [f"--perf-against={base_commit}"] if base_commit else []
                load_1m = os.getloadavg()[0]  # other work on the box before this compare
                t_cmp = time.perf_counter()
                rc, out = run_pytest(
                    work,
                    [
                        *extra,
                        f"--benchmark-compare=rep{i:02d}",
                        f"--benchmark-json={cjson}",
                        *against,
                    ],
                    cbusy,
                    ns.threads,
                )
                parts = sections(out)
                stored = gate_verdict(parts.get("perf gate", ""))
                rec = {
                    "rep": i,
                    "slowdown": s,
                    "exit": rc,
                    "base_busy": busy,
                    "cmp_busy": cbusy,
                    "ours_failed": stored["failed"],
                    "inconclusive": stored["inconclusive"],
                    "remeasured": "re-measured:" in out,
                    "wall_s": round(time.perf_counter() - t_cmp, 1),
                    "loadavg_1m_before": round(load_1m, 2),
                    **pb_verdicts(base, bench_medians(cjson)),
                }
                if base_commit:
                    section = next(
                        (v for k, v in parts.items() if k.startswith("perf gate against")), ""
                    )
                    inter = gate_verdict(section)
                    rec["inter_failed"] = inter["failed"]
                    rec["inter_inconclusive"] = inter["inconclusive"]
                    rec["inter_pairs"] = pair_ratios(section)
                    rec["inter_children"], rec["inter_wall_s"] = children_and_seconds(section)
                    rec["inter_skewed_pairs"] = sum(
                        int(n) for n in re.findall(r"; (\d+) pair\(s\) set aside", section)
                    )
                records.append(rec)
                if ns.out:  # after every compare: a run stopped early keeps what it measured
                    write_out(ns, records, partial=True)
                flag = "FAIL" if rec["ours_failed"] else "pass" if rc in (0, 1) else f"exit {rc}"
                if base_commit:
                    flag += (
                        "; interleaved "
                        + ("FAIL" if rec["inter_failed"] else "pass")
                        + (f" ({rec['inter_children']} children)")
                    )
                print(
                    f"[{time.time() - t0:6.0f}s] rep {i:2d} slowdown {s:4.0%} busy "
                    f"{int(busy)}{int(cbusy)}: ours {flag}"
                    f"{' (inconclusive)' if rec['inconclusive'] else ''}; pb 5% "
                    f"{'FAIL' if rec['median:5%'] else 'pass'}, 25% "
                    f"{'FAIL' if rec['median:25%'] else 'pass'}",
                    flush=True,
                )
                if rc not in (0, 1):
                    print(out[-3000:])
                if ns.keep and (rc == 1 or ns.keep_all):
                    ns.keep.mkdir(parents=True, exist_ok=True)
                    (ns.keep / f"rep{i:02d}_{s:.2f}.txt").write_text(out)
    print(json.dumps(summarise(records), indent=1))
    if ns.out:
        write_out(ns, records, partial=False)
    return 0


def write_out(
    ns: argparse.Namespace, records: list[dict[str, Any]], partial: bool, **summary: Any
) -> None:
    """Every record so far and their summary (default: ``summarise``; the matrix passes its
    ``table``), as JSON (replaced atomically)."""
    data = {
        "records": records,
        **(summary or {"summary": summarise(records)}),
        "partial": partial,
        "args": {k: str(v) for k, v in vars(ns).items()},
    }
    tmp = ns.out.with_name(ns.out.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(ns.out)


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in sorted({r["slowdown"] for r in records}):
        rs = [r for r in records if r["slowdown"] == s]
        out[f"{s:.0%}"] = {
            "runs": len(rs),
            "ours_failed": sum(r["ours_failed"] for r in rs),
            "ours_inconclusive": sum(r["inconclusive"] for r in rs),
            "ours_remeasured": sum(r.get("remeasured", False) for r in rs),
            "pb_median5_failed": sum(r["median:5%"] for r in rs),
            "pb_median25_failed": sum(r["median:25%"] for r in rs),
            "busy_compares": sum(r["cmp_busy"] or r["base_busy"] for r in rs),
        }
        if any("inter_failed" in r for r in rs):
            out[f"{s:.0%}"].update(
                interleaved_failed=sum(r["inter_failed"] for r in rs),
                interleaved_inconclusive=sum(r["inter_inconclusive"] for r in rs),
                interleaved_children_median=sorted(r["inter_children"] or 0 for r in rs)[
                    len(rs) // 2
                ],
                interleaved_wall_s_median=sorted(r.get("inter_wall_s") or 0 for r in rs)[
                    len(rs) // 2
                ],
                compare_wall_s_median=sorted(r["wall_s"] for r in rs)[len(rs) // 2],
            )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
