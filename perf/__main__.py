"""Command line: ``python -m perf {show,compare,plot}`` over stored runs;
``python -m perf merge`` (shards of one run made one) and ``python -m perf history`` (each
metric over commits, change points, drift); ``python -m perf gpu-preflight`` before a GPU job
measures anything; and
``python -m perf rehearse-cuda --devices N -- COMMAND`` (a command run with CUDA reported
present: :mod:`perf.core.rehearse`).

Exit codes: 0 ok, 1 a regression (``compare``) or a drift (``history --fail-on-drift``), 2 bad
usage or a run that cannot be read (the message names the file and the problem).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from perf.report.text import terminal_line
from perf.store.files import Store
from perf.store.runs import BaselineNotFound, Run, load, machine_name
from perf.store.schema import DEFAULT_STORAGE, BaselineError


def _out(line: str = "") -> None:
    """Print a line that may hold text from a stored run (escaped: see perf.report.text)."""
    print(terminal_line(line))


def _store(ns: argparse.Namespace) -> Store:
    return Store.from_storage(ns.storage)


def _load(store: Store, spec: str | None, machine: str) -> Run:
    from perf.store.merge import load_merged  # a run file, or a folder of shard runs

    ref = store.resolve(spec if spec else True, machine=machine)
    return load_merged(ref.path)


def cmd_show(ns: argparse.Namespace) -> int:
    from perf.report.text import format_value

    store = _store(ns)
    if ns.run is None:
        refs = store.runs(None if ns.all_machines else ns.machine)
        if not refs:
            _out(
                f"no stored perf runs in {store.root}"
                + ("" if ns.all_machines else f" for machine {ns.machine}")
            )
            return 0
        for r in refs:
            _out(r.label)
        return 0
    run = _load(store, ns.run, ns.machine)
    _out(f"run     {run.label}")
    _out(f"date    {run.date}")
    if run.partial:
        _out(f"partial {run.partial}")
    c = run.commit
    _out(
        f"commit  {c.get('id') or 'unknown'}{' (dirty)' if c.get('dirty') else ''}"
        f"{' on ' + str(c['branch']) if c.get('branch') else ''}"
    )
    fp = run.fingerprint
    gpus = ", ".join(str(g.get("name", "?")) for g in fp.get("gpus") or []) or "none"
    _out(
        f"machine {fp.get('cpu_model')} x{fp.get('cpu_count')}, GPUs: {gpus}, "
        f"torch {fp.get('torch')} (CUDA {fp.get('cuda')}), workers {run.workers}"
    )
    for nodeid in sorted(run.tests):
        entry = run.tests[nodeid]
        for m in entry["metrics"]:
            n = len(m.get("samples") or [])
            _out(
                f"  {nodeid}  {m['name']}  {format_value(m['value'], m['unit'])}"
                + (f"  ({n} samples)" if n else "")
                + ("" if entry["outcome"] == "passed" else f"  [{entry['outcome']}]")
            )
    return 0


def cmd_compare(ns: argparse.Namespace) -> int:
    from perf.gate.compare import compare_runs
    from perf.gate.verdict import Policy
    from perf.report.text import gate_markdown, gate_table

    store = _store(ns)
    a = _load(store, ns.a, ns.machine)
    b = _load(store, ns.b, ns.machine) if ns.b else None
    if b is None:
        refs = store.runs(ns.machine)
        if not refs:
            raise BaselineNotFound(f"no stored perf run for machine {ns.machine}")
        b = load(refs[-1].path)
    policy = Policy(
        time_tolerance=ns.time_tolerance,
        bytes_tolerance=ns.bytes_tolerance,
        ratio_tolerance=ns.ratio_tolerance,
    )
    result = compare_runs(a, b, policy)
    if ns.markdown:
        print(gate_markdown(result))
    else:
        for line in gate_table(result, verbose=ns.verbose):
            print(line)  # gate_table escapes every line
    return 1 if result.failed else 0


def cmd_plot(ns: argparse.Namespace) -> int:
    from perf.report import plots

    store = _store(ns)
    if ns.kind == "history":
        if not ns.test:
            raise plots.PlotError("plot history needs --test NODEID")
        refs = store.runs(ns.machine)
        runs = [load(r.path) for r in refs]
        path = plots.history(runs, ns.test, ns.metric, ns.out)
    else:
        run = _load(store, ns.run, ns.machine)
        fn = plots.speedup_vs_size if ns.kind == "speedup" else plots.memory_vs_batch
        path = fn(run, ns.metric, ns.out, ns.test or "")
    print(f"wrote {path}")
    return 0


def cmd_gpu_preflight(ns: argparse.Namespace) -> int:
    """The GPU is the pool's model, idle, run by a driver that supports the wheel; clocks
    reported. Exit 1 on a problem (each said as a GitHub ``::error`` on Actions)."""
    import json
    import os
    from pathlib import Path

    from perf.core import preflight as pf

    gpus, apps, driver = pf.query(samples=ns.samples, interval_s=ns.interval)
    shown = pf.visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    result = pf.judge(
        shown,
        apps,
        driver,
        expect_gpu=ns.expect_gpu,
        torch_cuda=ns.torch_cuda,
        max_utilization_pct=ns.max_utilization,
    )
    from perf.report.text import md_text

    for line in pf.markdown(result):
        _out(line)
    lines = pf.markdown(result, md_text)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        from perf.report.text import annotation

        for x in result.problems:
            print(annotation("error", "GPU preflight", x))
        for x in result.warnings:
            print(annotation("warning", "GPU preflight", x))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
    if ns.json:
        Path(ns.json).write_text(json.dumps(result.as_json(), indent=1) + "\n", encoding="utf-8")
    return 0 if result.ok else 1


def cmd_rehearse_cuda(ns: argparse.Namespace) -> int:
    """Run COMMAND, and every Python process it starts, with N H100s reported present."""
    import os
    import subprocess

    from perf.core import rehearse

    command = list(ns.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ValueError("rehearse-cuda needs a command after --, e.g. -- pytest --co")
    env = dict(os.environ)
    rehearse.activate(ns.devices, env)
    try:
        return subprocess.call(command, env=env)
    except OSError as e:
        raise ValueError(f"rehearse-cuda: cannot run {command[0]!r}: {e}") from None


def cmd_sim(ns: argparse.Namespace) -> int:
    """Run COMMAND, and every Python process it starts, on N simulated devices."""
    import os
    import subprocess

    from perf.sim.device import launch_env

    command = list(ns.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ValueError("sim needs a command after --, e.g. -- torchrun --nproc-per-node 2 t.py")
    env = launch_env(ns.devices, dict(os.environ), as_cuda=ns.as_cuda)
    if ns.collectives:
        env["PERF_SIM_COLLECTIVES"] = os.path.abspath(ns.collectives)
    try:
        return subprocess.call(command, env=env)
    except OSError as e:
        raise ValueError(f"sim: cannot run {command[0]!r}: {e}") from None


def cmd_export(ns: argparse.Namespace) -> int:
    """``export --format bencher|github-action-benchmark RUN``: a stored run as Bencher
    Metric Format or github-action-benchmark JSON (:mod:`perf.report.export`)."""
    from pathlib import Path

    from perf.report.export import export_text

    store = Store.from_storage(ns.storage)
    run = load(store.resolve(ns.run, machine=ns.machine).path)
    text = export_text(run, ns.format, bigger_is_better=ns.bigger_is_better)
    if ns.out in (None, "-"):
        sys.stdout.write(text)
        return 0
    try:
        Path(ns.out).write_text(text, encoding="utf-8")
    except OSError as e:
        raise ValueError(f"could not write {ns.out}: {e.strerror or e}") from None
    print(terminal_line(f"perf: wrote {ns.format} JSON of run {run.label} to {ns.out}"))
    return 0


def add_export_parser(sub: Any) -> None:
    """The ``export`` sub-command (self-contained: one call in :func:`build_parser`)."""
    from perf.report.export import FORMATS

    e = sub.add_parser(
        "export",
        help="write a stored run as Bencher Metric Format or github-action-benchmark JSON",
    )
    e.add_argument("--format", required=True, choices=FORMATS)
    e.add_argument("run", help="NUM, name substring, MACHINE/NUM or a file path")
    e.add_argument("-o", "--out", default=None, help="output file (default: standard output)")
    e.add_argument(
        "--bigger-is-better",
        action="store_true",
        help="github-action-benchmark: the higher-is-better ratios (tool customBiggerIsBetter) "
        "instead of the rest (customSmallerIsBetter)",
    )
    e.set_defaults(fn=cmd_export)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="perf", description="Inspect and compare stored perf runs.")
    p.add_argument(
        "--storage",
        default=DEFAULT_STORAGE,
        help="pytest-benchmark storage (default .benchmarks); runs are in its perf/",
    )
    p.add_argument(
        "--machine",
        default=machine_name(),
        help="machine folder (default: this machine, %(default)s)",
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("show", help="list stored runs, or show one run's metrics")
    s.add_argument("run", nargs="?", help="NUM, name substring, MACHINE/NUM or a file path")
    s.add_argument("--all-machines", action="store_true")
    s.set_defaults(fn=cmd_show)

    c = sub.add_parser("compare", help="gate run B against baseline run A (exit 1: regression)")
    c.add_argument("a", help="baseline run: NUM, name substring, MACHINE/NUM or a file path")
    c.add_argument("b", nargs="?", help="current run (default: the latest)")
    c.add_argument("--time-tolerance", type=float, default=0.10)
    c.add_argument("--ratio-tolerance", type=float, default=0.10)
    c.add_argument("--bytes-tolerance", type=float, default=0.02)
    c.add_argument("--markdown", action="store_true", help="print Markdown instead of a table")
    c.add_argument("-v", "--verbose", action="store_true", help="list unchanged metrics too")
    c.set_defaults(fn=cmd_compare)

    pl = sub.add_parser("plot", help="plot stored runs (needs matplotlib)")
    pl.add_argument("kind", choices=["speedup", "memory", "history"])
    pl.add_argument("metric", help="metric name, e.g. speedup or activation_bytes")
    pl.add_argument("--run", default=None, help="run for speedup/memory (default: latest)")
    pl.add_argument(
        "--test", default=None, help="test id prefix (speedup/memory) or exact test id (history)"
    )
    pl.add_argument("-o", "--out", default="perf-plot.png")
    pl.set_defaults(fn=cmd_plot)

    g = sub.add_parser(
        "gpu-preflight",
        help="before a GPU job: the pool's GPU model, idle, driver supports the torch wheel, "
        "clocks reported (exit 1: a problem)",
    )
    g.add_argument("--expect-gpu", default=None, help="a substring of every GPU's name, e.g. H100")
    g.add_argument("--torch-cuda", default=None, help="the torch wheel's CUDA variant, e.g. cu128")
    g.add_argument("--samples", type=int, default=3, help="utilisation readings (default 3)")
    g.add_argument("--interval", type=float, default=0.5, help="seconds between readings")
    g.add_argument(
        "--max-utilization",
        type=float,
        default=10.0,
        help="median GPU utilisation (percent) above which a GPU is busy (default 10)",
    )
    g.add_argument("--json", default=None, help="also write the result as JSON to this file")
    g.set_defaults(fn=cmd_gpu_preflight)

    r = sub.add_parser(
        "rehearse-cuda",
        help="run a command with CUDA reported present (N H100s) up to its first real CUDA call",
    )
    r.add_argument("--devices", type=int, default=1, help="CUDA devices to report (1-8)")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    r.set_defaults(fn=cmd_rehearse_cuda)

    sm = sub.add_parser(
        "sim",
        help="run a command (and every Python process it starts) on N simulated devices",
    )
    sm.add_argument("--devices", type=int, default=1, help="simulated devices sim:0..N-1")
    sm.add_argument(
        "--collectives", default=None, help="each process writes its collective counts here"
    )
    sm.add_argument(
        "--as-cuda",
        action="store_true",
        help="sim stands in for CUDA: CUDA-named AMP, torch.cuda.set_device/device_count, "
        "backend nccl (PERF_SIM_AS_CUDA=1)",
    )
    sm.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    sm.set_defaults(fn=cmd_sim)
    _add_merge_and_history(sub)
    add_export_parser(sub)
    return p


# -- merge and history (sharded runs, change points; perf.store.merge, perf.gate.history) --


def cmd_merge(ns: argparse.Namespace) -> int:
    """The stored runs of N shards of one commit become one run (``-o`` file and/or store)."""
    from pathlib import Path

    from perf.store.merge import load_shards, merge_runs, write

    if not ns.out and not ns.save:
        raise ValueError("merge needs -o OUT.json or --save (or both): where the merged run goes")
    store = Store.from_storage(ns.storage)
    paths = [  # NUM, name substring, MACHINE/NUM: a run of the store
        spec if Path(spec).exists() else store.resolve(spec, machine=ns.machine).path
        for spec in ns.runs
    ]
    runs = load_shards(paths)
    merged = merge_runs(runs, name=ns.name, expected=ns.expect)
    if ns.out:
        _out(f"wrote {write(merged, ns.out)}")
    if ns.save:
        _out(f"saved {store.save(merged)}")
    _out(
        f"merged {len(runs)} shards, {len(merged.tests)} tests, commit "
        f"{merged.commit.get('id') or 'unknown'}"
    )
    if merged.partial:
        _out(f"partial: {merged.partial} (never the default baseline)")
    return 0


def cmd_history(ns: argparse.Namespace) -> int:
    """Each metric over the stored runs in commit order, its change points and drifts."""
    from perf.gate import drift as dr
    from perf.gate import history as hi
    from perf.report.text import format_value

    store = Store.from_storage(ns.storage)
    refs = store.runs(ns.machine)
    runs = hi.order_runs([load(r.path) for r in refs], hi.git_commit_order())
    skipped = sum(1 for r in runs if r.partial is not None)
    found = hi.series(runs, ns.metric, tests=ns.test, include_partial=ns.include_partial)
    if not found:
        _out(f"no stored perf runs with these metrics in {store.root / ns.machine}")
        return 0
    try:
        cps = {(s.nodeid, s.metric): hi.change_points(s) for s in found}
    except hi.OtavaMissing as e:
        cps, missing = {}, str(e)
    else:
        missing = ""
    for s in found:
        _out(f"{s.nodeid}  {s.metric}  ({len(s.points)} run{'s' if len(s.points) > 1 else ''})")
        starts = {cp.index: cp for cp in cps.get((s.nodeid, s.metric), [])}
        for i, p in enumerate(s.points):
            cp = starts.get(i)
            mark = f"  <- new level {cp.change:+.1%} (p={cp.pvalue:.2g})" if cp else ""
            _out(
                f"  {p.run:<50} {(p.commit or 'unknown')[:12]:<12} "
                f"{format_value(p.value, s.unit):>14}{mark}"
            )
    if skipped and not ns.include_partial:
        _out(f"({skipped} partial runs left out; --include-partial shows them)")
    if missing:
        _out(f"change points not computed: {missing}")
        if ns.fail_on_drift:
            raise ValueError(f"--fail-on-drift: {missing}")
    if ns.plot:
        from perf.report.history_plot import history_plot

        _out(f"wrote {history_plot(found, cps, ns.plot)}")
    if missing:
        return 0
    drifts = dr.drifts(found, k=ns.k)
    for d in drifts:
        _out(f"DRIFT {d.message()}")
    if not drifts:
        _out(f"no drift (no worse level held for the last {ns.k}-{dr.DEFAULT_WINDOW} runs)")
    return 1 if drifts and ns.fail_on_drift else 0


def _add_merge_and_history(sub: Any) -> None:
    """Register ``merge`` and ``history`` on ``sub`` (argparse's sub-parsers)."""
    m = sub.add_parser("merge", help="merge the stored runs of N shards of one commit into one")
    m.add_argument("runs", nargs="+", help="run files, folders of run files, or NUM / name")
    m.add_argument("-o", "--out", default=None, help="write the merged run to this file")
    m.add_argument("--save", action="store_true", help="also store it as this store's next run")
    m.add_argument("--name", default=None, help="run name (default: <commit>_<date>)")
    m.add_argument(
        "--expect",
        type=int,
        default=None,
        help="shards the suite was split into; fewer given marks the run partial",
    )
    m.set_defaults(fn=cmd_merge)

    h = sub.add_parser("history", help="each metric over the stored runs, change points, drift")
    h.add_argument("--metric", action="append", default=None, help="metric name (repeatable)")
    h.add_argument("--test", default=None, help="test id prefix")
    h.add_argument("--plot", default=None, help="also draw the series to this PNG/SVG")
    h.add_argument("-k", type=int, default=5, help="runs a new level must hold to drift")
    h.add_argument("--include-partial", action="store_true", help="also runs marked partial")
    h.add_argument("--fail-on-drift", action="store_true", help="exit 1 when a metric drifted")
    h.set_defaults(fn=cmd_history)


def main(argv: Sequence[str] | None = None) -> int:
    from perf.core.preflight import PreflightError
    from perf.report.plots import PlotError

    ns = build_parser().parse_args(argv)
    try:
        return int(ns.fn(ns))
    except (BaselineError, BaselineNotFound, PlotError, PreflightError, ValueError) as e:
        print(terminal_line(f"perf: error: {e}"), file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
