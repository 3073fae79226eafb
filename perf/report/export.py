"""A stored run in the formats of two history keepers, so a team that already tracks
benchmarks in one of them keeps its history there.

- **Bencher Metric Format** (BMF, https://bencher.dev/docs/reference/bencher-metric-format/):
  ``{benchmark: {measure: {"value": v, "lower_value"?: lo, "upper_value"?: hi}}}``. The
  benchmark is the test id, the measure the metric name; the bounds are the metric's
  interval where it has one, else the range of its raw samples.
- **github-action-benchmark**'s custom tools
  (https://github.com/benchmark-action/github-action-benchmark, "Examples", custom
  benchmarks): a JSON array of ``{"name", "unit", "value", "range"?, "extra"?}`` for the tool
  ``customSmallerIsBetter`` (counts, bytes, times, ratios where lower is better) or
  ``customBiggerIsBetter`` (ratios recorded ``higher_is_better``, e.g. a speed-up). One file
  serves one tool, so the direction is chosen when exporting; ``info`` metrics (sizes, fits)
  have no direction and are left out of both.

Pure: a :class:`perf.store.runs.Run` in, plain JSON-ready data out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from perf.store.runs import Run

FORMATS = ("bencher", "github-action-benchmark")


def _bounds(m: Mapping[str, Any]) -> tuple[float, float] | None:
    """The metric's interval, else the range of its raw samples; None without either."""
    ci = m.get("ci")
    if ci:
        lo, hi = sorted(float(c) for c in ci)
        return lo, hi
    samples = m.get("samples")
    if samples:
        return float(min(samples)), float(max(samples))
    return None


def _metrics(run: Run) -> list[tuple[str, Mapping[str, Any]]]:
    return [(nodeid, m) for nodeid in sorted(run.tests) for m in run.tests[nodeid]["metrics"]]


def to_bencher(run: Run) -> dict[str, dict[str, dict[str, float]]]:
    """The run as Bencher Metric Format: every metric, under its test id and its name."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for nodeid, m in _metrics(run):
        entry: dict[str, float] = {"value": float(m["value"])}
        b = _bounds(m)
        if b is not None:
            entry["lower_value"], entry["upper_value"] = b
        out.setdefault(nodeid, {})[m["name"]] = entry
    return out


def _bigger_is_better(m: Mapping[str, Any]) -> bool:
    return m.get("kind") == "ratio" and bool(m.get("higher_is_better"))


def to_github_action_benchmark(run: Run, *, bigger_is_better: bool = False) -> list[dict[str, Any]]:
    """The run as github-action-benchmark's custom JSON: the metrics where smaller is better
    (tool ``customSmallerIsBetter``), or with ``bigger_is_better`` those where bigger is
    (``customBiggerIsBetter``); never ``info`` metrics."""
    commit = run.commit.get("id") or "unknown"
    out: list[dict[str, Any]] = []
    for nodeid, m in _metrics(run):
        if m.get("kind") == "info" or _bigger_is_better(m) != bigger_is_better:
            continue
        entry: dict[str, Any] = {
            "name": f"{nodeid} {m['name']}",
            "unit": m["unit"],
            "value": m["value"],
        }
        b = _bounds(m)
        if b is not None:
            entry["range"] = f"{b[0]:.6g}..{b[1]:.6g}"
        extra = f"kind {m['kind']}; perf run {run.name}; commit {commit}"
        if m.get("noisy"):
            extra += f"; noisy baseline: {m['noisy']}"
        entry["extra"] = extra
        out.append(entry)
    return out


def export_text(run: Run, fmt: str, *, bigger_is_better: bool = False) -> str:
    """``run`` as JSON text in ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "bencher":
        if bigger_is_better:
            raise ValueError(
                "--bigger-is-better applies to --format github-action-benchmark only: Bencher "
                "keeps every measure in one file and sets the direction per threshold"
            )
        data: Any = to_bencher(run)
    elif fmt == "github-action-benchmark":
        data = to_github_action_benchmark(run, bigger_is_better=bigger_is_better)
    else:
        raise ValueError(f"export format {fmt!r}: use one of {', '.join(FORMATS)}")
    return json.dumps(data, indent=2, sort_keys=False) + "\n"
