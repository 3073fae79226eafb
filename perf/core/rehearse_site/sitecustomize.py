"""Installs perf's CUDA rehearsal (``PERF_REHEARSE_CUDA=N``) in every Python process started
with this folder first on ``PYTHONPATH`` (see :mod:`perf.core.rehearse`), then runs the
``sitecustomize`` this one shadows, if there is one."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

try:
    from perf.core.rehearse import install_from_env

    install_from_env()
except ImportError:  # perf is not importable in this interpreter: nothing to rehearse
    pass
except ValueError as e:  # a bad PERF_REHEARSE_CUDA: say so, and run as a real process
    print(f"perf: {e}", file=sys.stderr)

# The sitecustomize this one shadows is the next one on sys.path *after* this folder, so
# that two such folders on PYTHONPATH (`python -m perf sim` inside a CUDA rehearsal) run
# each once, in order; searching every other folder made them run each other forever.
_here = os.path.dirname(os.path.abspath(__file__))
_dirs = [os.path.abspath(p or ".") for p in sys.path]
_rest = sys.path[_dirs.index(_here) + 1 :] if _here in _dirs else sys.path
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
