"""Checks of perf's options before any test runs, and the wording of write failures.

A doomed run must fail in its first second, not after an hour of tests: a save name that
cannot become a file name, a report path that is a folder, a storage folder that cannot be
written, or a ``--benchmark-compare`` target that names no stored run (a typo used to turn
the gate off: "Nothing gated", exit 0). Each check returns the problem as a sentence naming
the option and its value, or None; :mod:`perf.plugin.gate` turns problems into a pytest
usage error (exit 4). No pytest import here.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from perf.store.files import Store
from perf.store.runs import BaselineNotFound, NotARun, name_problem, storage_root
from perf.store.schema import DEFAULT_STORAGE


def os_error_text(e: OSError) -> str:
    """``No space left on device [ENOSPC]``: the OS's words and the symbolic errno."""
    code = errno.errorcode.get(e.errno or 0)
    return f"{e.strerror or e}" + (f" [{code}]" if code else "")


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def folder_problem(folder: Path) -> str | None:
    """Why files cannot be created in ``folder`` (created on demand), or None.

    The nearest existing ancestor must be a writable folder. ``os.access`` also sees a
    read-only mount for root, for whom permission bits do not count.
    """
    p = _nearest_existing(folder)
    if not p.is_dir():
        return f"{p} is not a folder"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{p} is not writable"
    return None


def save_name_problem(option: str, name: str) -> str | None:
    problem = name_problem(name)
    return f"{option}={name!r}: {problem}" if problem else None


def storage_problem(storage: str | None) -> str | None:
    root = storage_root(storage)
    problem = folder_problem(root)
    if problem:
        return (
            f"--benchmark-storage={storage or DEFAULT_STORAGE!r}: runs are saved "
            f"under {root}, but {problem}"
        )
    return None


def report_problem(path: str) -> str | None:
    """``--perf-report`` must name a file that can be written (its folder is created)."""
    p = Path(path)
    if p.is_dir():
        return f"--perf-report={path!r} is a folder; give a file name, e.g. {p / 'perf-report.md'}"
    if p.exists() and not os.access(p, os.W_OK):
        return f"--perf-report={path!r} is not writable"
    if not p.exists():
        problem = folder_problem(p.parent)
        if problem:
            return f"--perf-report={path!r} cannot be created: {problem}"
    return None


def compare_problem(spec: str | bool, store: Store, machine: str) -> str | None:
    """An explicit ``--benchmark-compare=X`` must name a stored run (or a ``.json`` file).

    A bare ``--benchmark-compare`` may find no run (the first run on a new runner) and is
    left to the gate; an explicit target that matches nothing is a typo or a swallowed test
    path, and is refused.
    """
    if spec is True or spec in (None, ""):
        return None
    try:
        store.resolve(spec, machine=machine)
    except NotARun as e:
        return str(e)
    except BaselineNotFound as e:
        return f"--benchmark-compare={spec}: {e}"
    return None
