"""The command line of a re-measuring child: the user's options minus saving, gating,
reporting, xdist, cache-driven selection and test paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from perf.remeasure import absolute_nodeid, child_command, filter_args


@pytest.mark.parametrize(
    ("args", "kept"),
    [
        (["--benchmark-autosave", "-m", "timing"], ["-m", "timing"]),
        (["--benchmark-save", "main", "-k", "x"], ["-k", "x"]),
        (["--benchmark-save=main", "-q"], ["-q"]),
        (["--benchmark-compare", "-v"], ["-v"]),
        (["--benchmark-compare", "0003", "-v"], ["-v"]),
        (["--benchmark-compare=0003"], []),
        (["--benchmark-compare-fail", "min:5%", "mean:0.001", "-x"], ["-x"]),
        (["--perf-report", "r.md", "--perf-strict", "--perf-remeasure=3"], []),
        (["-n", "2", "--dist", "loadgroup", "-nauto"], []),
        (["--lf", "--ff", "--sw", "--cache-clear", "--pdb"], []),
        (["--junitxml=out.xml", "--basetemp", "/tmp/x"], []),
        (
            ["-p", "no:randomly", "-o", "a=b", "--perf-devices", "cpu", "--benchmark-min-rounds=9"],
            ["-p", "no:randomly", "-o", "a=b", "--perf-devices", "cpu", "--benchmark-min-rounds=9"],
        ),
    ],
)
def test_filter_args(args: list[str], kept: list[str]) -> None:
    assert filter_args(args) == kept


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
