"""History over stored runs (perf.gate.history), Otava's change points, drift
(perf.gate.drift), ``python -m perf history``, and the sharded pool's workflow of
docs/gating.md run exactly as written."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from _runs import FP, metric

from perf.__main__ import main
from perf.gate import drift as dr
from perf.gate import history as hi
from perf.store.files import Store
from perf.store.runs import Run, make_run

M = "Linux-CPython-3.11-64bit"
ROOT = Path(__file__).resolve().parents[2]
otava = pytest.mark.skipif(
    importlib.util.find_spec("otava") is None,
    reason="change points need apache-otava (pip install 'pytest-torch-perf[history]'), "
    "which the test extra leaves out (it pins numpy 2.2 and brings cloud clients); the "
    "developer install and CI name it",
)


def _history(values: list[float], *, unit: str = "s", hib: bool = False) -> list[Run]:
    """One run per value, commit c000, c001, ... a minute apart, in order."""
    runs = []
    for i, v in enumerate(values):
        m = metric(
            "step_time_s" if unit == "s" else "speedup",
            v,
            unit,
            **({"higher_is_better": True} if hib else {}),
        )
        r = make_run(
            {"t.py::test_step": {"outcome": "passed", "metrics": [m]}},
            name=f"r{i:03d}",
            machine=M,
            fingerprint=FP,
            commit={"id": f"c{i:03d}", "branch": "main", "dirty": False},
        )
        runs.append(replace(r, date=f"2026-01-01T{i // 60:02d}:{i % 60:02d}:00"))
    return runs


def _steps(seed: int, n: int = 40, every: int = 10, step: float = 0.03) -> list[float]:
    """+3 % every ``every`` runs, 0.5 % noise (a quiet machine's median time)."""
    rng = np.random.default_rng(seed)
    return [
        1e-3 * (1 + step) ** (i // every) * (1 + 0.005 * rng.standard_normal()) for i in range(n)
    ]


def _series(runs: list[Run]) -> hi.Series:
    (s,) = hi.series(runs)
    return s


@otava
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_planted_step_every_10_runs_is_found_at_its_commit(seed: int) -> None:
    cps = hi.change_points(_series(_history(_steps(seed))))
    assert [(c.index, c.commit) for c in cps] == [(10, "c010"), (20, "c020"), (30, "c030")]
    assert all(0.02 < c.change < 0.04 for c in cps)


@otava
@pytest.mark.parametrize("seed", range(10))
def test_an_a_a_history_has_no_change_point(seed: int) -> None:
    assert hi.change_points(_series(_history(_steps(seed, step=0.0)))) == []
    assert dr.drift(_series(_history(_steps(seed, step=0.0)))) is None


@otava
def test_a_creep_inside_the_margin_is_a_drift_naming_its_commit() -> None:
    values = _steps(0, n=40, every=30)  # one +3 % step at run 30: inside a 5 % margin
    d = dr.drift(_series(_history(values)))
    assert d is not None and d.commit == "c030" and d.runs_since == 10
    assert "drifted +3" in d.message() and "from commit c030 on" in d.message()
    # k: the new level must hold for k runs; window: and be at most that many runs old
    assert dr.drift(_series(_history(values[:33]))) is None
    assert dr.drift(_series(_history(values)), window=9) is None
    # the better direction is no drift: faster times, or a higher higher-is-better ratio
    assert dr.drift(_series(_history([2e-3 - v for v in values]))) is None
    assert dr.drift(_series(_history([1 + v for v in values], unit="ratio", hib=True))) is None
    with pytest.raises(ValueError, match="1 <= k <= window"):
        dr.drift(_series(_history(values)), k=0)


def test_order_is_git_s_where_it_knows_the_commit_else_time(tmp_path: Path) -> None:
    def git(*a: str) -> str:
        return subprocess.run(
            ["git", *a],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "GIT_AUTHOR_NAME": "t",
                "GIT_AUTHOR_EMAIL": "t@t",
                "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@t",
            },
        ).stdout.strip()

    git("init", "-q")
    shas = []
    for i in range(3):
        git("commit", "-q", "--allow-empty", "-m", f"c{i}")
        shas.append(git("rev-parse", "HEAD"))
    order = hi.git_commit_order(tmp_path)
    assert order == shas
    assert hi.git_commit_order(tmp_path / "nowhere") == []
    runs = _history([1.0, 2.0, 3.0, 4.0])
    # runs 0, 1, 3 ran commits 2, 0, 1 (a re-run of old commits); run 2's commit is unknown
    commits = [shas[2], shas[0], "elsewhere", shas[1]]
    runs = [replace(r, commit={**r.commit, "id": c}) for r, c in zip(runs, commits, strict=True)]
    got = [r.commit["id"] for r in hi.order_runs(runs, order)]
    assert got == [shas[0], shas[1], "elsewhere", shas[2]]


def test_series_leave_out_partial_runs_failed_tests_and_other_machines_times() -> None:
    runs = _history([1.0, 2.0, 3.0, 4.0])
    runs[0] = replace(runs[0], partial="1 tests failed")
    runs[1] = replace(runs[1], fingerprint={**FP, "cpu_model": "Other CPU"})
    runs[2].tests["t.py::test_step"]["outcome"] = "failed"
    assert _series(runs).values == [4.0]
    assert _series(runs[:1] + runs[2:3] + runs[3:]).values == [4.0]
    assert len(hi.series(runs, include_partial=True)[0].points) == 2  # r0 (same fp) and r3
    assert hi.series(runs, ["other_metric"]) == []


@pytest.fixture
def store(tmp_path: Path) -> Path:
    s = Store.from_storage(str(tmp_path))
    for r in _history(_steps(0, n=40, every=30)):
        s.save(r)
    return tmp_path


def _cli(store: Path, *args: str) -> int:
    return main(["--storage", str(store), "--machine", M, "history", *args])


@otava
def test_cli_prints_each_metric_its_change_points_and_drift(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(store, "--metric", "step_time_s") == 0
    out = capsys.readouterr().out
    assert "t.py::test_step  step_time_s  (40 runs)" in out
    (marked,) = [ln for ln in out.splitlines() if "<- new level" in ln]
    assert "0031_r030" in marked and "c030" in marked and "+3." in marked
    assert "DRIFT t.py::test_step step_time_s: drifted +3" in out
    assert _cli(store, "--fail-on-drift") == 1
    capsys.readouterr()
    assert _cli(store, "--metric", "nothing") == 0
    assert "no stored perf runs with these metrics" in capsys.readouterr().out


@otava
def test_cli_plot(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs the plots extra (matplotlib)")
    out = tmp_path / "h.png"
    assert _cli(store, "--plot", str(out)) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_without_otava_the_table_prints_and_says_how_to_get_change_points(
    store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "otava.analysis", None)  # as if not installed
    assert _cli(store) == 0
    out = capsys.readouterr().out
    assert "(40 runs)" in out and "pip install 'pytest-torch-perf[history]'" in out
    assert _cli(store, "--fail-on-drift") == 2
    assert "--fail-on-drift: change points need Apache Otava" in capsys.readouterr().err


# -- the workflow of docs/gating.md, exactly as written -------------------------------------

SUITE = """
import os

def test_step(perf_metrics):
    perf_metrics.record("syncs", 10 + int(os.environ.get("EXTRA_SYNCS", "0")), unit="syncs")

def test_memory(perf_metrics):
    perf_metrics.record("activation_bytes", 4096, unit="bytes")
"""


def _doc_blocks() -> list[str]:
    text = (ROOT / "docs" / "gating.md").read_text()
    section = text[text.index("## Sharded runs and history") :]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_the_documented_sharded_workflow_runs_as_written(tmp_path: Path) -> None:
    """shards -> merge -> gate -> history, each command as docs/gating.md writes it."""
    tests = tmp_path / "tests" / "perf"
    tests.mkdir(parents=True)
    (tests / "test_model.py").write_text(SUITE)
    (tests / "test_data.py").write_text(SUITE.replace("def test_", "def test_data_"))
    (tests / "test_comm.py").write_text(SUITE.replace("def test_", "def test_comm_"))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTEST_XDIST_WORKER", "GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS")
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTEST_ADDOPTS"] = "-p no:cacheprovider --perf-no-reference"
    blocks = _doc_blocks()
    assert len(blocks) >= 2, "docs/gating.md: the section's bash blocks are missing"
    workflow, regression = blocks[0], blocks[1]

    def bash(script: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=tmp_path,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )

    r = bash(workflow)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "merged 3 shards, 6 tests" in r.stdout
    assert "perf gate passed" in r.stdout or "unchanged: 6 metrics" in r.stdout
    assert "test_step  syncs  (1 run)" in r.stdout  # the merged run (the PR run is not saved)
    r = bash(regression, EXTRA_SYNCS="1", GITHUB_ACTIONS="true", GITHUB_WORKSPACE=str(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "REGRESSIONS (3)" in r.stdout
    # on GitHub Actions the same gate annotates each regression at its test file
    errors = [ln for ln in r.stdout.splitlines() if ln.startswith("::error file=tests/perf/")]
    assert len(errors) == 3, r.stdout


@otava
@pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")
def test_the_gate_warns_of_a_drift_and_still_passes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each accepted step stayed inside the gate (the baseline moved with it); the history
    shows the new level and the commit that started it: a warning, exit 0."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    pytester.makepyfile(
        test_x="def test_step(perf_metrics):\n"
        "    perf_metrics.record('activation_bytes', 1030, unit='bytes')\n"
    )
    store = Store.from_storage(str(pytester.path / ".benchmarks"))
    for i, v in enumerate([1000] * 12 + [1030] * 8):
        m = metric("activation_bytes", v, "bytes")
        r = make_run(
            {"test_x.py::test_step": {"outcome": "passed", "metrics": [m]}},
            name=f"r{i:03d}",
            fingerprint=FP,
            commit={"id": f"c{i:03d}", "branch": "main", "dirty": False},
        )
        store.save(replace(r, date=f"2026-01-01T00:{i:02d}:00"))
    r = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--perf-no-reference",
        "--benchmark-compare",
        "--perf-report=report.md",
    )
    assert r.ret == 0
    report = (pytester.path / "report.md").read_text()
    drift_md = report[report.index("### Drift over the stored runs") :]
    assert "- DRIFT test\\_x" in drift_md and "from commit c012 on" in drift_md
    r.stdout.fnmatch_lines(
        [
            "*unchanged: 1 metric*",
            "DRIFT test_x.py::test_step activation_bytes:"
            " drifted +3.0% (1000 B -> 1.01 KiB) from commit c012 on, held for"
            " the last 9 runs*",
        ]
    )


def test_the_gate_reads_no_history_it_cannot_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.from_storage(str(tmp_path))
    runs = _history([1e-3] * 9)
    for r in runs[:8]:
        store.save(r)
    assert dr.gate_lines(store, runs[8]) == []  # 9 runs: fewer than 2 k, nothing said
    store.save(runs[8])
    monkeypatch.setitem(sys.modules, "otava", None)  # as if not installed
    (line,) = dr.gate_lines(store, runs[8])
    assert line.startswith("perf drift: not checked (change points need Apache Otava")
