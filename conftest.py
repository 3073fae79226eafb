"""Root conftest: pytester drives the plugin tests in tests/harness."""

from __future__ import annotations

import sys

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester, writing no bytecode for the projects a test writes.

    Tests rewrite a project's file within the same second at the same size (``N = 0`` then
    ``N = 2``); Python's and pytest's caches validate bytecode by the source's mtime in whole
    seconds and its size only, so the old code would run again wherever bytecode is written
    (a newcomer's default; CI boxes often set ``PYTHONDONTWRITEBYTECODE``, hiding it). Off in
    this process, for in-process runs, and in every child.
    """
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    return pytester
