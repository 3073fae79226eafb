"""The JSON store: layout, numbering, atomic append-only writes, strict validation."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from _runs import FP, metric, run, timed

from perf import baseline as b


def _one() -> b.Run:
    return run({"t.py::test_a": [metric("syncs", 3, "syncs"), timed("step_s", 1e-3)]},
               name="abc_20260101_000000")


def test_save_numbers_runs_per_machine_and_round_trips(tmp_path: Path) -> None:
    store = b.Store(tmp_path / "perf")
    p1 = store.save(_one())
    p2 = store.save(_one())
    assert p1.name == "0001_abc_20260101_000000.json"
    assert p2.name.startswith("0002_")
    assert p1.parent.name == "Linux-CPython-3.11-64bit"
    loaded = b.load(p2)
    assert loaded.number == 2
    assert loaded.fingerprint == FP
    assert loaded.tests["t.py::test_a"]["metrics"][0]["value"] == 3
    assert len(loaded.tests["t.py::test_a"]["metrics"][1]["samples"]) == 30
    assert [r.number for r in store.runs()] == [1, 2]
    assert not list(p1.parent.glob("*.part")), "temp files must not be left behind"


def test_history_is_never_rewritten(tmp_path: Path) -> None:
    store = b.Store(tmp_path)
    first = store.save(_one())
    before = first.read_bytes()
    for _ in range(3):
        store.save(_one())
    assert first.read_bytes() == before


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    store = b.Store(tmp_path)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for _ in range(5):
                b.Store(tmp_path).save(_one())
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
        b.load(r.path)  # every file complete and valid


def test_pytest_benchmark_loader_never_sees_our_files(tmp_path: Path) -> None:
    from pytest_benchmark.storage.file import FileStorage

    store = b.Store.from_storage(f"file://{tmp_path}")
    store.save(_one())
    machine = b.machine_name()

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
    assert b.storage_root(None) == Path(".benchmarks/perf")
    assert b.storage_root("file://ci/store") == Path("ci/store/perf")
    assert b.storage_root("some/dir") == Path("some/dir/perf")
    assert b.storage_root("elasticsearch+https://host/index/doc") == Path(".benchmarks/perf")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "file is empty"),
        (b"{\"format\": \"perf-baseline\", \"schema_version\": 1, \"run\": {", "truncated JSON"),
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
    with pytest.raises(b.BaselineError) as ei:
        b.load(p)
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
        (lambda d: d["tests"]["t.py::test_a"]["metrics"][0].update(unit="parsecs"),
         "unknown unit"),
        (lambda d: d["tests"]["t.py::test_a"]["metrics"][0].update(kind="time"),
         "does not match unit"),
        (lambda d: d["tests"]["t.py::test_a"]["metrics"][1].update(samples=["x"]),
         "samples must be"),
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
    with pytest.raises(b.BaselineError, match=problem):
        b.load(p)


def test_resolve_specs(tmp_path: Path) -> None:
    store = b.Store(tmp_path)
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
    with pytest.raises(b.BaselineNotFound, match="no stored perf run matches '7'"):
        store.resolve("7", machine=m)
    with pytest.raises(b.BaselineNotFound, match="no stored perf run for machine"):
        b.Store(tmp_path / "empty").resolve(True, machine=m)


def test_bad_run_name_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must not contain"):
        b.Store(tmp_path).save(run({}, name="a/b"))


def test_commit_info_tolerates_no_git(tmp_path: Path) -> None:
    info = b.commit_info(tmp_path)
    assert set(info) == {"id", "branch", "dirty"}
    assert b.default_tag({"id": None, "dirty": None}).startswith("unversioned_")


def test_schema_version_1_files_are_still_read(tmp_path: Path) -> None:
    """v1 had no run.cpu: such files load, with the CPU share unknown (see the history)."""
    d = _valid_json()
    d["schema_version"] = 1
    del d["run"]["cpu"]
    p = tmp_path / "0001_old.json"
    p.write_text(json.dumps(d))
    r = b.load(p)
    assert r.schema_version == 1 and r.cpu is None
    assert r.tests == d["tests"]


def test_cpu_share_round_trips(tmp_path: Path) -> None:
    p = b.Store(tmp_path).save(_one())
    assert b.load(p).cpu == {"wall_s": 10.0, "others_fraction": 0.01, "steal_fraction": 0.0}
