"""Code or environment (issue 17): interleaving answers "is the code slower?", the stored
baseline "is this run slower?". When the run is slower and the code is not, the verdict says
the environment changed and what changed; ini ``perf_environment_change`` decides whether it
fails. Planted in real git repositories: a dependency bump (the environment) and a slower
commit (the code)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from _runs import FP, GATE_RUN_ARGS, run

from perf.core.verdicts import Reason
from perf.gate.interleaved import code_or_environment
from perf.gate.verdict import MetricResult, Policy
from perf.store.environment import differences, imported_packages, perf_env

# The step sleeps: a CPU neighbour cannot fake or hide a 3x change, so the test is not a
# perf_timing one (it need not wait for the suite's timing lock under xdist).
TEST = """
import time
import dep
import perf
import work

def test_step(perf_metrics):
    perf_metrics.record("step_time_s", perf.measure(
        lambda: time.sleep(work.STEP_S * dep.FACTOR), number=1, samples=8, warmup=1))
"""

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        env={**os.environ, **GIT_ENV},
    )


def _dep(root: Path, version: str, factor: int) -> Path:
    """An installed distribution ``dep`` (a site folder on PYTHONPATH, with dist-info)."""
    site = root / f"site-{version}"
    (site / "dep").mkdir(parents=True)
    (site / "dep" / "__init__.py").write_text(f"FACTOR = {factor}\n")
    info = site / f"dep-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: dep\nVersion: {version}\n")
    (info / "top_level.txt").write_text("dep\n")
    return site


def _pytest(pytester: pytest.Pytester, repo: Path, site: Path, *args: str) -> pytest.RunResult:
    """The run in this process (pytester, in-process: torch is imported here already, so its
    machine fingerprint is free, where a fresh process spends about 2 s of CPU importing torch
    for it), ``site`` on its sys.path; its children are fresh processes, ``site`` on their
    PYTHONPATH."""
    with pytest.MonkeyPatch.context() as mp:
        for var in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "GITHUB_STEP_SUMMARY"):
            mp.delenv(var, raising=False)
        mp.setenv("PYTHONPATH", str(site))
        mp.syspath_prepend(str(site))
        mp.chdir(repo)
        return pytester.runpytest(
            *GATE_RUN_ARGS,
            *args,
        )


# in-process, pytest-benchmark's "nothing saved" / "can't compare" warnings reach this run
@pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")
def test_a_planted_environment_slowdown_and_a_planted_code_slowdown(
    tmp_path: Path, pytester: pytest.Pytester
) -> None:
    v1, v2 = _dep(tmp_path, "1.0", 1), _dep(tmp_path, "2.0", 3)
    repo = tmp_path / "proj"
    (repo / "work").mkdir(parents=True)
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["."]\n')
    (repo / "test_step.py").write_text(TEST)
    (repo / "work" / "__init__.py").write_text("STEP_S = 0.002\n")
    (repo / ".gitignore").write_text(".benchmarks/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "fast")
    saved = _pytest(pytester, repo, v1, "--benchmark-autosave")
    assert saved.ret == 0, saved.stdout.str() + saved.stderr.str()
    (repo / "README").write_text("docs only")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "docs")

    # the environment: dep 1.0 -> 2.0 makes the step 3x slower; the code did not change.
    # Not the PR's regression: undecided, not failed, by default (issue 28; was exit 1)
    env = _pytest(pytester, repo, v2, "--benchmark-compare", "--perf-pairs=5", "-v")
    out = env.stdout.str()
    assert env.ret == 0, out + env.stderr.str()
    assert "UNDECIDED (1)" in out and "not failed (perf_environment_change = warn)" in out
    assert "ENVIRONMENT changed: package dep 1.0 -> 2.0" in out
    assert "this code is not slower than the baseline's commit's in this environment" in out

    # the code: a slower commit in the baseline's environment is the code's regression
    (repo / "work" / "__init__.py").write_text("STEP_S = 0.006\n")
    _git(repo, "commit", "-qam", "slow")
    code = _pytest(pytester, repo, v1, "--benchmark-compare", "--perf-pairs=5", "-v")
    assert code.ret == 1, code.stdout.str() + code.stderr.str()
    # the stored comparison's suspect was settled against the baseline's commit
    assert "measured alternately against the baseline's commit" in code.stdout.str()
    assert "regression: median head/base" in code.stdout.str()
    assert "ENVIRONMENT" not in code.stdout.str()


# -- the policy (pure) -----------------------------------------------------------------------


def _rows() -> tuple[MetricResult, MetricResult]:
    stored = MetricResult(
        "t.py::a", "t", "s", "time", "regression", 1e-3, 3e-3, 3.0, (2.8, 3.2), 0.1
    )
    inter = MetricResult(
        "t.py::a",
        "t",
        "s",
        "time",
        "unchanged",
        3e-3,
        3e-3,
        1.0,
        (0.98, 1.03),
        0.1,
        reason="unchanged: median head/base 1.000",
    )
    return stored, inter


def test_environment_change_warns_by_default_and_fails_when_asked() -> None:
    """Issue 28: what is not the code is not the PR's regression, so ``warn`` is the
    default (was ``fail``); ``fail`` still fails a plausible cause."""
    stored, inter = _rows()
    new_env = {"packages": {"dep": "2.0"}, "env": {"OMP_NUM_THREADS": "1"}}
    old_env = {"packages": {"dep": "1.0"}, "env": {}}
    base = replace(run({}, name="base"), environment=old_env)
    cur = replace(run({}, name="cur"), environment=new_env)
    r = code_or_environment(stored, inter, base, cur, Policy(environment_change="fail"))
    assert r.status == "regression" and r.timed.reason is Reason.ENVIRONMENT
    assert r.reason.startswith(
        "ENVIRONMENT changed: package dep 1.0 -> 2.0; env "
        "OMP_NUM_THREADS unset -> '1'. x3.00 slower"
    )
    w = code_or_environment(stored, inter, base, cur, Policy())
    assert w.status == "undecided" and "perf_environment_change = warn" in w.reason
    # the evidence, whatever it says: reference workload and CPU-contention probe
    assert "evidence: reference workload x1.00, other processes 1% of the CPUs now" in w.reason
    # the stored ratio keeps the stored interval; the interleaved one is shown beside it
    assert (w.ratio, w.ci, w.interleaved_ci) == (3.0, (2.8, 3.2), (0.98, 1.03))
    same = code_or_environment(stored, inter, base, base, Policy())
    assert same.status == "undecided" and "nothing perf records differs" in same.reason
    slower_code = MetricResult("t.py::a", "t", "s", "time", "regression", 1e-3, 3e-3, 3.0)
    assert code_or_environment(stored, slower_code, base, cur, Policy()) is slower_code


def test_a_variable_is_named_as_the_cause_only_when_the_evidence_points_at_it() -> None:
    """Issue 28: TORCHINDUCTOR_FORCE_DISABLE_CACHES was blamed for a 1.42x slower step that a
    busy neighbour caused. A variable that does not plausibly change an uncompiled step's
    speed is listed, never the cause; a busy machine is named before any variable."""
    stored, inter = _rows()
    base = replace(run({}, name="base"), environment={"packages": {}, "env": {}})
    cur = replace(
        run({}, name="cur"),
        environment={"packages": {}, "env": {"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}},
    )
    r = code_or_environment(stored, inter, base, cur, Policy(environment_change="fail"))
    assert r.status == "undecided" and "ENVIRONMENT changed" not in r.reason
    assert "TORCHINDUCTOR_FORCE_DISABLE_CACHES" in r.reason and "not known to change" in r.reason
    busy = replace(
        run({}, name="cur", others=0.45),
        environment={"packages": {}, "env": {"OMP_NUM_THREADS": "1"}},
    )
    b = code_or_environment(stored, inter, base, busy, Policy(environment_change="fail"))
    assert b.status == "undecided" and b.reason.startswith("MACHINE changed: machine busy now")
    assert "also differs: env OMP_NUM_THREADS" in b.reason
    with pytest.raises(ValueError, match="environment_change must be 'fail' or 'warn'"):
        Policy(environment_change="ignore")


def test_environment_record_and_differences() -> None:
    from importlib.metadata import version

    # the distributions' versions: PyPI's CUDA wheel of torch 2.11 is "2.11.0" there, while
    # torch.__version__ says "2.11.0+cu130"; the CPU wheel says "+cpu" in both
    assert imported_packages(["pytest", "os", "torch.nn"]) == {
        "pytest": pytest.__version__,
        "torch": version("torch"),
    }
    assert perf_env(
        {"OMP_NUM_THREADS": "2", "HOME": "/root", "TORCH_LOGS": "x", "PERF_MEASURE_SCALE": "5"}
    ) == {"OMP_NUM_THREADS": "2", "TORCH_LOGS": "x"}
    fp2 = {**FP, "torch": "2.14.0"}
    assert differences(
        {"packages": {"a": "1", "only_old": "1"}, "env": {}},
        {"packages": {"a": "2"}, "env": {"MKL_NUM_THREADS": "1"}},
        FP,
        fp2,
    ) == [
        "machine torch '2.13.0' -> '2.14.0'",
        "package a 1 -> 2",
        "env MKL_NUM_THREADS unset -> '1'",
    ]
