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

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
