"""The stored gate's settling algorithms (:mod:`perf.gate.settle`) without pytest: recorded
runs in, verdicts out; the measuring step is a parameter, here a recorded re-run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from perf.gate.compare import compare_runs
from perf.gate.settle import (
    MeasurementInterrupted,
    flag_noisy,
    recheck_against_commit,
    settle_stored,
)
from perf.gate.verdict import Policy
from perf.store.runs import Run
from tests.harness._runs import run, samples, timed

T = "t.py::test_step"


def _base() -> Run:
    return run({T: [timed("step_s", 1e-3)]}, name="base")


def _slow(factor: float, seed: int = 1) -> Run:
    return run({T: [timed("step_s", 1e-3 * factor, seed=seed)]}, name="head")


class Recorded:
    """A re-measurement that hands back recorded runs, and notes what it was asked."""

    def __init__(self, *runs: Run | None, why: str = "no run") -> None:
        self.runs = list(runs)
        self.why = why
        self.asked: list[tuple[list[str], int]] = []

    def __call__(self, nodeids: list[str], attempt: int) -> tuple[Run | None, str | None]:
        self.asked.append((nodeids, attempt))
        again = self.runs.pop(0)
        return again, None if again is not None else self.why


def test_a_regression_every_remeasurement_confirms_stands() -> None:
    policy = Policy()
    first = compare_runs(_base(), _slow(1.5), policy)
    assert first.fails(policy)
    again = Recorded(_slow(1.5, seed=2), _slow(1.5, seed=3))
    out = settle_stored(_base(), first, policy, tries=2, workers=0, collected={T}, remeasure=again)
    assert out.result.fails(policy)
    assert [a for _, a in again.asked] == [1, 2] and out.remeasured == (T, T)
    (row,) = out.result.results
    assert row.status == "regression" and row.confirmations == 2


def test_a_regression_a_remeasurement_clears_is_not_failed() -> None:
    policy = Policy()
    first = compare_runs(_base(), _slow(1.5), policy)
    out = settle_stored(
        _base(), first, policy, tries=2, workers=0, collected={T},
        remeasure=Recorded(_slow(1.0, seed=5)),
    )  # fmt: skip
    assert not out.result.fails(policy)
    assert out.result.results[0].status == "unchanged"
    assert out.remeasured == (T,)


def test_no_remeasurement_under_xdist_or_with_zero_tries() -> None:
    policy = Policy()
    first = compare_runs(_base(), _slow(1.5), policy)
    never = Recorded()
    xdist = settle_stored(
        _base(), first, policy, tries=2, workers=2, collected={T}, remeasure=never
    )
    assert xdist.result is first and xdist.note == "suspects not re-measured under xdist"
    off = settle_stored(_base(), first, policy, tries=0, workers=0, collected={T}, remeasure=never)
    assert off.result is first and off.note is None and never.asked == []


def test_suspects_not_collected_keep_the_first_verdict() -> None:
    policy = Policy()
    first = compare_runs(_base(), _slow(1.5), policy)
    out = settle_stored(
        _base(), first, policy, tries=2, workers=0, collected=set(), remeasure=Recorded()
    )
    assert out.result.fails(policy)
    assert out.note is not None and "not collected in this session" in out.note


def test_a_failed_remeasurement_says_why_and_the_first_verdict_stands() -> None:
    policy = Policy()
    first = compare_runs(_base(), _slow(1.5), policy)
    out = settle_stored(
        _base(), first, policy, tries=2, workers=0, collected={T},
        remeasure=Recorded(None, why="re-measurement 1 timed out after 900 s"),
    )  # fmt: skip
    assert out.result.fails(policy)
    assert out.note == "re-measurement 1 timed out after 900 s; the first verdict stands"


def test_a_recheck_that_answers_ends_the_settling() -> None:
    from perf.gate.settle import Settled

    policy = Policy()
    first = compare_runs(_base(), _slow(1.5), policy)
    never = Recorded()
    out = settle_stored(
        _base(), first, policy, tries=2, workers=0, collected={T}, remeasure=never,
        recheck=lambda r: Settled(r, "measured against the commit", done=True),
    )  # fmt: skip
    assert out.note == "measured against the commit" and never.asked == []


def test_recheck_without_a_recorded_commit_falls_back(tmp_path: Path) -> None:
    from dataclasses import replace

    policy = Policy()
    base = replace(_base(), commit={})
    first = compare_runs(base, _slow(1.5), policy)

    def interleave(*args: Any) -> Any:
        raise AssertionError("nothing to interleave against")

    out = recheck_against_commit(
        base, first, policy, None, rootpath=tmp_path, interleave=interleave
    )
    assert not out.done and out.result is first
    assert out.note == "the baseline recorded no commit: re-measured in this tree only"


def test_recheck_outside_a_repository_falls_back(tmp_path: Path) -> None:
    policy = Policy()
    first = compare_runs(_base(), _slow(1.5), policy)
    out = recheck_against_commit(
        _base(),
        first,
        policy,
        None,
        rootpath=tmp_path,
        interleave=lambda *a: None,  # type: ignore[arg-type,return-value]
    )
    assert not out.done
    assert out.note is not None and "no git repository here" in out.note


def test_recheck_of_nothing_doubtful_does_nothing(tmp_path: Path) -> None:
    policy = Policy()
    first = compare_runs(_base(), _slow(1.0, seed=4), policy)
    assert not first.fails(policy)
    out = recheck_against_commit(
        _base(),
        first,
        policy,
        None,
        rootpath=tmp_path,
        interleave=lambda *a: None,  # type: ignore[arg-type,return-value]
    )
    assert out.result is first and out.note is None and not out.done


def _repo(tmp_path: Path) -> str:
    """A real git repository with one commit; its id."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "f.txt").write_text("x\n")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return git("rev-parse", "HEAD")


@pytest.mark.parametrize("stop", ["interrupted", "refused"])
def test_recheck_against_a_commit_that_cannot_be_measured(tmp_path: Path, stop: str) -> None:
    """Interrupted: done (nothing else runs; the caller reported it). Refused: the caller
    falls back to re-measuring this tree, saying why."""
    from dataclasses import replace

    from perf.gate.base_tree import Refused

    sha = _repo(tmp_path)
    policy = Policy()
    base = replace(_base(), commit={"id": sha, "dirty": False})
    first = compare_runs(base, _slow(1.5), policy)
    asked: list[Any] = []

    def interleave(repo: Path, commit: str, margins: Any, units: Any, ids: Any, budget: Any) -> Any:
        asked.append((commit, margins, ids, budget))
        raise MeasurementInterrupted("stopped") if stop == "interrupted" else Refused("no room")

    out = recheck_against_commit(
        base, first, policy, None, rootpath=tmp_path, interleave=interleave
    )
    assert asked == [(sha, {(T, "step_s"): policy.time_tolerance}, [T], policy.settle_budget_s)]
    if stop == "interrupted":
        assert out.done and out.note == "stopped" and out.result is first
    else:
        assert not out.done
        assert out.note == f"cannot measure the baseline's commit {sha[:12]}: no room"


def _noisy_run() -> Run:
    from tests.harness._runs import metric

    wild = samples(1e-3, n=30, spread=1.0, seed=3)

    return run({T: [metric("step_s", 1e-3, "s", samples=wild)]}, name="save")


def test_flag_noisy_keeps_fresh_samples_that_are_not_noisy() -> None:
    current = _noisy_run()
    quiet = run({T: [timed("step_s", 1e-3, seed=7)]}, name="remeasure")
    saved, flagged = flag_noisy(current, Policy(), collected={T}, remeasure=Recorded(quiet))
    assert flagged == {}
    (m,) = saved.tests[T]["metrics"]
    assert m["samples"] == quiet.tests[T]["metrics"][0]["samples"] and "noisy" not in m
    # the run handed in is left as it was
    assert current.tests[T]["metrics"][0]["samples"] != m["samples"]


def test_flag_noisy_without_remeasurement_flags_at_once() -> None:
    saved, flagged = flag_noisy(_noisy_run(), Policy(), collected={T}, remeasure=None)
    assert list(flagged) == [f"{T} step_s"]
    assert saved.tests[T]["metrics"][0]["noisy"] == flagged[f"{T} step_s"]


def test_flag_noisy_of_a_quiet_run_is_the_run() -> None:
    current = run({T: [timed("step_s", 1e-3)]})
    assert flag_noisy(current, Policy(), collected={T}, remeasure=None) == (current, {})


# -- margins: one source, and a 0 margin is a 0 margin ----------------------------------------


def test_policy_margin_is_the_one_source_of_the_per_kind_defaults() -> None:
    p = Policy(time_tolerance=0.2, ratio_tolerance=0.3, bytes_tolerance=0.04)
    assert p.margin("time") == 0.2 and p.margin("ratio") == 0.3
    assert p.margin("bytes") == 0.04 and p.margin("compile") == p.compile_tolerance
    assert p.margin("count") == 0.0
    assert p.margin("time", 0.0) == 0.0  # not the 10 % default
    assert p.margin("bytes", 0.5) == 0.5


def test_a_zero_margin_gates_a_small_slowdown_that_the_default_would_pass() -> None:
    policy = Policy(min_samples=5)
    base = run({T: [timed("step_s", 1e-3, tolerance=0.0)]})
    head = run({T: [timed("step_s", 1.05e-3, seed=1, tolerance=0.0)]})
    (row,) = compare_runs(base, head, policy).results
    assert row.margin == 0.0
    assert row.status == "regression", row.reason
    default = compare_runs(
        run({T: [timed("step_s", 1e-3)]}), run({T: [timed("step_s", 1.05e-3, seed=1)]}), policy
    )
    assert default.results[0].status != "regression"


@pytest.mark.parametrize("kind_unit", [("s", "time"), ("ratio", "ratio")])
def test_recheck_margins_keep_a_zero_margin(kind_unit: tuple[str, str]) -> None:
    from perf.gate.interleaved import timed_margins
    from tests.harness._runs import metric

    unit, _ = kind_unit
    results = {
        T: {
            "outcome": "passed",
            "metrics": [metric("m", 1.0, unit, samples=samples(1.0), tolerance=0.0)],
        }
    }
    margins, units = timed_margins(results, Policy())
    assert margins == {(T, "m"): 0.0} and units == {(T, "m"): unit}  # fmt: skip
