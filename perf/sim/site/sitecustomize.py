"""Installs perf's simulated device (``PERF_SIM_DEVICES=N`` devices) in every Python process
started with this folder first on ``PYTHONPATH`` (``python -m perf sim -- COMMAND``, see
:func:`perf.sim.device.launch_env`), then runs the ``sitecustomize`` this one shadows, if any.

Why: an unmodified training script (``torchrun --nproc-per-node 2 train.py``) never calls
``perf.simulated_device()``; its ranks are separate interpreters started by the launcher.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

try:
    from perf.sim.device import install_from_env

    install_from_env()
except ImportError:  # perf is not importable in this interpreter: nothing to install
    pass
except Exception as e:  # a bad PERF_SIM_DEVICES, a process with CUDA: say so, run as is
    print(f"perf: the simulated device was not installed: {e}", file=sys.stderr)

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
