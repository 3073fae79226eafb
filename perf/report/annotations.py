"""Feedback at the line: the gate's regressions as GitHub Actions workflow commands.

Why: a red job says *that* something got slower; an ``::error file=train.py,line=88::`` puts
the sync, graph break, recompile or leak on the line of the diff that caused it, where the
author is already looking. Pure functions from a :class:`perf.gate.verdict.GateResult` (and
the two runs behind it, whose metrics hold the sites) to lines; the plugin prints them when
``GITHUB_ACTIONS=true``.

GitHub shows at most 10 error and 10 warning annotations per step and 50 per job
(https://github.com/actions/toolkit/blob/main/docs/problem-matchers.md, "Limitations"), and
drops the rest silently. So the worst regressions come first, and when there are more than
fit, the last slot is a summary line that says how many more there are and where to read
them (the job log, the Markdown report). Every line is built by
:func:`perf.report.text.annotation`, the one workflow-command escaper.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perf.gate.verdict import GateResult, MetricResult
from perf.report.text import annotation, format_value, undecided_annotation
from perf.store.runs import Run

#: GitHub's limits: annotations of one level shown per step, and per job (all steps).
PER_STEP = 10
PER_JOB = 50
#: Metric extra keys that hold sites (``"path.py:88" -> {"n", "function", "code", "what"}``):
#: ``sync_sites`` from :func:`perf.count_syncs`, ``sites`` from leaks, compiles and any count
#: or bytes metric (modelled time too, when it records them).
SITE_KEYS = ("sync_sites", "sites")


@dataclass(frozen=True)
class LineNote:
    """One annotation before escaping: where, what, and how bad (larger ``weight`` first)."""

    level: str
    title: str
    message: str
    file: str | None = None
    line: int | None = None
    weight: float = 0.0


def on_github_actions(environ: Mapping[str, str]) -> bool:
    """GitHub sets ``GITHUB_ACTIONS=true`` in every step of a workflow run."""
    return environ.get("GITHUB_ACTIONS") == "true"


def workspace_path(path: str, *, base: str, workspace: str | None) -> str | None:
    """``path`` (absolute, or relative to ``base``) relative to ``workspace``, with ``/``;
    None outside it (a site in site-packages cannot be annotated in the diff)."""
    full = os.path.normpath(path if os.path.isabs(path) else os.path.join(base, path))
    root = os.path.abspath(workspace or base)
    try:
        rel = os.path.relpath(full, root)
    except ValueError:  # another drive (Windows)
        return None
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return None
    return rel.replace(os.sep, "/")


def split_site(site: str) -> tuple[str, int] | None:
    """``"train.py:88"`` -> ``("train.py", 88)``; None for a site without a line."""
    path, _, line = site.rpartition(":")
    return (path, int(line)) if path and line.isdigit() else None


def _n(info: Any) -> int:
    n = info.get("n", 0) if isinstance(info, dict) else 0
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


def grown_sites(
    old: Mapping[str, Any] | None, new: Mapping[str, Any]
) -> list[tuple[str, int, Mapping[str, Any]]]:
    """``(site, growth, info)`` of every site new or more frequent in ``new`` than in ``old``
    (stored metric dicts), the largest growth first. Without sites in the baseline every site
    of ``new`` counts in full: the regression is somewhere among them."""
    out: list[tuple[str, int, Mapping[str, Any]]] = []
    for key in SITE_KEYS:
        sites = (new.get("extra") or {}).get(key)
        if not isinstance(sites, dict):
            continue
        before = ((old or {}).get("extra") or {}).get(key)
        before = before if isinstance(before, dict) else {}
        for site, info in sites.items():
            delta = _n(info) - _n(before.get(site))
            if delta > 0 and isinstance(info, dict):
                out.append((site, delta, info))
    out.sort(key=lambda t: (-t[1], t[0]))
    return out


def _metric(run: Run | None, nodeid: str, name: str) -> Mapping[str, Any] | None:
    if run is None:
        return None
    for m in run.tests.get(nodeid, {}).get("metrics", []):
        if m.get("name") == name:
            return m
    return None


def _weight(r: MetricResult) -> float:
    """How bad: the ratio (a count from 0 is worst of all)."""
    if r.ratio is None:
        return 1.0
    return math.inf if r.ratio == math.inf else float(r.ratio)


def _change(r: MetricResult) -> str:
    old = "-" if r.old is None else format_value(r.old, r.unit)
    new = "-" if r.new is None else format_value(r.new, r.unit)
    ratio = "" if r.ratio in (None, math.inf) else f", {r.ratio:.3f}x"
    return f"{old} -> {new}{ratio}"


def _test_file(nodeid: str, root: str, workspace: str | None) -> str | None:
    return workspace_path(nodeid.split("::", 1)[0], base=root, workspace=workspace)


def notes(
    result: GateResult,
    baseline: Run | None = None,
    current: Run | None = None,
    *,
    root: str,
    cwd: str,
    workspace: str | None,
) -> list[LineNote]:
    """Every regression as errors, worst first: one per grown site (``file``/``line`` from the
    site, ``cwd`` being where the sites were recorded), or one on the test's file
    (``nodeid`` relative to ``root``) when it has none; every undecided timing as a warning
    on its test's file."""
    out: list[LineNote] = []
    for r in result.regressions:
        head = f"{r.nodeid} {r.name}: {_change(r)}"
        new = _metric(current, r.nodeid, r.name)
        sites = grown_sites(_metric(baseline, r.nodeid, r.name), new) if new else []
        placed = False
        for site, delta, info in sites:
            where = split_site(site)
            path = where and workspace_path(where[0], base=cwd, workspace=workspace)
            if not where or not path:
                continue
            code, what = info.get("code"), info.get("what")
            text = f"+{format_value(delta, r.unit)} here" + (f" `{code}`" if code else "")
            text += f" ({what})" if what else ""
            out.append(
                LineNote(
                    "error",
                    f"perf {r.name} regression",
                    f"{head}; {text}",
                    path,
                    where[1],
                    weight=_weight(r) * 1e6 + delta,
                )
            )
            placed = True
        if not placed:
            out.append(
                LineNote(
                    "error",
                    f"perf {r.name} regression",
                    head + (f"; {r.explanation}" if r.explanation else ""),
                    _test_file(r.nodeid, root, workspace),
                    weight=_weight(r) * 1e6,
                )
            )
    for r in result.undecided:
        out.append(
            LineNote(
                "warning",
                f"perf {r.name} undecided",
                f"{r.nodeid} {r.name}: {r.explanation}",
                _test_file(r.nodeid, root, workspace),
                weight=abs(math.log(r.ratio)) if r.ratio and r.ratio > 0 else 0.0,
            )
        )
    return out


def workflow_commands(
    result: GateResult, line_notes: Sequence[LineNote], *, per_step: int = PER_STEP
) -> list[str]:
    """The escaped lines: per level the worst ``per_step`` notes; when more than fit, the
    worst ``per_step - 1`` and a summary line naming how many are not shown. Undecided
    timings always end with the one-line summary of
    :func:`perf.report.text.undecided_annotation` (within the warnings' budget)."""
    lines: list[str] = []
    for level in ("error", "warning"):
        mine = sorted((n for n in line_notes if n.level == level), key=lambda n: -n.weight)
        summary = ""
        if level == "warning":
            summary = undecided_annotation(result)
        elif len(mine) > per_step:
            summary = annotation(
                "error",
                "perf gate",
                f"perf gate: {len(mine) - (per_step - 1)} more regression line(s) not annotated "
                f"(GitHub shows {per_step} per step): see the perf gate section of the job log "
                "or the Markdown report",
            )
        room = per_step - (1 if summary else 0)
        lines += [annotation(n.level, n.title, n.message, file=n.file, line=n.line) for n in mine][
            :room
        ]
        if summary:
            lines.append(summary)
    return lines


def github_annotations(
    result: GateResult,
    baseline: Run | None = None,
    current: Run | None = None,
    *,
    environ: Mapping[str, str],
    root: str,
    cwd: str,
) -> list[str]:
    """The workflow commands to print for ``result`` on GitHub Actions; ``[]`` elsewhere."""
    if not on_github_actions(environ):
        return []
    ws = environ.get("GITHUB_WORKSPACE") or None
    found = notes(result, baseline, current, root=root, cwd=cwd, workspace=ws)
    return workflow_commands(result, found)
