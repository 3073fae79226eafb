"""What a new user tripped on, fixed in the plugin: snapshots of the gate's children in the
pytest cache (never the project root), no pytest-benchmark "Can't compare" noise when perf's
own store answers, and nothing heavy imported at pytest start."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_PRINT_DIRS = """
    import os
    from perf.plugin.children import Children
    from perf.plugin.options import MEMVIZ_DIR_ENV, memviz_dir

    def pytest_sessionfinish(session):
        print("MEMVIZ", memviz_dir(session.config))
        print("CHILD", Children(session.config).env()[MEMVIZ_DIR_ENV])
"""


def test_snapshots_go_to_the_pytest_cache_not_the_project_root(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(_PRINT_DIRS)
    pytester.makepyfile(test_p="def test_p():\n    pass\n")
    root = pytester.path
    for args in ((), ("-p", "no:cacheprovider")):  # a gate's child runs without the cache
        r = pytester.runpytest_inprocess("-s", *args)
        r.assert_outcomes(passed=1)
        out = r.stdout.str()
        cache = root / ".pytest_cache" / "d" / "perf-memviz"
        assert f"MEMVIZ {cache}" in out, out
        assert f"CHILD {cache.resolve()}" in out, out
    assert not (root / ".perf-memviz").exists()


def test_a_child_writes_its_snapshots_to_its_parents_folder(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from perf.plugin.options import MEMVIZ_DIR_ENV

    pytester.makeconftest(_PRINT_DIRS)
    pytester.makepyfile(test_p="def test_p():\n    pass\n")
    monkeypatch.setenv(MEMVIZ_DIR_ENV, str(tmp_path / "parent"))
    r = pytester.runpytest_inprocess("-s", "-p", "no:cacheprovider")
    r.stdout.fnmatch_lines([f"*MEMVIZ {tmp_path / 'parent'}"])
    trace_dir = tmp_path / "traces"
    r = pytester.runpytest_inprocess(
        "-s", "-p", "no:cacheprovider", f"--perf-trace-dir={trace_dir}"
    )
    r.stdout.fnmatch_lines([f"*MEMVIZ {trace_dir}"])  # --perf-trace-dir still wins


def test_no_save_or_compare_noise_when_perfs_store_answers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_m="def test_m(perf_metrics):\n    perf_metrics.record('n', 3, 'count')\n"
    )
    args = ("-p", "no:cacheprovider", "--perf-no-reference")
    first = pytester.runpytest_subprocess(*args, "--benchmark-compare")
    # nothing stored anywhere yet: pytest-benchmark's own warning stays
    assert "Can't compare. No benchmark files" in first.stdout.str() + first.stderr.str()
    # a save with no metric to save: pytest-benchmark's "Not saving anything" stays true
    none = pytester.runpytest_subprocess(*args, "--benchmark-autosave", "-k", "no_such_test")
    assert "Not saving anything" in none.stdout.str() + none.stderr.str()
    saved = pytester.runpytest_subprocess(*args, "--benchmark-autosave")
    saved.assert_outcomes(passed=1)
    text = saved.stdout.str() + saved.stderr.str()
    assert "perf: saved metrics of 1 tests" in text, text
    assert "Not saving anything" not in text, text  # perf saved: the warning would be false
    r = pytester.runpytest_subprocess(*args, "--benchmark-compare")
    r.assert_outcomes(passed=1)
    text = r.stdout.str() + r.stderr.str()
    assert "perf gate passed" in text, text
    assert "Can't compare" not in text, text


def test_collect_only_times_no_reference_and_imports_no_numpy(pytester: pytest.Pytester) -> None:
    """``pytest --co`` of a perf suite with a gate option: nothing is run, so neither the
    reference workload is timed nor numpy / torch imported."""
    pytester.makeconftest(
        """
        import sys

        def pytest_unconfigure(config):
            heavy = sorted({"numpy", "torch", "perf.gate.reference"} & set(sys.modules))
            print("HEAVY", heavy)
        """
    )
    pytester.makepyfile(
        test_m="def test_m(perf_metrics):\n    perf_metrics.record('n', 3, 'count')\n"
    )
    for option in ("--benchmark-autosave", "--benchmark-compare"):
        args = ["-s", "--co", "-p", "no:cacheprovider", option]
        # what the environment's other plugins import anyway (a GPU image's imported numpy)
        r = pytester.runpytest_subprocess(*args, "-p", "no:perf")
        without = next(ln for ln in r.stdout.lines if ln.startswith("HEAVY "))
        r = pytester.runpytest_subprocess(*args)
        r.stdout.fnmatch_lines([without])


def test_pytest_start_imports_no_numpy(tmp_path: Path) -> None:
    """``python -X importtime -m pytest --co`` on a tiny project: perf loads, numpy does not."""
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    code = textwrap.dedent(
        """
        import sys, pytest
        pytest.main(["--co", "-q", "-p", "no:cacheprovider", *sys.argv[1:]])
        print("LOADED", "perf.plugin.session" in sys.modules, "numpy" in sys.modules)
        """
    )

    def run(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    # numpy only if the environment's other plugins import it anyway (a GPU image's did)
    numpy_anyway = "LOADED False True" in run("-p", "no:perf")
    out = run()
    assert f"LOADED True {numpy_anyway}" in out, out
