"""The GPU time model against a real GPU: modelled / measured per workload and per op class.

    python benchmarks/model_vs_gpu.py --out benchmarks/results/model_vs_gpu_<gpu>.json
    python benchmarks/model_vs_gpu.py --device cuda:1 --target "H100 SXM"

Runs the property suite's workloads (the P1 matmul sweep and Iris step, P2's logging loop,
P4's pinned and pageable copy loops, P6's three Adam implementations, a wider MLP step) on
``cuda:N``. For each: the modelled time (``perf.model_gpu_time`` on the GPU's own op stream,
target from the GPU's name unless ``--target`` is given), the measured time
(``perf.measure``: CUDA-synchronised, warmed up, the median of its samples) and, per aten op,
the kernel time the profiler saw against the model's kernel time. Writes one JSON with every
row and the summary the model's goal is stated in: median |modelled - measured| / measured
over the workloads (goal: at most 25%).

It also fits one host cost per dispatched op to the Iris and Adam steps and reports the
other workloads' error with it (``host_fit``). Exit status: 0 when it ran (whatever the
error), 2 without CUDA, before anything runs. Results of the first runs (an H200):
docs/measurements.md, "Accuracy against a GPU".

    python benchmarks/model_vs_gpu.py --replay benchmarks/results/model_vs_gpu_<gpu>.json

On a box without a GPU: runs the same workloads on the simulated device, models them with
the current model on the results' target, and compares with the times measured on that GPU.
This is what CPU-only CI does (the model reads ``sim``'s op stream), checked against a real
GPU; each row also says whether ``sim`` dispatched and launched what the GPU run did (for
results of model version 2 and before, whose op counts held a dispatch mode's own ``detach``
calls, the launches only), and it fits the host cost per op again on ``sim``'s stream. It
hides any GPU of its own box from itself. Exit status 0 when it ran, 2 for a file that is
not such results.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCHEMA = "perf-model-vs-gpu/1"
GOAL_MEDIAN_ERROR = 0.25
NEEDS_CUDA = (
    "model_vs_gpu needs CUDA: torch.cuda.is_available() is False here (torch {torch}, CUDA "
    "build {cuda}). It compares the GPU time model with a real GPU; run it on a GPU box. On a "
    "CPU box the model runs on the simulated device (pytest tests/benchmarks)."
)
#: health.nominal_peaks' model names that the model's table names otherwise
_TARGET_OF = {"H200 SXM": "H200", "H200 NVL": "H200", "H100 NVL": "H100 PCIe"}


def target_for(device_name: str) -> str | None:
    """The model's target for a ``torch.cuda.get_device_name()`` (None: not in the table)."""
    from perf.instruments.gpu_targets import TARGETS
    from perf.instruments.health import nominal_peaks

    peaks = nominal_peaks(device_name)
    if peaks is None:
        return None
    name = _TARGET_OF.get(peaks.model, peaks.model)
    return name if name in TARGETS else None


def workloads(dev: Any) -> dict[str, Callable[[], Any]]:
    """name -> one call of the workload on ``dev`` (state built, optimizers primed)."""
    import torch

    from perf.workloads.data import iris_split, synthetic_classification
    from perf.workloads.loops import make_train_step, train_loop
    from perf.workloads.models import mlp

    out: dict[str, Callable[[], Any]] = {}
    for n in (256, 1024, 4096):
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.randn(n, n, device=dev, dtype=dtype)
            out[f"p1_matmul_{n}_{str(dtype).split('.')[1]}"] = lambda a=a: a @ a
    for impl, kw in {"forloop": {"foreach": False}, "foreach": {"foreach": True},
                     "fused": {"fused": True}}.items():  # fmt: skip
        x, y, _, _ = iris_split(device=dev)
        model = mlp().to(dev)
        opt = torch.optim.Adam(model.parameters(), 1e-2, **kw)
        out[f"p1_iris_step_{impl}"] = make_train_step(model, opt, x, y)
        m6 = mlp(64, 64, 3, 10).to(dev)
        x6, _ = synthetic_classification(32, 64, device=dev)
        o6 = torch.optim.Adam(m6.parameters(), lr=1e-3, **kw)
        m6(x6).square().mean().backward()
        o6.step()
        out[f"p6_adam_step_{impl}"] = o6.step
    X, Y, _, _ = iris_split(device=dev)
    m2 = mlp(4, 16, 1, 3).to(dev)
    o2 = torch.optim.Adam(m2.parameters(), lr=1e-2)
    for k in (1, 10, 0):
        out[f"p2_iris_20_steps_log_every_{k}"] = lambda k=k: train_loop(
            m2, o2, X, Y, steps=20, log_every=k
        )
    w = torch.randn(512, 512, device=dev)
    copies = (("pinned_non_blocking", True, True), ("pinned_blocking", True, False),
              ("pageable", False, False))  # fmt: skip
    for name, pinned, nb in copies:
        batches = [torch.randn(512, 512, device="cpu") for _ in range(4)]
        if pinned:
            batches = [b.pin_memory() for b in batches]

        def copy_loop(batches=batches, nb=nb) -> None:
            for b in batches:
                h = b.to(dev, non_blocking=nb)
                for _ in range(4):
                    h = h @ w

        out[f"p4_copy_loop_{name}"] = copy_loop
    xm, ym = synthetic_classification(512, 256, 10, device=dev)
    mm = mlp(256, 1024, 2, 10).to(dev)
    out["mlp_256_1024x2_step"] = make_train_step(
        mm, torch.optim.Adam(mm.parameters(), lr=1e-3), xm, ym
    )
    return out


def profile_by_op(fn: Callable[[], Any], dev: Any) -> dict[str, float]:
    """Seconds of device (kernel) time per aten op in one call, from the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(dev)
    by: dict[str, float] = {}
    for evt in prof.key_averages():
        if not evt.key.startswith("aten::"):
            continue
        us = getattr(evt, "self_device_time_total", None)
        if us is None:
            us = getattr(evt, "self_cuda_time_total", 0.0)
        if us:
            by[evt.key.removeprefix("aten::")] = us * 1e-6
    return by


def dispatched_ops(events: list[Any]) -> int:
    """The model's events that are dispatched ops (kernels, copies, host-only ops)."""
    return sum(e.kind in ("kernel", "copy", "host") for e in events)


#: The rows a host figure is fitted on (launch-bound training steps); the rest are held out.
FIT_ROWS = ("p1_iris_step_", "p6_adam_step_")


def host_fit(
    events: dict[str, list[Any]], measured_s: dict[str, float], tgt: Any
) -> dict[str, Any]:
    """One host cost per dispatched op (launching or not: ``host_op_s`` = ``host_dispatch_s``)
    fitted to the launch-bound training steps (:data:`FIT_ROWS`): the value, on a 0.5 us grid
    from 0.5 to 100 us, whose modelled times have the smallest median relative error there;
    then the median error of the held-out rows with it. Deterministic: the events are the
    model's own and the timeline is pure."""
    from perf.core.stats import median
    from perf.instruments.gpu_targets import with_host_cost
    from perf.instruments.gpu_timeline import simulate

    def errors(host_s: float, names: list[str]) -> list[float]:
        t = with_host_cost(tgt, host_s * 1e6)
        return [abs(simulate(events[n], t).total_s - measured_s[n]) / measured_s[n] for n in names]

    fit = [n for n in events if n.startswith(FIT_ROWS)]
    held = [n for n in events if n not in fit]
    best = min((k * 0.5e-6 for k in range(1, 201)), key=lambda h: median(errors(h, fit)))
    return {
        "host_op_s": best,
        "fit_rows": fit,
        "fit_median_relative_error": median(errors(best, fit)),
        "held_out_rows": held,
        "held_out_median_relative_error": median(errors(best, held)),
        "held_out_relative_errors": dict(zip(held, errors(best, held), strict=True)),
    }


def run(device: str, target: str | None) -> dict[str, Any]:
    import torch

    import perf
    from perf.core.stats import median
    from perf.instruments.gpu_model import model_gpu_time
    from perf.instruments.gpu_targets import get_target
    from perf.instruments.gpu_timeline import kernel_time

    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev)
    tname = target or target_for(name)
    if tname is None:
        raise SystemExit(f"no model target for GPU {name!r}: pass --target (one of the table)")
    tgt = get_target(tname)
    rows = []
    events: dict[str, list[Any]] = {}
    for wname, fn in workloads(dev).items():
        fn()
        fn()  # warm: allocator, cuBLAS handles, optimizer state
        torch.cuda.synchronize(dev)
        with model_gpu_time(dev, tgt) as t:
            fn()
        torch.cuda.synchronize(dev)
        measured = perf.measure(fn, device=dev, min_run_time_s=0.2)
        modelled_kernels: defaultdict[str, float] = defaultdict(float)
        for ev in t.events:
            if ev.kind == "kernel":
                modelled_kernels[ev.name] += kernel_time(ev, tgt)[0]
        profiled = profile_by_op(fn, dev)
        ops = {
            op: {"modelled_s": modelled_kernels.get(op, 0.0), "measured_s": profiled.get(op, 0.0)}
            for op in sorted(set(modelled_kernels) | set(profiled))
        }
        events[wname] = list(t.events)
        err = abs(t.total_s - measured.median_s) / measured.median_s
        rows.append({
            "workload": wname, "modelled_s": t.total_s, "measured_s": measured.median_s,
            "samples_s": list(measured.samples_s), "relative_error": err,
            "modelled_over_measured": t.total_s / measured.median_s, "bound": t.bound,
            "launches": t.launches, "by_op": ops,
            "dispatched_ops": dispatched_ops(t.events),
        })  # fmt: skip
        print(
            f"{wname:40s} modelled {t.total_s * 1e6:10.1f} us  measured "
            f"{measured.median_s * 1e6:10.1f} us  error {err:6.1%}  ({t.bound})",
            flush=True,
        )
    errors = [r["relative_error"] for r in rows]
    fitted = host_fit(events, {r["workload"]: r["measured_s"] for r in rows}, tgt)
    print(
        f"host cost per dispatched op fitted on {', '.join(fitted['fit_rows'])}: "
        f"{fitted['host_op_s'] * 1e6:.1f} us (the model's: {tgt.host_op_s * 1e6:.1f} us); "
        f"held-out median error {fitted['held_out_median_relative_error']:.1%}; model this "
        f"runner with --perf-gpu-host-op-us {fitted['host_op_s'] * 1e6:g}",
        flush=True,
    )
    from perf.instruments.gpu_targets import MODEL_VERSION

    return {
        "schema": SCHEMA,
        "gpu": name,
        "target": tgt.name,
        "model": MODEL_VERSION,
        "fingerprint": perf.fingerprint(),
        "rows": rows,
        "median_relative_error": median(errors),
        "goal_median_relative_error": GOAL_MEDIAN_ERROR,
        "goal_met": median(errors) <= GOAL_MEDIAN_ERROR,
        "host_fit": fitted,
    }


REPLAY_SCHEMA = "perf-model-vs-gpu-replay/1"


def load_results(path: Path) -> dict[str, Any]:
    """A results JSON this script wrote on a GPU; ``ValueError`` saying what is wrong."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(
            f"{path} is not results of benchmarks/model_vs_gpu.py (schema {SCHEMA!r}; found "
            f"{found!r})"
        )
    rows = doc.get("rows")
    if not isinstance(rows, list) or not all(
        isinstance(r, dict) and isinstance(r.get("measured_s"), (int, float))
        and r.get("measured_s", 0) > 0 and isinstance(r.get("workload"), str)
        for r in rows
    ):  # fmt: skip
        raise ValueError(f"{path}: every row needs a workload name and a measured_s above 0")
    return doc


def replay(doc: dict[str, Any], only: list[str] | None = None) -> dict[str, Any]:
    """Model the results' workloads on ``sim`` with the current model and the results' target
    and compare with the times measured on the GPU (see the module's docstring)."""
    import perf
    from perf.core.stats import median
    from perf.instruments.gpu_model import model_gpu_time
    from perf.instruments.gpu_targets import MODEL_VERSION, get_target

    tgt = get_target(doc["target"])
    recorded = {r["workload"]: r for r in doc["rows"]}
    unknown = sorted(set(only or ()) - set(recorded))
    if unknown:
        raise ValueError(f"no such workload in the results: {', '.join(unknown)}")
    rows = []
    events: dict[str, list[Any]] = {}
    dev = perf.simulated_device()
    # results of model 3 on count the ops the program dispatches; before, a dispatch mode's
    # own detach calls too (gpu_targets.MODEL_VERSION): then only the launches compare
    same_ops = (doc.get("model") or 1) >= 3
    for wname, fn in workloads(dev).items():
        if wname not in recorded or (only and wname not in only):
            continue
        fn()
        fn()
        with model_gpu_time(dev, tgt) as t:
            fn()
        events[wname] = list(t.events)
        rec = recorded[wname]
        now = {"dispatched_ops": dispatched_ops(t.events), "launches": t.launches}
        # the first results recorded launches only
        keys = [k for k in now if k in rec and (same_ops or k != "dispatched_ops")]
        same = all(rec[k] == now[k] for k in keys)
        what = " and ".join(k.replace("dispatched_", "") for k in keys) or "nothing"
        err = abs(t.total_s - rec["measured_s"]) / rec["measured_s"]
        rows.append({
            "workload": wname, "modelled_s": t.total_s, "measured_s": rec["measured_s"],
            "relative_error": err, "bound": t.bound, **now, "same_stream_as_gpu": same,
            "modelled_on_gpu_s": rec.get("modelled_s"),
        })  # fmt: skip
        print(
            f"{wname:36s} modelled on sim {t.total_s * 1e6:9.1f} us  measured on the GPU "
            f"{rec['measured_s'] * 1e6:9.1f} us  error {err:6.1%}  ({t.bound}; {what} "
            f"{'as' if same else 'NOT as'} on the GPU)",
            flush=True,
        )
    errors = [r["relative_error"] for r in rows]
    fitted = None
    if any(n.startswith(FIT_ROWS) for n in events) and len(events) > 1:
        fitted = host_fit(events, {n: recorded[n]["measured_s"] for n in events}, tgt)
        print(
            f"host cost per dispatched op fitted on sim's stream of {', '.join(fitted['fit_rows'])}"
            f": {fitted['host_op_s'] * 1e6:.1f} us (the model's: {tgt.host_op_s * 1e6:.1f} us); "
            f"held-out median error {fitted['held_out_median_relative_error']:.1%}",
            flush=True,
        )
    return {
        "schema": REPLAY_SCHEMA,
        "replayed": doc.get("gpu"),
        "target": tgt.name,
        "model": MODEL_VERSION,
        "fingerprint": perf.fingerprint(),
        "gpu_fingerprint": doc.get("fingerprint"),
        "rows": rows,
        "median_relative_error": median(errors) if errors else None,
        "goal_median_relative_error": GOAL_MEDIAN_ERROR,
        "goal_met": bool(errors) and median(errors) <= GOAL_MEDIAN_ERROR,
        "same_stream_rows": sum(r["same_stream_as_gpu"] for r in rows),
        "compared": "dispatched ops and launches" if same_ops else "launches",
        "host_fit": fitted,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--target", default=None, help="model target (default: from the GPU name)")
    ap.add_argument("--out", type=Path, default=None, help="results JSON to write")
    ap.add_argument(
        "--replay", type=Path, default=None, metavar="RESULTS",
        help="no GPU needed: model these results' workloads on the simulated device and "
        "compare with the times the GPU measured",
    )  # fmt: skip
    ap.add_argument(
        "--only", default=None, metavar="NAMES",
        help="with --replay: only these workloads (comma-separated)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.only and args.replay is None:
        ap.error("--only goes with --replay")
    if args.replay is not None:
        # the simulated device stands in for CUDA and refuses a process that has it: on a GPU
        # box the replay hides the GPUs from itself (torch reads this when CUDA starts)
        import os

        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        try:
            doc = load_results(args.replay)
            out = replay(doc, args.only.split(",") if args.only else None)
        except ValueError as e:
            print(f"model_vs_gpu --replay: {e}", file=sys.stderr)
            return 2
        print(
            f"median |modelled on sim - measured on {out['replayed']}| / measured: "
            f"{out['median_relative_error']:.1%} (goal <= {GOAL_MEDIAN_ERROR:.0%}); "
            f"{out['compared']} as on the GPU in {out['same_stream_rows']} of "
            f"{len(out['rows'])} rows"
        )
        if args.out is not None:
            args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
        return 0
    import torch

    if not torch.cuda.is_available():
        print(NEEDS_CUDA.format(torch=torch.__version__, cuda=torch.version.cuda), file=sys.stderr)
        return 2
    doc = run(args.device, args.target)
    print(
        f"median |modelled - measured| / measured: {doc['median_relative_error']:.1%} "
        f"(goal <= {GOAL_MEDIAN_ERROR:.0%})"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
