"""Root conftest: pytester drives the plugin tests in tests/harness."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator

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


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_under_basetemp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This run's temporary files go under pytest's base temporary folder, which pytest
    prunes (it keeps the last 3 runs), not into the system's for good: the output the gate
    keeps of a child that failed on purpose (``perf-against-failed-*``), the children's
    folder of a gate a test kills (``perf-pairs-*``) and torchrun's ``torchelastic_*``. Set
    for this process (``tempfile.tempdir``) and every child (``TMPDIR``). Inductor's cache
    and precompiled headers stay where they were (its default folder under the system's
    temporary folder), so that a second run finds its compiled kernels."""
    tmp = str(tmp_path_factory.mktemp("tmp", numbered=False))
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")}
    saved_tempdir = tempfile.tempdir
    inductor = _inductor_default_cache_dir()
    if saved["TORCHINDUCTOR_CACHE_DIR"] is None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor
    # Inductor puts its precompiled headers under its *default* folder, whatever
    # TORCHINDUCTOR_CACHE_DIR says (codecache._HEADER_DIR, fixed at import from
    # tempfile.gettempdir()): under this run's folder they were compiled again in every run
    # (two g++ calls, about 7 s). The link sends them to the lasting folder; pytest's pruning
    # removes the link, never what it points to.
    link = os.path.join(tmp, os.path.basename(inductor))
    if not os.path.lexists(link):
        os.makedirs(inductor, exist_ok=True)
        os.symlink(inductor, link, target_is_directory=True)
    os.environ["TMPDIR"], tempfile.tempdir = tmp, tmp
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        tempfile.tempdir = saved_tempdir


def _inductor_default_cache_dir() -> str:
    """Inductor's default cache folder (``torch._inductor.runtime.cache_dir_utils``), without
    importing Inductor here."""
    import getpass
    import re

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(
        tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
    )
