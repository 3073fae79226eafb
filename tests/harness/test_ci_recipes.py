"""The CI recipes of docs/ci.md, run exactly as written.

The hosted-runner recipe promises that one PR job gates counts, bytes and times against the
base commit's code. It is run here on a small git project whose PR commit adds ops and
activation bytes to its step: the job must fail and name both metrics. The install step runs
with a stand-in ``pip`` (this box has no network) that records what it was asked to install.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CI_MD = ROOT / "docs" / "ci.md"

_RECIPE = re.compile(r"<!-- recipe: hosted-pr -->\n```yaml\n(.*?)\n```", re.S)


def _recipe() -> dict[str, Any]:
    m = _RECIPE.search(CI_MD.read_text(encoding="utf-8"))
    assert m, "docs/ci.md lost its hosted-runner recipe (<!-- recipe: hosted-pr -->)"
    return yaml.safe_load(m.group(1))


def _step(name: str) -> dict[str, Any]:
    steps = _recipe()["jobs"]["perf"]["steps"]
    return next(s for s in steps if s.get("name") == name)


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A step's ``run:`` the way GitHub runs ``shell: bash``."""
    path = cwd.parent / "step.sh"
    path.write_text(script, encoding="utf-8")
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GITHUB_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


_TESTS = """\
import time

import pytest
import torch

import perf
import work


def test_ops(perf_metrics):
    with perf.count_ops() as o:
        work.step(torch.ones(8))
    perf_metrics.record("ops", o.count, "ops")


def test_bytes(perf_metrics):
    x = torch.ones(64, 64, requires_grad=True)
    with perf.saved_activations() as a:
        work.step(x).sum()
    perf_metrics.record("activation_bytes", a.bytes, "bytes")


@pytest.mark.perf_timing
def test_time(perf_metrics):
    t = perf.measure(lambda: time.sleep(0.002), number=1, samples=8, warmup=1)
    perf_metrics.record("step_s", t)
"""


def _project(tmp_path: Path) -> tuple[Path, str]:
    """A git project of two commits: base, and a PR whose step adds two ops per call."""
    proj = tmp_path / "proj"
    (proj / "work").mkdir(parents=True)
    (proj / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["."]\n')
    (proj / "test_step.py").write_text(_TESTS)
    git_env = {
        **os.environ,
        **{
            f"GIT_{w}_{k}": v
            for w in ("AUTHOR", "COMMITTER")
            for k, v in (("NAME", "t"), ("EMAIL", "t@t"))
        },
    }

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(proj), *args],
            check=True,
            text=True,
            capture_output=True,
            env=git_env,
        ).stdout.strip()

    git("init", "-q")
    for extra in (0, 1):
        (proj / "work" / "__init__.py").write_text(
            "def step(x):\n"
            "    y = x * 2\n"
            f"    for _ in range({extra}):\n"
            "        y = (y * 3).sin()\n"
            "    return y.exp()\n"
        )
        git("add", "-A")
        git("commit", "-qm", f"extra {extra}")
    return proj, git("rev-parse", "HEAD~1")


def test_hosted_recipe_install_step_runs_as_written(tmp_path: Path) -> None:
    step = _step("Install")
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "pip.log"
    (fake / "pip").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (fake / "pip").chmod(0o755)
    proj = tmp_path / "proj"
    proj.mkdir()
    env = _env()
    env["PATH"] = os.pathsep.join([str(fake), env["PATH"]])
    r = _bash(step["run"], proj, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert log.read_text().splitlines() == [
        "install torch==2.13.0",
        "install pytest-torch-perf -e .",
    ]


def test_hosted_recipe_gates_counts_and_bytes_against_the_base(tmp_path: Path) -> None:
    """The PR step exactly as written: a PR that adds ops and activation bytes fails (exit 1)
    with both metrics named; the timing test is compared too (5 pairs, the fewest that
    decide, through PYTEST_ADDOPTS as a runner's environment would give them)."""
    recipe = _recipe()
    checkout = next(s for s in recipe["jobs"]["perf"]["steps"] if "checkout" in s.get("uses", ""))
    assert checkout["with"]["fetch-depth"] == 0
    step = _step("perf tests, gated against the PR's base commit")
    assert step["if"] == "github.event_name == 'pull_request'"
    assert "perf_timing" not in step["run"], "a -m perf_timing selection leaves counts ungated"
    proj, base = _project(tmp_path)
    env = _env(
        BASE_SHA=base,
        PYTEST_ADDOPTS="-o perf_busy_cpu_fraction=1 --perf-no-reference --perf-pairs=5",
    )
    r = _bash(step["run"], proj, env)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    regressions = out.split("REGRESSIONS", 1)[-1]
    ops = re.search(r"test_step.py::test_ops\s+ops\s+(\d+) ops\s+(\d+) ops", regressions)
    assert ops and int(ops.group(2)) == int(ops.group(1)) + 2, out
    assert re.search(r"test_step.py::test_bytes\s+activation_bytes", regressions), out
    assert "perf gate FAILED" in out, out  # the sleep may be judged too, under load


def test_hosted_recipe_gates_counts_without_a_timed_test(tmp_path: Path) -> None:
    step = _step("perf tests, gated against the PR's base commit")
    proj, base = _project(tmp_path)
    test_file = proj / "test_step.py"
    test_file.write_text(_TESTS.split("@pytest.mark.perf_timing")[0])
    env = _env(BASE_SHA=base, PYTEST_ADDOPTS="-o perf_busy_cpu_fraction=1 --perf-no-reference")
    r = _bash(step["run"], proj, env)
    assert r.returncode == 1, r.stdout + r.stderr


def test_against_under_xdist_is_refused_not_called_unchanged(tmp_path: Path) -> None:
    """Under ``-n`` the controller imports no test module, so no project package would be
    mapped to the base tree and the base side would run the PR's code. The gate refuses at
    start-up and says what to do, rather than call a regression 'unchanged'."""
    proj, base = _project(tmp_path)
    test_file = proj / "test_step.py"
    test_file.write_text(_TESTS.split("@pytest.mark.perf_timing")[0])
    cmd = [sys.executable, "-m", "pytest", "-n", "2", f"--perf-against={base}", "-q"]
    env = _env(PYTEST_ADDOPTS="-o perf_busy_cpu_fraction=1 --perf-no-reference")
    r = subprocess.run(cmd, cwd=proj, env=env, capture_output=True, text=True, timeout=540)
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    assert "cannot run under pytest-xdist" in out and "pytest -p no:xdist" in out, out
    assert "unchanged" not in out and "passed" not in out, out  # refused before any test
