"""Installs perf's simulated device (``PERF_SIM_DEVICES=N`` devices) in every Python process
started with this folder first on ``PYTHONPATH`` (``python -m perf sim -- COMMAND``, see
:func:`perf.sim.device.launch_env`), after running the ``sitecustomize`` this one shadows, if any.

Why: an unmodified training script (``torchrun --nproc-per-node 2 train.py``) never calls
``perf.simulated_device()``; its ranks are separate interpreters started by the launcher. The
shadowed one runs first because it describes the interpreter ``sim`` is layered on (a CUDA
rehearsal's CUDA build, say): ``--as-cuda`` must answer over it, not be overwritten by it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

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

try:
    from perf.sim.device import install_from_env

    install_from_env()
except ImportError:  # perf is not importable in this interpreter: nothing to install
    pass
except Exception as e:  # a bad PERF_SIM_DEVICES, a process with CUDA: say so, run as is
    print(f"perf: the simulated device was not installed: {e}", file=sys.stderr)
