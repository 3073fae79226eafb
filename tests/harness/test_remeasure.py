"""The command line of a re-measuring child: the user's options minus saving, gating,
reporting, xdist, cache-driven selection and test paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perf.gate.remeasure import absolute_nodeid, child_command, filter_args


@pytest.mark.parametrize(
    ("args", "kept"),
    [
        (["--benchmark-autosave", "-m", "timing"], []),
        (["--benchmark-save", "main", "-k", "x"], []),
        (["--benchmark-save=main", "-q"], []),
        (["--benchmark-compare", "-v"], []),
        (["--benchmark-compare", "0003", "-v"], []),
        (["--benchmark-compare=0003"], []),
        (["--benchmark-compare-fail", "min:5%", "mean:0.001", "-x"], []),
        (["--perf-report", "r.md", "--perf-strict", "--perf-remeasure=3"], []),
        (["--perf-against", "HEAD~1", "--perf-pairs=7"], []),
        (["-n", "2", "--dist", "loadgroup", "-nauto", "-d"], []),
        (["--lf", "--ff", "--sw", "--cache-clear", "--pdb"], []),
        (["--junitxml=out.xml", "--basetemp", "/tmp/x", "--tb=short", "-rA"], []),
        # short options grouped the argparse way
        (
            ["-vx", "-sv", "-n4", "-pno:randomly", "-Werror", "-q"],
            ["-s", "-pno:randomly", "-Werror"],
        ),
        (
            ["-W", "error", "-c", "ci.ini", "--rootdir=/r"],
            ["-W", "error", "-c", "ci.ini", "--rootdir=/r"],
        ),
        (
            ["-p", "no:randomly", "-o", "a=b", "--perf-devices", "cpu", "--benchmark-min-rounds=9"],
            ["-p", "no:randomly", "-o", "a=b", "--perf-devices", "cpu", "--benchmark-min-rounds=9"],
        ),
        (
            ["--benchmark-warmup", "--benchmark-max-time", "0.5"],
            ["--benchmark-warmup", "--benchmark-max-time", "0.5"],
        ),
        (["--benchmark-warmup", "on", "-v"], ["--benchmark-warmup", "on"]),
        # an unlisted member of a family perf knows is dropped, not passed on
        (["--benchmark-future-thing", "--perf-future=1"], []),
        # a conftest's or another plugin's options pass through, values and all
        (
            ["--device", "cuda", "--runslow", "--size=big", "-X"],
            ["--device", "cuda", "--runslow", "--size=big", "-X"],
        ),
    ],
)
def test_filter_args(args: list[str], kept: list[str]) -> None:
    assert filter_args(args) == kept


def test_every_option_perf_knows_of_is_classified(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tables cover every option of pytest, pytest-benchmark, xdist and perf as
    installed: a new option must be decided (kept or dropped), never silently passed on."""
    import re

    from perf.gate.remeasure import DROP, KEEP

    # those four families only: other plugins' options pass through by design, and a runner
    # may have any (a GPU image had anyio, pytest-cov, hypothesis, jaxtyping, pytest-timeout)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    families = ("xdist.plugin", "xdist.looponfail", "pytest_benchmark.plugin", "perf.plugin")
    result = pytester.runpytest_subprocess(*(a for p in families for a in ("-p", p)), "--help")
    opts = set()
    for line in result.stdout.lines:
        m = re.match(r"^  (-[^ ].*?)(?:  |$)", line)
        if not m:
            continue
        for part in m.group(1).split(", "):
            opt = re.split(r"[ =]", part.strip(), maxsplit=1)[0]
            if opt.startswith("-"):
                opts.add(opt)
    assert {"-k", "--benchmark-save", "--numprocesses", "--perf-against"} <= opts
    missing = sorted(o for o in opts if o not in KEEP and o not in DROP)
    assert missing == [], f"classify these options in perf.gate.remeasure KEEP or DROP: {missing}"
    assert not set(KEEP) & set(DROP)


def test_positionals_are_replaced_by_absolute_nodeids(tmp_path: Path) -> None:
    cmd = child_command(
        ["tests/benchmarks", "-m", "timing", "--benchmark-autosave"],
        ["tests/benchmarks"],
        ["tests/benchmarks/test_a.py::test_x[cpu-1024]"],
        tmp_path,
        tmp_path / "out.json",
        xdist_loaded=True,
        python="py",
    )
    assert cmd[:3] == ["py", "-m", "pytest"]
    assert "tests/benchmarks" not in cmd and "--benchmark-autosave" not in cmd
    assert cmd[-1] == f"{tmp_path}/tests/benchmarks/test_a.py::test_x[cpu-1024]"
    assert f"--perf-child-out={tmp_path / 'out.json'}" in cmd
    assert cmd[-3:-1] == ["-n", "0"]
    assert cmd[cmd.index("no:cacheprovider") - 1 :][:2] == ["-p", "no:cacheprovider"]


def test_absolute_nodeid_keeps_parametrisation(tmp_path: Path) -> None:
    assert absolute_nodeid("a/b.py::T::t[x::y]", tmp_path) == f"{tmp_path}/a/b.py::T::t[x::y]"


def test_a_child_takes_its_parents_fingerprint_only_while_torch_is_not_imported() -> None:
    """A child of the same interpreter has the parent's fingerprint; taking it saves a child
    that times torch-free code the ~1.5 s torch import. A child that imported torch, or a
    value that is not a whole fingerprint, computes its own."""
    import json

    from perf.core.devices import fingerprint
    from perf.gate.remeasure import FINGERPRINT_ENV, child_env, inherited_fingerprint

    fp = fingerprint()
    env = child_env({"PATH": "/bin", FINGERPRINT_ENV: "stale"}, 3, fp)
    assert env["OMP_NUM_THREADS"] == "3" and json.loads(env[FINGERPRINT_ENV]) == fp
    assert FINGERPRINT_ENV not in child_env({FINGERPRINT_ENV: "stale"}, None)  # never inherited
    assert inherited_fingerprint(env, modules={}) == fp
    assert inherited_fingerprint(env, modules={"torch": object()}) is None
    assert inherited_fingerprint({}, modules={}) is None
    for bad in ("{", "[1]", json.dumps({"torch": "2.13.0"})):
        assert inherited_fingerprint({FINGERPRINT_ENV: bad}, modules={}) is None


def test_a_child_timing_torch_free_code_never_imports_torch(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child command as the interleaved gate runs it (no reference workload: pairs cancel
    the machine's drift), with the environment it gets: its run carries the parent's
    fingerprint and torch stays unimported (such a child starts in well under a second
    instead of ~2.5 s)."""
    import subprocess
    import sys

    from perf.core.devices import fingerprint
    from perf.gate.remeasure import child_env

    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    pytester.makepyfile(
        test_t="""
        import time
        import perf

        def test_t(perf_metrics):
            perf_metrics.record("t_s", perf.measure(lambda: time.sleep(1e-4), samples=8))
        """,
        conftest="""
        import atexit, sys

        atexit.register(lambda: open("at_exit.txt", "w").write(str("torch" in sys.modules)))
        """,
    )
    out = pytester.path / "child.json"
    cmd = child_command([], [], ["test_t.py::test_t"], pytester.path, out, xdist_loaded=False)
    cmd[3:3] = ["--perf-no-reference"]  # as perf.plugin.children.Children.command adds it
    env = child_env(os.environ, None, fingerprint())
    p = subprocess.run(cmd, cwd=pytester.path, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (pytester.path / "at_exit.txt").read_text() == "False"
    from perf.store.runs import load

    assert load(out).fingerprint == fingerprint()
    assert sys.modules.get("torch") is not None  # this (parent) process computed it
