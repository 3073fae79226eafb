"""python -m perf export: a stored run as Bencher Metric Format and as github-action-benchmark
JSON, validated against each format's documented schema.

The schemas are written from the formats' own documentation:

- BMF: the JSON schema published at https://bencher.dev/bmf.json (Bencher's docs, "Bencher
  Metric Format"): an object of benchmarks, each an object of measures, each an object with a
  required number ``value`` and optional numbers ``lower_value`` / ``upper_value``.
- github-action-benchmark, tools ``customSmallerIsBetter`` / ``customBiggerIsBetter`` (its
  README, custom benchmarks): an array of objects with ``name`` (string), ``unit`` (string),
  ``value`` (number) and optional ``range`` (string) and ``extra`` (string).

``jsonschema`` validates them where it is installed; the small validator below checks the
same keywords everywhere (it is not a dependency of the test extra).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _runs import metric, run, timed

from perf.__main__ import main
from perf.report.export import export_text, to_bencher, to_github_action_benchmark
from perf.store.files import Store
from perf.store.runs import machine_name

M = "Linux-CPython-3.11-64bit"

BMF_SCHEMA: dict[str, Any] = {
    "$id": "https://bencher.dev/bmf.json",
    "$schema": "http://json-schema.org/draft-07/schema",
    "type": "object",
    "patternProperties": {
        ".+": {
            "type": "object",
            "patternProperties": {
                ".+": {
                    "type": "object",
                    "properties": {
                        "value": {"type": "number"},
                        "lower_value": {"type": "number"},
                        "upper_value": {"type": "number"},
                    },
                    "required": ["value"],
                }
            },
        }
    },
}

GAB_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema",
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "unit": {"type": "string"},
            "value": {"type": "number"},
            "range": {"type": "string"},
            "extra": {"type": "string"},
        },
        "required": ["name", "unit", "value"],
    },
}

_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "number": (int, float),
}


def _check(data: Any, schema: dict[str, Any], where: str = "$") -> None:
    """The keywords the two schemas use: type, properties, patternProperties ('.+'),
    required, items. Raises AssertionError naming the place."""
    t = schema.get("type")
    if t:
        ok = isinstance(data, _TYPES[t]) and not isinstance(data, bool)
        assert ok, f"{where}: expected {t}, got {type(data).__name__}"
    for key in schema.get("required", []):
        assert key in data, f"{where}: missing required {key!r}"
    for key, sub in schema.get("properties", {}).items():
        if key in data:
            _check(data[key], sub, f"{where}.{key}")
    for pattern, sub in schema.get("patternProperties", {}).items():
        assert pattern == ".+"
        for key, value in data.items():
            assert key, f"{where}: empty key"
            _check(value, sub, f"{where}.{key}")
    if "items" in schema:
        for i, item in enumerate(data):
            _check(item, schema["items"], f"{where}[{i}]")


def _validate(data: Any, schema: dict[str, Any]) -> None:
    _check(data, schema)
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(data, schema)


def _run():
    return run(
        {
            "tests/t.py::test_step[sim]": [
                metric("syncs", 3, "syncs"),
                metric("peak_bytes", 4096, "bytes"),
                timed("step_s", 1e-3),
                metric("n", 128, "elements"),
            ],
            "tests/t.py::test_amp": [
                metric("speedup", 1.8, "ratio", higher_is_better=True, ci=(1.7, 1.9)),
            ],
        },
        name="head",
    )


def test_bencher_metric_format():
    data = to_bencher(_run())
    _validate(data, BMF_SCHEMA)
    step = data["tests/t.py::test_step[sim]"]
    assert step["syncs"] == {"value": 3.0}
    lo, hi = step["step_s"]["lower_value"], step["step_s"]["upper_value"]
    assert lo <= step["step_s"]["value"] <= hi
    assert data["tests/t.py::test_amp"]["speedup"] == {
        "value": 1.8,
        "lower_value": 1.7,
        "upper_value": 1.9,
    }


def test_github_action_benchmark_one_direction_per_file():
    smaller = to_github_action_benchmark(_run())
    bigger = to_github_action_benchmark(_run(), bigger_is_better=True)
    _validate(smaller, GAB_SCHEMA)
    _validate(bigger, GAB_SCHEMA)
    assert [e["name"] for e in smaller] == [
        "tests/t.py::test_step[sim] syncs",
        "tests/t.py::test_step[sim] peak_bytes",
        "tests/t.py::test_step[sim] step_s",
    ]  # the info metric "n" has no direction: in neither file
    assert [e["name"] for e in bigger] == ["tests/t.py::test_amp speedup"]
    assert bigger[0]["range"] == "1.7..1.9" and "commit abc123" in bigger[0]["extra"]
    assert smaller[0]["value"] == 3 and smaller[0]["unit"] == "syncs"


def test_bad_format_and_option_are_named():
    with pytest.raises(ValueError, match="export format 'csv'"):
        export_text(_run(), "csv")
    with pytest.raises(ValueError, match="--bigger-is-better applies to"):
        export_text(_run(), "bencher", bigger_is_better=True)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    Store.from_storage(str(tmp_path)).save(_run())
    return tmp_path


def test_cli_writes_both_formats(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    args = ["--storage", str(store), "--machine", M, "export"]
    assert main([*args, "--format", "bencher", "1"]) == 0
    _validate(json.loads(capsys.readouterr().out), BMF_SCHEMA)
    out = tmp_path / "gab.json"
    assert main([*args, "--format", "github-action-benchmark", "1", "-o", str(out)]) == 0
    assert "wrote github-action-benchmark JSON" in capsys.readouterr().out
    _validate(json.loads(out.read_text()), GAB_SCHEMA)
    assert main([*args, "--format", "bencher", "7"]) == 2
    assert "no stored perf run matches '7'" in capsys.readouterr().err


def test_cli_as_a_process(store: Path):
    """The command as docs/ci.md shows it, run by the interpreter (``python -m perf``)."""
    proc = subprocess.run(
        [sys.executable, "-m", "perf", "--storage", str(store), "--machine", M, "export",
         "--format", "github-action-benchmark", "--bigger-is-better", "1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    _validate(json.loads(proc.stdout), GAB_SCHEMA)


def test_the_commands_of_docs_ci_md_as_written(tmp_path: Path):
    """docs/ci.md's export commands, each run by bash in a folder whose default store
    (``.benchmarks``, this machine) holds one run, as after ``--benchmark-autosave``."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "ci.md").read_text()
    section = text[text.index("### Export to Bencher") :]
    block = section[section.index("```bash\n") + 8 :]
    commands = block[: block.index("```")].strip().splitlines()
    assert len(commands) == 3 and all(c.startswith("python -m perf export ") for c in commands)
    here = replace(_run(), machine=machine_name())  # the commands use this machine's folder
    Store.from_storage(str(tmp_path / ".benchmarks")).save(here)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command in commands:
        proc = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, f"{command}: {proc.stderr}"
    _validate(json.loads((tmp_path / "perf-bencher.json").read_text()), BMF_SCHEMA)
    _validate(json.loads((tmp_path / "perf-gab.json").read_text()), GAB_SCHEMA)
    bigger = json.loads((tmp_path / "up.json").read_text())
    _validate(bigger, GAB_SCHEMA)
    assert [e["name"] for e in bigger] == ["tests/t.py::test_amp speedup"]
