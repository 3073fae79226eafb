"""Timing verdicts against the base commit's *code*: base and head measured alternately, each
in a fresh process, on the same machine in the same job (asv's ``continuous``).

Why: on a shared runner the machine's speed drifts between runs (measured on the 2-core dev
VM: the same training step's 25th percentile ranged 4.8-7.4 ms across 8 back-to-back
processes), so no statistic on two runs taken at different times separates a 15% change
from that drift. Drift slower than one alternation cancels inside each base/head pair.

How:

1. The base commit is checked out into a temporary ``git worktree`` (:func:`worktree`).
2. The project's own top-level packages, those the tests imported from inside the repository
   (flat layout, ``src/`` layout, an editable install, ``PYTHONPATH`` entries, the rootdir:
   whatever put them on ``sys.path``), are mapped to the same place in the worktree
   (:func:`project_roots`, :func:`map_to_base`). A base child installs a meta-path finder
   first in line (``perf/gate/against_child.py``), so ``import mypkg`` loads the base tree's code
   whatever ``sys.path`` says, while the *current* test files and conftests run unchanged.
   perf itself is never mapped: the instrument stays the same on both sides.
3. Children run the tests alternately, base and head (A B B A A B ...), and each pair gives
   one ratio head/base of the test's location statistic (:class:`Pair`).
4. The verdict (:func:`decide`) is a one-sided distribution-free bound on the median of the
   pair ratios against the margin; it stops as soon as the outcome cannot change, so an
   unchanged test usually costs one pair.

Refused, with the reason (:class:`Refused`): a commit that is not in the local repository, a
project package with compiled extension modules (the base tree would need a build), a package
that the base tree lacks or cannot import.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf.gate.against_child import EXIT_BASE_IMPORT
from perf.gate.base_tree import (
    ImportMap,
    Refused,
    map_to_base,
    remove_stale_worktrees,
    worktree,
)
from perf.gate.paired import (
    DEFAULT_PAIRS,
    PAIR_QUANTILE,
    Alternation,
    PairedResult,
    Side,
    Timed,
    timed_metrics,
)

__all__ = ["AgainstOutcome", "base_command", "child_errors", "interleave", "keep_output"]


@dataclass(frozen=True)
class AgainstOutcome:
    """What an interleaved measurement against a base commit found."""

    commit: str
    results: tuple[PairedResult, ...]
    #: The first base child's run of every metric-recording test
    #: (a :class:`perf.store.runs.Run`; counts and bytes are compared against it).
    base_run: Any
    children: int
    wall_s: float
    notes: tuple[str, ...] = ()


def base_command(imap: ImportMap, head_cmd: Sequence[str]) -> list[str]:
    """The base child's command: the head child's ``python -m pytest ARGS`` with ``-m pytest``
    swapped for the ``against_child.py`` script and the import map in front of ``ARGS``."""
    from perf.gate import against_child

    if list(head_cmd[1:3]) != ["-m", "pytest"]:
        raise ValueError(f"expected a `python -m pytest ...` command, got {head_cmd[:3]}")
    return [head_cmd[0], str(Path(against_child.__file__)), imap.to_json(), *head_cmd[3:]]


def interleave(
    *,
    repo: Path,
    commit: str,
    project: Mapping[str, Path],
    head_cmd: Callable[[list[str], Path], list[str]],
    env: Mapping[str, str],
    cwd: Path,
    margins: Mapping[tuple[str, str], float],
    units: Mapping[tuple[str, str], str],
    all_nodeids: Sequence[str],
    max_pairs: int = DEFAULT_PAIRS,
    confidence: float = 0.95,
    quantile: float = PAIR_QUANTILE,
    max_load_skew: float | None = None,
    timeout_s: float = 900.0,
    budget_s: float | None = None,
) -> AgainstOutcome:
    """Check out ``commit``, then measure the timed metrics alternately on its code and on the
    working tree's, each side in fresh pytest processes (see the module docstring).

    ``head_cmd(nodeids, out_path)`` is the command of a head child that runs ``nodeids`` and
    writes its run (stored-run JSON) to ``out_path``. Raises :class:`Refused` with the reason
    when the base tree cannot be measured. ``budget_s`` bounds the alternation's time (the
    stored gate's settling budget); metrics still open then end undecided (``BUDGET_SPENT``).
    A child that exits non-zero leaves its output in a kept folder (``perf-against-failed-*``
    under the temporary directory) that the verdict names: the children's own folder is
    removed, and so is the children's warm starter.
    """
    import time

    from perf.gate import processes
    from perf.store.runs import load
    from perf.store.schema import BaselineError

    t0 = time.perf_counter()
    base_full: list[Any] = []
    said: dict[Side, str] = {}
    kept_dir: list[Path] = []
    stale = remove_stale_worktrees(repo)
    with (
        worktree(repo, commit) as tree,
        tempfile.TemporaryDirectory(prefix="perf-pairs-") as tmp,
        processes.warm_starts(),
    ):
        imap = map_to_base(project, repo, tree)
        count = 0

        def run_child(side: Side, nodeids: list[str]) -> tuple[Timed, float | None]:
            nonlocal count
            count += 1
            first_base = side == "base" and not base_full
            ids = list(all_nodeids) if first_base else nodeids
            out = Path(tmp) / f"{count:03d}_{side}.json"
            cmd = head_cmd(ids, out)
            if side == "base":
                cmd = base_command(imap, cmd)
            try:
                proc = processes.run(cmd, cwd=cwd, env=env, timeout_s=timeout_s)
            except subprocess.TimeoutExpired:
                raise Refused(f"a {side} child ran longer than {timeout_s:.0f} s") from None
            said[side] = child_errors(proc.stdout + proc.stderr)
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
            if proc.returncode != 0:
                kept = keep_output(kept_dir, f"{count:03d}_{side}.log", cmd, proc)
                said[side] = "; ".join(t for t in (said[side], f"output kept in {kept}") if t)
                tail += f" (output kept in {kept})"
            if side == "base" and proc.returncode == EXIT_BASE_IMPORT:
                why = [ln for ln in proc.stderr.splitlines() if ln.startswith("perf: ")]
                raise Refused(why[-1].removeprefix("perf: ") if why else tail)
            if not out.exists():
                raise Refused(f"the {side} child wrote no results (exit {proc.returncode}): {tail}")
            try:
                run = load(out)
            except BaselineError as e:
                raise Refused(f"the {side} child's results are unreadable: {e}") from None
            if first_base:
                base_full.append(run)
            share = (run.cpu or {}).get("others_fraction")
            return timed_metrics(run.tests), share

        alt = Alternation(run_child, margins, max_pairs, confidence, quantile, max_load_skew)
        alt.explain = lambda side: said.get(side, "")
        alt.budget_s = budget_s
        alt.run()
        if not base_full:  # no timed metric: one base run still gates the counts and bytes
            run_child("base", list(all_nodeids))
            alt.children += 1
    notes = tuple(
        f"{n}::{m}: {why}" if "::" not in n else f"{n} {m}: {why}"
        for (n, m), why in sorted(alt.missing.items())
    )
    if alt.budget_spent:
        notes += (
            f"the re-measurement budget ({budget_s:.0f} s) ran out after {alt.children} "
            "children: metrics still open are undecided",
        )
    return AgainstOutcome(
        commit,
        tuple(alt.results(units)),
        base_full[0] if base_full else None,
        alt.children,
        time.perf_counter() - t0,
        (*stale, *notes),
    )


def keep_output(kept_dir: list[Path], name: str, cmd: Sequence[str], proc: Any) -> Path:
    """Write a failed child's command and output to a folder that outlives the measurement
    (created on first use, one per interleaved measurement); returns the file."""
    import shlex

    if not kept_dir:
        kept_dir.append(Path(tempfile.mkdtemp(prefix="perf-against-failed-")))
    path = kept_dir[0] / name
    path.write_text(
        f"$ {shlex.join(cmd)}\nexit {proc.returncode}\n--- stdout ---\n{proc.stdout}"
        f"\n--- stderr ---\n{proc.stderr}",
        encoding="utf-8",
    )
    return path


def child_errors(output: str, limit: int = 3) -> str:
    """The errors a child printed (collection errors, failed tests: pytest's ``E   ...`` lines
    and ``ERROR ...`` / ``FAILED ...`` summary lines), for a verdict that says why a side
    measured nothing; empty when it printed none."""
    picked: list[str] = []
    for line in output.splitlines():
        s = line.strip()
        if s.startswith(("E   ", "ERROR ", "FAILED ")) and s not in picked:
            picked.append(s.removeprefix("E").strip())
    return "; ".join(picked[:limit])
