"""The plugin's shape: hooks defined in one place (the modules of ``perf.plugin.pytest_plugins``,
never imported into another module, where tidying an import would silently disable them),
and one exit-status rule (:meth:`perf.plugin.session.PerfSession.fail`)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import perf.plugin

PLUGIN = Path(perf.plugin.__file__).parent


def _modules() -> dict[str, object]:
    return {
        m.name: importlib.import_module(m.name)
        for m in pkgutil.iter_modules(perf.plugin.__path__, "perf.plugin.")
    }


def _hooks_and_fixtures(mod: object) -> dict[str, object]:
    out = {}
    for name, value in vars(mod).items():
        is_hook = name.startswith("pytest_") and callable(value)
        is_fixture = type(value).__name__ == "FixtureFunctionDefinition"
        if is_hook or is_fixture:
            out[name] = value
    return out


def test_no_module_imports_another_modules_hook_or_fixture() -> None:
    imported = []
    for name, mod in _modules().items():
        for attr, value in _hooks_and_fixtures(mod).items():
            home = getattr(value, "__module__", name)
            if home != name:
                imported.append(f"{name}.{attr} (defined in {home})")
    assert not imported, imported


def test_every_module_with_hooks_is_in_pytest_plugins() -> None:
    with_hooks = {name for name, mod in _modules().items() if _hooks_and_fixtures(mod)}
    assert with_hooks <= set(perf.plugin.pytest_plugins), with_hooks - set(
        perf.plugin.pytest_plugins
    )
    assert all(importlib.import_module(n) for n in perf.plugin.pytest_plugins)


def test_one_exit_status_rule() -> None:
    """Only the session's ``fail`` sets a verdict's exit status; other assignments report an
    interruption the way pytest does."""
    setters = []
    for path in sorted(PLUGIN.glob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\.exitstatus\s*=[^=]", line) and "ExitCode.INTERRUPTED" not in line:
                setters.append(f"{path.name}:{i}: {line.strip()}")
    assert len(setters) == 1 and setters[0].startswith("session.py"), setters


def test_the_session_lives_in_the_stash(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        from perf.plugin.session import SESSION_KEY, PerfSession, perf_session

        def pytest_configure(config):
            config._seen = perf_session(config)

        def pytest_unconfigure(config):
            s = config.stash[SESSION_KEY]
            assert isinstance(s, PerfSession) and s is config._seen
            assert not config.pluginmanager.is_registered(s)  # a session, not a plugin
            print("SESSION", sorted(s.results))
        """
    )
    pytester.makepyfile(
        test_m="def test_m(perf_metrics):\n    perf_metrics.record('n', 3, 'count')\n"
    )
    r = pytester.runpytest_inprocess("-s", "-p", "no:randomly")
    r.assert_outcomes(passed=1)
    r.stdout.fnmatch_lines(["SESSION ['test_m.py::test_m']"])


def test_no_private_names_imported_across_modules_in_plugin_gate_store() -> None:
    """``from perf.x import _thing`` across modules is how a split leaves scar tissue: the
    name is made public where it is defined instead."""
    import ast

    found = []
    for package in ("plugin", "gate", "store"):
        for path in sorted((PLUGIN.parent / package).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("perf"):
                    for alias in node.names:
                        private = alias.name.startswith("_") and not alias.name.startswith("__")
                        if private:
                            found.append(f"{path.name}: from {node.module} import {alias.name}")
    assert not found, found
