"""Nothing perf runs on its own (the gate's reference workload, its children) may make the
simulated device unusable: autograd fixes its devices at a process's first backward, so a
test that installs ``perf.simulated_device()`` itself must still run backward on it under
``--benchmark-autosave``, ``--benchmark-compare`` and ``--perf-against`` (issue 19)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SIM_TEST = """
import torch
import perf

def test_backward_on_sim(perf_metrics):
    dev = perf.simulated_device()  # installed by the test, after perf's own work
    w = torch.ones(4, device=dev, requires_grad=True)
    (w * 2).sum().backward()
    assert w.grad is not None and w.grad.device.type == dev.type
    # a fixed timing: the subject is sim under each gate, not timing; identical samples on
    # both sides make the interleaved A/A settle in one pair (ratio exactly 1)
    perf_metrics.record("t_s", perf.Timing((0.001,) * 6, number=1, device="cpu"))
    perf_metrics.record("calls", 3, unit="calls")
"""


def test_reference_workload_starts_no_autograd_engine() -> None:
    code = textwrap.dedent(
        """
        from perf.gate.reference import reference_samples
        import perf
        assert len(reference_samples(0.01)) >= 3
        dev = perf.simulated_device()
        import torch
        x = torch.ones(2, device=dev, requires_grad=True)
        (x * 3).sum().backward()
        print(x.grad.device)
        """
    )
    # the simulated device needs a process without CUDA: a CPU-only child, as test_sim_parity's
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "sim:0"


def test_a_test_that_installs_sim_itself_passes_under_every_gate(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("GITHUB_STEP_SUMMARY", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # sim needs a CPU-only child
    pytester.makepyfile(test_sim=SIM_TEST)
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "one"]):
        subprocess.run(["git", *cmd], cwd=pytester.path, check=True, env=env, capture_output=True)
    opts = ("-p", "no:cacheprovider", "-p", "no:xdist", "-o", "perf_busy_cpu_fraction=1")
    for gate in ("--benchmark-autosave", "--benchmark-compare", "--perf-against=HEAD"):
        r = pytester.runpytest_subprocess(*opts, gate)
        assert r.ret == 0, f"{gate}:\n{r.stdout.str()}\n{r.stderr.str()}"
        r.assert_outcomes(passed=1)
        assert "installed after this process's first backward" not in r.stdout.str(), gate
    assert "perf gate against HEAD" in r.stdout.str()  # the --perf-against run gated
