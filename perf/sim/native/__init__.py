"""``sim``'s per-op path in C++, on by default (``PERF_SIM_NATIVE``).

Why: the Python fallback costs about 20 us an op (host views, the CPU kernel, new sim tensors,
the memory model's malloc and free), so loops of small ops ran 5-13x slower on ``sim`` than on
the CPU. The C++ fallback (``sim_native.cpp``) runs the common op without Python; the ops with
a rule of ``sim``'s (syncs inside kernels, copies, CUDA's branches, BLAS workspaces), several
devices, sparse or mixed-device arguments and every error still go to the Python fallback,
which it reaches by redispatch to the ``PrivateUse2`` key.

The extension is compiled on first use by ``torch.utils.cpp_extension`` (a C++ compiler and
``ninja``; about 30 s once per torch version and version of the C++ source, cached in
``TORCH_EXTENSIONS_DIR``).
``PERF_SIM_NATIVE``: unset or ``auto`` (the C++ path if it builds, else the Python path with a
warning saying why), ``1`` (the C++ path or an error), ``0`` (the Python path).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import torch

#: environment variable: "1" turns the C++ path on
ENV = "PERF_SIM_NATIVE"
SOURCE = Path(__file__).with_name("sim_native.cpp")
#: the dispatch key the Python fallback sits at when the C++ one owns ``PrivateUse1``
PYTHON_KEY = "PrivateUse2"

_module: Any = None


class NativeBuildError(RuntimeError):
    """The C++ extension could not be built or loaded."""


def mode(environ: Any = None) -> str:
    """``PERF_SIM_NATIVE`` as ``"auto"`` (unset, empty or ``auto``), ``"on"`` (``1``, ``true``,
    ``yes``, ``on``) or ``"off"`` (``0``, ``false``, ``no``, ``off``); a clear error otherwise."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    if raw in ("1", "true", "yes", "on"):
        return "on"
    if raw in ("0", "false", "no", "off"):
        return "off"
    raise ValueError(
        f"{ENV}={raw!r}: use 1 (the C++ path), 0 (the Python path) or auto (the C++ path if it "
        "builds; the default)"
    )


def build_name() -> str:
    """The extension's name: one build per torch version (the binary is torch's ABI) and per
    source. Why the source: two checkouts of perf (a gate's base and head worktrees) share
    ``TORCH_EXTENSIONS_DIR``, and ``torch.utils.cpp_extension`` lets a process that waited for
    another's build of the same name load that build, made from the other's source."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return "perf_sim_native_" + re.sub(r"[^0-9A-Za-z]", "_", torch.__version__) + "_" + digest


def load() -> Any:
    """Build (once) and import the extension; :class:`NativeBuildError` says why not."""
    global _module
    if _module is not None:
        return _module
    try:
        from torch.utils import cpp_extension

        # One build for this process and the processes it starts, wherever they put HOME
        # (pytest's pytester gives each test its own): torch's own variable, at torch's default.
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", cpp_extension.get_default_build_root())
        _module = cpp_extension.load(
            name=build_name(),
            sources=[str(SOURCE)],
            extra_cflags=["-O2"],
            verbose=False,
        )
    except Exception as e:  # compiler, ninja, headers: all say the same to the user
        raise NativeBuildError(
            f"perf's simulated device could not build its C++ path ({type(e).__name__}: "
            f"{_tail(str(e))}); it needs a C++ compiler and the ninja package "
            f"(pip install ninja). {ENV}=0 runs the Python path (slower on loops of small "
            "ops), without building."
        ) from e
    return _module


def _tail(text: str, limit: int = 1500) -> str:
    """The end of a build log: the compiler's errors are there."""
    return text if len(text) <= limit else "..." + text[-limit:]


def module() -> Any:
    """The loaded extension when the C++ path is active in this process, else None."""
    return _module if _active else None


_active = False


def activate() -> Any:
    """Load the extension and mark the C++ path active (called by ``simulated_device()``)."""
    global _active
    mod = load()
    _active = True
    return mod
