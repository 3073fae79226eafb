"""The package as a user meets it: one distribution name, one pytest plugin, and every
``-p no:...`` spelling the README, the docs and the workflows use doing what it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST = "pytest-torch-perf"


def test_one_pytest11_entry_point_under_the_distribution_name() -> None:
    dist = metadata.distribution(DIST)
    entries = [e for e in dist.entry_points if e.group == "pytest11"]
    assert [(e.name, e.value) for e in entries] == [("perf", "perf.plugin")]
    # No other installed distribution registers a part of perf as a plugin of its own.
    others = [
        (d.metadata["Name"], e.value)
        for d in metadata.distributions()
        if d.metadata["Name"] != DIST
        for e in d.entry_points
        if e.group == "pytest11" and e.value.split(".")[0] == "perf"
    ]
    assert others == []


def test_pytest_version_lists_one_perf_plugin() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--version", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    text = out.stdout + out.stderr
    lines = [ln for ln in text.splitlines() if "perf" in ln and "pytest-benchmark" not in ln]
    assert len(lines) == 1, text
    assert lines[0].strip().startswith(f"{DIST}-"), text


_PROBE = textwrap.dedent(
    """
    import sys

    def test_probe(pytestconfig):
        loaded = sorted(m for m in sys.modules if m == "perf" or m.startswith("perf."))
        names = sorted(
            n
            for n, p in pytestconfig.pluginmanager.list_name_plugin()
            if n and "perf" in n and p is not None  # a blocked name is listed with None
        )
        print("PERF_MODULES", loaded)
        print("PERF_PLUGINS", names)
    """
)


def _probe(pytester: pytest.Pytester, *args: str) -> tuple[list[str], list[str]]:
    pytester.makepyfile(test_probe=_PROBE)
    r = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", *args)
    r.assert_outcomes(passed=1)
    text = r.stdout.str()
    mods = re.search(r"PERF_MODULES (\[.*\])", text)
    plugins = re.search(r"PERF_PLUGINS (\[.*\])", text)
    assert mods and plugins, text
    return eval(mods.group(1)), eval(plugins.group(1))


def test_no_perf_loads_nothing_of_perf(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under `--perf-rehearse-cuda` every child imports `perf.core.rehearse` from the
    # rehearsal's sitecustomize, as asked; this child is the user's plain pytest without it.
    from perf.core import rehearse

    monkeypatch.delenv(rehearse.ENV, raising=False)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p != rehearse.SITE_DIR))
    mods, plugins = _probe(pytester, "-p", "no:perf")
    assert mods == [] and plugins == []
    # ... and the options are gone with it: a perf option is now an unknown option.
    r = pytester.runpytest_subprocess("-p", "no:perf", "--perf-devices=cpu")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*unrecognized arguments: --perf-devices=cpu*"])


def test_without_the_option_every_part_is_registered(pytester: pytest.Pytester) -> None:
    _, plugins = _probe(pytester)
    import perf.plugin

    assert {"perf", *perf.plugin.pytest_plugins} <= set(plugins), plugins


def _documented_no_spellings() -> dict[str, list[str]]:
    """``-p no:NAME`` as written in the README, the docs, the workflows and the scripts."""
    found: dict[str, list[str]] = {}
    files = [ROOT / "README.md", ROOT / "tox.ini", ROOT / ".ci" / "run"]
    files += sorted((ROOT / "docs").glob("*.md"))
    files += sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    files += sorted((ROOT / "benchmarks").glob("*.py"))
    for path in files:
        for name in re.findall(r"""-p[ "',]+no:([\w.\-]+)""", path.read_text()):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_documented_no_spelling_names_a_plugin_that_it_removes(
    pytester: pytest.Pytester,
) -> None:
    spellings = _documented_no_spellings()
    assert "perf" in spellings and "xdist" in spellings, spellings
    pytester.makeconftest(
        textwrap.dedent(
            """
            import json, os

            def pytest_configure(config):
                names = json.loads(os.environ["PROBE_NAMES"])
                pm = config.pluginmanager
                print("REGISTERED", json.dumps({n: pm.has_plugin(n) for n in names}))
            """
        )
    )
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    import json

    pytester._monkeypatch.setenv("PROBE_NAMES", json.dumps(sorted(spellings)))

    def registered(*args: str) -> dict[str, bool]:
        r = pytester.runpytest_subprocess("-s", *args)
        m = re.search(r"REGISTERED (\{.*\})", r.stdout.str())
        assert m, r.stdout.str() + r.stderr.str()
        return json.loads(m.group(1))

    plain = registered()
    unknown = {n: spellings[n] for n, on in plain.items() if not on}
    assert not unknown, f"-p no:NAME for a plugin that is not loaded here: {unknown}"
    for name in spellings:
        assert registered("-p", f"no:{name}")[name] is False, name


def test_console_script_runs_and_does_not_shadow_linux_perf(tmp_path: Path) -> None:
    dist = metadata.distribution(DIST)
    scripts = [e for e in dist.entry_points if e.group == "console_scripts"]
    assert [(e.name, e.value) for e in scripts] == [(DIST, "perf.__main__:main")]
    exe = Path(sys.executable).parent / DIST
    assert exe.exists(), f"{exe} not installed"
    r = subprocess.run(
        [str(exe), "--storage", str(tmp_path), "show"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (Path(sys.executable).parent / "perf").exists()


def _installs(text: str) -> list[str]:
    """The ``pip install`` lines of a text, flags, comments and spacing dropped."""
    found = []
    for line in text.splitlines():
        words = line.split("#")[0].split()
        if words[:2] == ["pip", "install"]:
            found.append(" ".join(w for w in words[2:] if w != "-q"))
    return found


def test_ci_installs_exactly_what_the_readme_and_getting_started_tell_a_newcomer() -> None:
    """A green CI must not hide a missing install step: .ci/run's installs are the README's
    developer install (and getting-started's), with every extra whose tests would skip."""
    ci = _installs((ROOT / ".ci/run").read_text())
    readme = _installs((ROOT / "README.md").read_text())
    start = _installs((ROOT / "docs/getting-started.md").read_text())
    assert ci == ["torch==2.13.0", '-e ".[test,docs,plots,history,lightning]"'], ci
    for doc in (readme, start):
        assert all(step in doc for step in ci), (ci, doc)
    extras = set(metadata.metadata(DIST).get_all("Provides-Extra") or [])
    assert extras == {"test", "docs", "plots", "history", "lightning"}, (
        "a new extra: install it in CI"
    )
