"""The JSON store: layout, numbering, atomic append-only writes, strict validation."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from _runs import FP, metric, run, timed

from perf.store.files import Store
from perf.store.runs import (
    BaselineNotFound,
    NotARun,
    Run,
    commit_info,
    default_tag,
    load,
    machine_name,
    name_problem,
    partial_reason,
    storage_root,
)
from perf.store.schema import MAX_FILE_BYTES, BaselineError, parse


def _one() -> Run:
    return run(
        {"t.py::test_a": [metric("syncs", 3, "syncs"), timed("step_s", 1e-3)]},
        name="abc_20260101_000000",
    )


def test_save_numbers_runs_per_machine_and_round_trips(tmp_path: Path) -> None:
    store = Store(tmp_path / "perf")
    p1 = store.save(_one())
    p2 = store.save(_one())
    assert p1.name == "0001_abc_20260101_000000.json"
    assert p2.name.startswith("0002_")
    assert p1.parent.name == "Linux-CPython-3.11-64bit"
    loaded = load(p2)
    assert loaded.number == 2
    assert loaded.fingerprint == FP
    assert loaded.tests["t.py::test_a"]["metrics"][0]["value"] == 3
    assert len(loaded.tests["t.py::test_a"]["metrics"][1]["samples"]) == 30
    assert [r.number for r in store.runs()] == [1, 2]
    assert not list(p1.parent.glob("*.part")), "temp files must not be left behind"


def test_history_is_never_rewritten(tmp_path: Path) -> None:
    store = Store(tmp_path)
    first = store.save(_one())
    before = first.read_bytes()
    for _ in range(3):
        store.save(_one())
    assert first.read_bytes() == before


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for _ in range(5):
                Store(tmp_path).save(_one())
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(r.number for r in store.runs()) == list(range(1, 21))
    for r in store.runs():
        load(r.path)  # every file complete and valid


def test_pytest_benchmark_loader_never_sees_our_files(tmp_path: Path) -> None:
    from pytest_benchmark.storage.file import FileStorage

    store = Store.from_storage(f"file://{tmp_path}")
    store.save(_one())
    machine = machine_name()

    class Log:
        def warning(self, *a: object, **k: object) -> None:
            raise AssertionError(f"pytest-benchmark tried to load our file: {a}")

        info = debug = warning

    fs = FileStorage(tmp_path, logger=Log(), default_machine_id=machine)
    assert fs.query() == []
    assert fs.query("*/*") == []
    assert list(fs.load()) == []
    assert fs._next_num == "0001"


def test_storage_root_follows_benchmark_storage() -> None:
    assert storage_root(None) == Path(".benchmarks/perf")
    assert storage_root("file://ci/store") == Path("ci/store/perf")
    assert storage_root("some/dir") == Path("some/dir/perf")
    assert storage_root("elasticsearch+https://host/index/doc") == Path(".benchmarks/perf")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "file is empty"),
        (b'{"format": "perf-baseline", "schema_version": 1, "run": {', "truncated JSON"),
        (b"not json at all", "not valid JSON"),
        (b"[1, 2]", "top level must be a JSON object"),
        (b'{"machine_info": {}, "benchmarks": []}', "pytest-benchmark file"),
        (b'{"format": "perf-baseline", "schema_version": 99}', "unknown schema_version 99"),
        (b'{"format": "perf-baseline"}', "schema_version"),
        (b'{"format": "perf-baseline", "schema_version": 1, "tests": {}}', "'run'"),
        (b'{"format": "perf-baseline", "schema_version": 1, "value": NaN}', "NaN"),
    ],
)
def test_bad_files_raise_naming_file_and_problem_and_stay_untouched(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    p = tmp_path / "0001_x.json"
    p.write_bytes(content)
    with pytest.raises(BaselineError) as ei:
        load(p)
    assert str(p) in str(ei.value)
    assert problem in str(ei.value)
    assert p.read_bytes() == content


def _valid_json() -> dict:
    return json.loads(json.dumps(_one().to_json()))


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d["run"].pop("fingerprint"), "missing field 'fingerprint'"),
        (lambda d: d["tests"]["t.py::test_a"]["metrics"][0].pop("unit"), "missing field 'unit'"),
        (lambda d: d["tests"]["t.py::test_a"]["metrics"][0].update(unit="parsecs"), "unknown unit"),
        (
            lambda d: d["tests"]["t.py::test_a"]["metrics"][0].update(kind="time"),
            "does not match unit",
        ),
        (
            lambda d: d["tests"]["t.py::test_a"]["metrics"][1].update(samples=["x"]),
            "samples must be",
        ),
        (lambda d: d["tests"]["t.py::test_a"].update(outcome="great"), "outcome must be"),
        (lambda d: d["run"].pop("cpu"), "missing field 'cpu'"),
        (lambda d: d["run"].update(cpu={"others_fraction": "lots"}), "run.cpu must be"),
    ],
)
def test_missing_or_wrong_fields_are_named(tmp_path: Path, mutate, problem: str) -> None:
    d = _valid_json()
    mutate(d)
    p = tmp_path / "0001_x.json"
    p.write_text(json.dumps(d))
    with pytest.raises(BaselineError, match=problem):
        load(p)


def test_resolve_specs(tmp_path: Path) -> None:
    store = Store(tmp_path)
    m = "Linux-CPython-3.11-64bit"
    store.save(run({}, name="first"))
    other_fp = dict(FP, cpu_model="Other CPU")
    store.save(run({}, name="second", fp=other_fp))
    assert store.resolve(True, machine=m).number == 2
    # default prefers the latest run with a matching fingerprint
    assert store.resolve(True, machine=m, fingerprint=FP, timing_keys=("cpu_model",)).number == 1
    assert store.resolve("1", machine=m).number == 1
    assert store.resolve("0002", machine=m).name == "second"
    assert store.resolve("first", machine=m).number == 1
    assert store.resolve(f"{m}/2", machine="elsewhere").number == 2
    path = store.runs()[0].path
    assert store.resolve(str(path), machine="x").path == path
    with pytest.raises(BaselineNotFound, match="no stored perf run matches '7'"):
        store.resolve("7", machine=m)
    with pytest.raises(BaselineNotFound, match="no stored perf run for machine"):
        Store(tmp_path / "empty").resolve(True, machine=m)


def test_bad_run_name_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must not contain"):
        Store(tmp_path).save(run({}, name="a/b"))


def test_commit_info_tolerates_no_git(tmp_path: Path) -> None:
    info = commit_info(tmp_path)
    assert set(info) == {"id", "branch", "dirty"}
    assert default_tag({"id": None, "dirty": None}).startswith("unversioned_")


def test_schema_version_1_files_are_still_read(tmp_path: Path) -> None:
    """v1 had no run.cpu: such files load, with the CPU share unknown (see the history)."""
    d = _valid_json()
    d["schema_version"] = 1
    del d["run"]["cpu"]
    p = tmp_path / "0001_old.json"
    p.write_text(json.dumps(d))
    r = load(p)
    assert r.schema_version == 1 and r.cpu is None
    assert r.tests == d["tests"]


def test_cpu_share_round_trips(tmp_path: Path) -> None:
    p = Store(tmp_path).save(_one())
    assert load(p).cpu == {"wall_s": 10.0, "others_fraction": 0.01, "steal_fraction": 0.0}


# -- hostile and damaged files (issue 8, item 7) ---------------------------------------------


def _valid_text() -> str:
    return json.dumps(_valid_json())


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        # a second "value" for one metric: json.loads would keep the last, hiding the first
        (lambda t: t.replace('"value": 3,', '"value": 3, "value": 2,', 1), "duplicate key 'value'"),
        (
            lambda t: t.replace('"workers": 0', '"workers": 0, "workers": 0', 1),
            "duplicate key 'workers'",
        ),
        (
            lambda t: t[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "nested 100001 levels deep",
        ),
        (
            lambda t: t.replace('"value": 3,', '"value": ' + "9" * 400 + ",", 1),
            "integer with 400 characters",
        ),
        (lambda t: t.replace('"value": 3,', '"value": 1e400,', 1), "too long or not finite"),
        (
            lambda t: t.replace('"branch": "main"', '"branch": ["main"]', 1),
            "run.commit.branch must be str or null, got list",
        ),
        (
            lambda t: t.replace('"gpus": []', '"gpus": "A100"', 1),
            "run.fingerprint.gpus must be list or null, got str",
        ),
        (
            lambda t: t.replace('"gpus": []', '"gpus": [{"name": 3}]', 1),
            r"run.fingerprint.gpus\[0\].name must be str",
        ),
        (lambda t: t.replace('"gpus": []', '"gpus": ["A100"]', 1), r"gpus\[0\] must be an object"),
        (lambda t: t.replace('"value": 3,', '"value": 3.0,', 1), "a count must be an integer"),
        (lambda t: t.replace('"partial": null', '"partial": 1', 1), "run.partial must be"),
    ],
)
def test_hostile_files_raise_and_stay_untouched(tmp_path: Path, make, problem: str) -> None:
    text = make(_valid_text())
    assert text != _valid_text(), "the mutation must apply"
    p = tmp_path / "0001_x.json"
    p.write_text(text)
    before = p.read_bytes()
    with pytest.raises(BaselineError, match=problem) as ei:
        load(p)
    assert str(p) in str(ei.value)
    assert p.read_bytes() == before


def test_counts_above_2_53_stay_exact_ints(tmp_path: Path) -> None:
    big = 2**53 + 1  # float(big) == 2**53: a float store would lose the +1
    p = Store(tmp_path).save(run({"t.py::test_a": [metric("flops", big, "flops")]}))
    assert f'"value": {big}' in p.read_text()
    (m,) = load(p).tests["t.py::test_a"]["metrics"]
    assert m["value"] == big and type(m["value"]) is int


def test_schema_version_2_counts_as_whole_floats_are_still_read(tmp_path: Path) -> None:
    d = _valid_json()
    d["schema_version"] = 2
    del d["run"]["partial"], d["run"]["reference_threads"]
    d["tests"]["t.py::test_a"]["metrics"][0]["value"] = 3.0
    p = tmp_path / "0001_v2.json"
    p.write_text(json.dumps(d))
    r = load(p)
    assert r.schema_version == 2 and r.partial is None and r.reference_threads is None


def test_killed_saves_temp_files_are_removed_by_the_next_save(tmp_path: Path) -> None:
    store = Store(tmp_path)
    folder = store.save(_one()).parent
    stale = [folder / ".tmp-abc123.part", folder / ".tmp-old.part"]
    for s in stale:
        s.write_text('{"format": "perf-bas')  # what kill -9 mid-write leaves
    other = folder / "notes.part"  # not ours: left alone
    other.write_text("x")
    store.save(_one())
    assert not any(s.exists() for s in stale)
    assert other.exists()
    assert [r.number for r in store.runs()] == [1, 2]


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_run_files_respect_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    import os
    import stat

    old = os.umask(umask)
    try:
        p = Store(tmp_path).save(_one())
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == mode


def test_partial_runs_are_never_the_default_baseline(tmp_path: Path) -> None:
    store = Store(tmp_path)
    m = "Linux-CPython-3.11-64bit"
    store.save(run({}, name="full"))
    store.save(run({}, name="stopped", partial="stopped early (-x); 6 of 10 tests did not run"))
    assert store.resolve(True, machine=m).name == "full"
    assert store.resolve(True, machine=m, fingerprint=FP, timing_keys=("cpu_model",)).name == "full"
    assert store.resolve("2", machine=m).name == "stopped"  # explicitly: allowed
    assert load(store.runs()[1].path).partial.startswith("stopped early")
    only_partial = Store(tmp_path / "p")
    only_partial.save(run({}, name="x", partial="1 tests failed"))
    with pytest.raises(BaselineNotFound, match=r"all 1 are partial.*--benchmark-compare=NUM"):
        only_partial.resolve(True, machine=m)


def test_test_paths_are_not_compare_targets(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_bench.py").write_text("def test_a():\n    pass\n")
    store = Store(tmp_path / ".benchmarks" / "perf")
    store.save(run({}, name="main"))
    m = "Linux-CPython-3.11-64bit"
    for spec in (
        "tests/",
        "tests",
        "tests/test_bench.py",
        "tests/test_bench.py::test_a",
        "test_other.py",
    ):
        with pytest.raises(NotARun, match="swallowed the path") as ei:
            store.resolve(spec, machine=m)
        assert "--benchmark-compare=NUM" in str(ei.value)
        assert f"pytest {spec} --benchmark-compare" in str(ei.value)
        assert "JSON" not in str(ei.value)  # never calls the user's test file a bad baseline
    assert store.resolve("main", machine=m).name == "main"


@pytest.mark.parametrize("name", ["a/b", "a\\b", "x:y", " lead", "tab\there", "esc\x1b[31m", ""])
def test_bad_run_names(name: str) -> None:
    assert name_problem(name) is not None
    assert name_problem("main_2026-01-01") is None


def test_partial_reason() -> None:
    assert (
        partial_reason(stopped=None, selected=3, outcomes=["passed", "skipped", "xfailed"]) is None
    )
    assert partial_reason(
        stopped="stopping after 1 failures", selected=10, outcomes=["passed"] * 3 + ["failed"]
    ) == (
        "stopped early (stopping after 1 failures); 6 of 10 selected tests did not run; "
        "1 tests failed"
    )
    assert (
        partial_reason(stopped=None, selected=1, outcomes=["error"], collect_errors=2)
        == "1 tests failed; 2 collection errors"
    )


# -- reading costs are bounded by the file's size (issue 17, case 3) -------------------------


def test_a_file_over_the_size_cap_is_refused_before_reading(tmp_path: Path) -> None:
    p = tmp_path / "0001_huge.json"
    with open(p, "wb") as fh:  # sparse: 200 MB on paper, nothing on disk
        fh.truncate(200 * 2**20)
    with pytest.raises(
        BaselineError,
        match=rf"{200 * 2**20} bytes, more than a run file "
        rf"may have \({MAX_FILE_BYTES} bytes",
    ):
        load(p)
    with pytest.raises(BaselineError, match="more than a run file may have"):
        parse("x" * (MAX_FILE_BYTES + 1))


def test_reading_a_long_string_costs_memory_linear_in_its_length(tmp_path: Path) -> None:
    """The depth check's regex kept ~125 bytes of backtracking state per character of a
    string (8 MB -> 1 GB); now reading a file costs a small multiple of its size."""
    import subprocess
    import sys
    import textwrap

    data = _one().to_json()
    data["run"]["name"] = "x" * (8 * 2**20)  # refused by validation only after parsing
    p = tmp_path / "0001_long.json"
    p.write_text(json.dumps(data))
    code = textwrap.dedent(
        f"""
        import resource
        from perf.store.runs import load
        from perf.store.schema import BaselineError
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        from perf.store.schema import _max_depth
        _max_depth(open({str(p)!r}).read())
        try:
            load({str(p)!r})
        except BaselineError:
            pass
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    grown = int(out.stdout)
    assert grown < 12 * p.stat().st_size, f"{grown / 2**20:.0f} MiB for an 8 MiB string"
