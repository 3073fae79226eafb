"""python -m perf: show, compare, plot over a real store."""

from __future__ import annotations

from pathlib import Path

import pytest
from _runs import metric, run

from perf.__main__ import main
from perf.store.files import Store

M = "Linux-CPython-3.11-64bit"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    s = Store.from_storage(str(tmp_path))
    s.save(run({"t.py::test_a": [metric("syncs", 10, "syncs")]}, name="old"))
    s.save(run({"t.py::test_a": [metric("syncs", 11, "syncs")]}, name="new"))
    return tmp_path


def _main(store: Path, *args: str) -> int:
    return main(["--storage", str(store), "--machine", M, *args])


def test_show_lists_and_shows(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(store, "show") == 0
    out = capsys.readouterr().out
    assert f"{M}/0001_old" in out and f"{M}/0002_new" in out
    assert _main(store, "show", "1") == 0
    out = capsys.readouterr().out
    assert "t.py::test_a  syncs  10 syncs" in out and "commit  abc123 on main" in out


def test_compare_exit_codes(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(store, "compare", "1", "2") == 1
    assert "REGRESSIONS (1)" in capsys.readouterr().out
    assert _main(store, "compare", "2", "1") == 0
    assert _main(store, "compare", "1", "1", "--markdown") == 0
    assert "## perf gate" in capsys.readouterr().out


def test_errors_are_clear(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(store, "show", "9") == 2
    assert "no stored perf run matches '9'" in capsys.readouterr().err
    bad = next((store / "perf" / M).glob("0001_*.json"))
    bad.write_text('{"format": "perf-baseline", "schema_version": 1, "run": {')
    assert _main(store, "compare", "1", "2") == 2
    err = capsys.readouterr().err
    assert str(bad.name) in err and "truncated JSON" in err
    with pytest.raises(SystemExit):
        main(["bogus"])


def test_plot_history(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "h.png"
    assert _main(store, "plot", "history", "syncs", "--test", "t.py::test_a", "-o", str(out)) == 0
    assert out.exists()
    assert _main(store, "plot", "speedup", "nope", "-o", str(out)) == 2
    assert "sized points" in capsys.readouterr().err


def test_show_escapes_untrusted_strings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = Store.from_storage(str(tmp_path))
    evil = "t.py::x[\x1b]0;title\x07\x1b[31m\n::error::pwned]"
    s.save(run({evil: [metric("syncs", 1, "syncs")]}, name="evil"))
    assert _main(tmp_path, "show", "1") == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;title\\x07" in out
    assert not any(line.lstrip().startswith("::") for line in out.splitlines())


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ('"branch": "main"', '"branch": {"x": 1}', "run.commit.branch must be str"),
        ('"gpus": []', '"gpus": 7', "run.fingerprint.gpus must be list"),
        ('"gpus": []', '"gpus": [null]', r"gpus[0] must be an object"),
        ('"syncs", "value": 10', '"syncs", "value": 10, "value": 9', "duplicate key 'value'"),
        ('"value": 10', '"value": ' + "1" * 400, "integer with 400 characters"),
    ],
)
def test_show_refuses_damaged_runs_without_a_traceback(
    store: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, problem: str
) -> None:
    import json

    path = next((store / "perf" / M).glob("0001_*.json"))
    text = json.dumps(json.loads(path.read_text()))  # one known spacing
    assert old in text
    path.write_text(text.replace(old, new, 1))
    assert _main(store, "show", "1") == 2
    err = capsys.readouterr().err
    assert problem in err and path.name in err


def test_show_refuses_deep_nesting(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = next((store / "perf" / M).glob("0001_*.json"))
    text = path.read_text().rstrip()
    path.write_text(text[:-1] + ', "x": ' + "[" * 50_000 + "]" * 50_000 + "}")
    assert _main(store, "show", "1") == 2
    assert "nested 50001 levels deep" in capsys.readouterr().err
