"""Shards of one run merged into one (perf.store.merge, ``python -m perf merge``,
``--benchmark-compare=DIR``): refusals name the shards, a missing or failed shard leaves the
merged run partial, and a suite split into 3 shards gates exactly like the unsharded run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _runs import COMMIT, FP, metric, run
from pytest_benchmark.utils import get_machine_id

# Imported here, in the outer process: pytester's in-process runs drop modules they imported.
import perf.sim.device  # noqa: F401
from perf.__main__ import main
from perf.store.files import Store
from perf.store.merge import MergeError, is_shard_dir, load_merged, merge_runs, shard_files
from perf.store.runs import BaselineNotFound, load, make_run
from perf.store.schema import BaselineError

M = "Linux-CPython-3.11-64bit"


def _shard(tests: dict[str, int], name: str, **kw: object) -> object:
    return run({t: [metric("syncs", v, "syncs")] for t, v in tests.items()}, name=name, **kw)


def _save(root: Path, *runs: object) -> list[Path]:
    return [Store.from_storage(str(root)).save(r) for r in runs]  # type: ignore[arg-type]


def test_three_shards_become_one_complete_run() -> None:
    a = _shard({"t.py::a": 1}, "s1")
    b = _shard({"t.py::b": 2}, "s2", workers=2)
    c = _shard({"t.py::c": 3}, "s3", others=0.4)
    m = merge_runs([a, b, c], name="merged", expected=3)  # type: ignore[list-item]
    assert sorted(m.tests) == ["t.py::a", "t.py::b", "t.py::c"]
    assert m.partial is None and m.name == "merged" and m.commit == COMMIT
    assert m.workers == 2  # a parallel shard keeps the merged timings out of the timing gate
    assert m.cpu is not None and m.cpu["others_fraction"] == 0.4  # the busiest shard's
    assert len(m.reference["start"]) == 45  # pooled over the shards
    assert m.date == max(r.date for r in (a, b, c))  # type: ignore[attr-defined]


def test_a_test_in_two_shards_is_refused_naming_both(tmp_path: Path) -> None:
    p1, p2 = _save(tmp_path, _shard({"t.py::a": 1}, "s1"), _shard({"t.py::a": 1}, "s2"))
    with pytest.raises(MergeError, match=r"'t.py::a' is in two shards") as e:
        merge_runs([load(p1), load(p2)])
    assert str(p1) in str(e.value) and str(p2) in str(e.value)


def test_runs_of_different_commits_are_refused() -> None:
    a = _shard({"t.py::a": 1}, "s1")
    b = make_run(
        {"t.py::b": {"outcome": "passed", "metrics": [metric("syncs", 1, "syncs")]}},
        name="other",
        machine=M,
        fingerprint=FP,
        commit={**COMMIT, "id": "def456"},
    )
    with pytest.raises(MergeError, match=r"runs of different commits.*'abc123': s1.*'def456'"):
        merge_runs([a, b])  # type: ignore[list-item]


def test_incompatible_fingerprints_are_refused_naming_the_field() -> None:
    a = _shard({"t.py::a": 1}, "s1")
    b = _shard({"t.py::b": 1}, "s2", fp={**FP, "torch": "2.12.0"})
    with pytest.raises(MergeError, match=r"incompatible machine fingerprints: s1 and s2.*torch"):
        merge_runs([a, b])  # type: ignore[list-item]


def test_a_failed_or_missing_shard_leaves_the_run_partial(tmp_path: Path) -> None:
    a = _shard({"t.py::a": 1}, "s1")
    b = _shard({"t.py::b": 1}, "s2", partial="1 tests failed", outcome="failed")
    m = merge_runs([a, b], expected=3)  # type: ignore[list-item]
    assert m.partial == "shard s2: 1 tests failed; 1 of 3 shards missing"
    # ... and a partial run never becomes the default baseline
    store = Store(tmp_path)
    store.save(m)
    with pytest.raises(BaselineNotFound, match="all 1 are partial"):
        store.latest_complete(M)
    with pytest.raises(MergeError, match="3 shards given, more than the 2 expected"):
        merge_runs([a, a, b], expected=2)  # type: ignore[list-item]


def test_shard_folders_skip_pytest_benchmark_files_and_name_bad_ones(tmp_path: Path) -> None:
    _save(tmp_path / "1", _shard({"t.py::a": 1}, "s1"))
    (tmp_path / "1" / "0001_bench.json").write_text(
        json.dumps({"machine_info": {}, "benchmarks": []})
    )
    assert [p.name for p in shard_files(tmp_path)] == ["0001_s1.json"]
    assert is_shard_dir(tmp_path)
    (tmp_path / "junk.json").write_text('{"format": "other"}')
    with pytest.raises(BaselineError, match=r"junk.json.*not a perf baseline"):
        load_merged(tmp_path)
    (tmp_path / "conftest.py").write_text("")
    assert not is_shard_dir(tmp_path)  # a test folder, never a folder of shards


def test_cli_merges_files_and_store_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p1, _ = _save(tmp_path, _shard({"t.py::a": 1}, "s1"), _shard({"t.py::b": 2}, "s2"))
    out = tmp_path / "merged.json"
    argv = ["--storage", str(tmp_path), "--machine", M, "merge"]
    assert main([*argv, str(p1), "2", "-o", str(out), "--expect", "2"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert sorted(load(out).tests) == ["t.py::a", "t.py::b"] and load(out).partial is None
    assert main([*argv, str(p1), "2", "-o", str(out)]) == 2
    assert "exists; a stored run is never overwritten" in capsys.readouterr().err
    assert main([*argv, str(p1), str(p1), "--save"]) == 2
    assert "0001_s1.json is given twice" in capsys.readouterr().err
    assert main([*argv, str(p1), str(tmp_path), "-o", str(tmp_path / "again.json")]) == 2
    assert "0001_s1.json is given twice" in capsys.readouterr().err
    assert main([*argv, str(p1)]) == 2
    assert "merge needs -o OUT.json or --save" in capsys.readouterr().err


# -- end to end: 3 shards by -k, merged, gated like the unsharded run ----------------------

SUITE = """
import os

def test_model(perf_metrics):
    perf_metrics.record("syncs", 10 + int(os.environ.get("EXTRA_SYNCS", "0")), unit="syncs")
    perf_metrics.record("activation_bytes", 4096, unit="bytes")

def test_data(perf_metrics):
    perf_metrics.record("launches", 7, unit="launches")

def test_comm(perf_metrics):
    perf_metrics.record("calls", 3, unit="calls")
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


def _pytest(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", "--perf-no-reference", *args)


def _gate_lines(r: pytest.RunResult) -> list[str]:
    """The gate's verdict lines, without the line that names the baseline."""
    out = r.stdout.str()
    section = out[out.index("perf gate") : out.index("perf metrics")]
    return [ln for ln in section.splitlines()[1:] if not ln.startswith("compared with")]


@pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")
def test_three_k_shards_merged_gate_like_the_unsharded_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    _pytest(pytester, "--benchmark-save=whole").assert_outcomes(passed=3)
    for i, k in enumerate(("model", "data", "comm"), 1):
        _pytest(
            pytester, "-k", k, f"--benchmark-storage=shards/{i}", "--benchmark-autosave"
        ).assert_outcomes(passed=1)
    assert main(["merge", "shards", "--expect", "3", "-o", "merged.json"]) == 0
    whole = next((pytester.path / ".benchmarks").rglob("0001_whole.json"))
    assert load("merged.json").tests == load(whole).tests
    assert load("merged.json").partial is None
    for extra in ("0", "1"):  # unchanged, then one more sync in test_model
        monkeypatch.setenv("EXTRA_SYNCS", extra)
        results = [
            _pytest(pytester, f"--benchmark-compare={target}")
            for target in (whole, "merged.json", "shards")
        ]
        codes = {r.ret for r in results}
        assert codes == {0 if extra == "0" else 1}
        lines = [_gate_lines(r) for r in results]
        assert lines[0] == lines[1] == lines[2], lines
    assert any("test_model syncs" in ln for ln in lines[0])
    # a shard that never arrived: the merge says so, and the run is not a default baseline
    assert main(["merge", "shards/1", "shards/2", "--expect", "3", "--save"]) == 0
    # the inner runs' machine folder: this interpreter's (a GPU image ran Python 3.12)
    here = get_machine_id()
    saved = sorted((pytester.path / ".benchmarks" / "perf" / here).glob("0002_*.json"))
    assert load(saved[0]).partial == "1 of 3 shards missing"
    r = _pytest(pytester, "--benchmark-compare")  # the newest run is the partial one: skipped
    assert f"compared with {here}/0001_whole" in r.stdout.str()


def test_a_folder_of_only_pytest_benchmark_files_is_a_clear_baseline_error(
    tmp_path: Path,
) -> None:
    (tmp_path / "0001_bench.json").write_text(json.dumps({"machine_info": {}, "benchmarks": []}))
    with pytest.raises(BaselineError, match=r"cannot merge its shards: .*no perf run files"):
        load_merged(tmp_path)
