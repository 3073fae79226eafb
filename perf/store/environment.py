"""What a run's environment was, beyond the machine fingerprint: the installed versions of the
distributions whose modules the run imported, and the environment variables known to change
how fast PyTorch code runs. Stored with each run (``run.environment``), so that a timing the
stored baseline finds slower, while the code measures as fast as the baseline's commit in
this environment, is reported as a change of the environment, naming what changed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

#: Environment variables that change how fast the same code runs (thread pools, allocators,
#: kernel selection, debug modes). Exact names, then prefixes.
PERF_ENV_VARS = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY",
    "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG",
    "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONMALLOC", "PYTHONDEVMODE", "PYTHONOPTIMIZE",
    "PYTHONHASHSEED",
)  # fmt: skip
PERF_ENV_PREFIXES = ("PYTORCH_", "TORCH_", "TORCHINDUCTOR_", "KMP_", "MKL_", "NCCL_", "CUDNN_",
                     "MALLOC_", "DNNL_", "ONEDNN_")  # fmt: skip
#: Set by perf itself for its own children; not the user's environment.
_OWN = ("PERF_MEASURE_SCALE",)


def perf_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables of ``environ`` that perf knows can change timings."""
    return {
        k: v
        for k, v in sorted(environ.items())
        if k not in _OWN and (k in PERF_ENV_VARS or k.startswith(PERF_ENV_PREFIXES))
    }


def imported_packages(modules: Iterable[str] | None = None) -> dict[str, str]:
    """Distribution name -> installed version, for every distribution that provides a
    top-level module imported in this process (the tests' dependencies, pytest's plugins)."""
    from importlib import metadata

    names = {m.partition(".")[0] for m in (sys.modules if modules is None else modules)}
    names -= set(sys.stdlib_module_names) | {"__main__", "builtins"}
    try:
        owners = metadata.packages_distributions()
    except Exception:  # a broken installed distribution must not stop the run
        return {}
    out: dict[str, str] = {}
    for name in sorted(names):
        for dist in owners.get(name, []):
            try:
                out[dist] = metadata.version(dist)
            except Exception:
                continue
    return dict(sorted(out.items()))


def environment() -> dict[str, Any]:
    """This process's environment record (``run.environment``)."""
    return {"packages": imported_packages(), "env": perf_env()}


def _fmt(v: Any) -> str:
    s = "unset" if v is None else repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def differences(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
    old_fingerprint: Mapping[str, Any] | None = None,
    new_fingerprint: Mapping[str, Any] | None = None,
    limit: int = 8,
) -> list[str]:
    """What differs between two runs' environments and fingerprints, one item per change,
    e.g. ``package dep 1.0 -> 2.0``, ``env OMP_NUM_THREADS '4' -> '1'``. A package present on
    one side only is listed only when the other side recorded packages at all."""
    out: list[str] = []
    for key in sorted(set(old_fingerprint or {}) | set(new_fingerprint or {})):
        a, b = (old_fingerprint or {}).get(key), (new_fingerprint or {}).get(key)
        if a != b:
            out.append(f"machine {key} {_fmt(a)} -> {_fmt(b)}")
    if old is not None and new is not None:
        for section, label in (("packages", "package"), ("env", "env")):
            a_map, b_map = old.get(section) or {}, new.get(section) or {}
            for key in sorted(set(a_map) | set(b_map)):
                a, b = a_map.get(key), b_map.get(key)
                if a == b or (section == "packages" and (a is None or b is None)):
                    continue  # a package imported on one side only says little
                if section == "packages":
                    out.append(f"{label} {key} {a} -> {b}")
                else:
                    out.append(f"{label} {key} {_fmt(a)} -> {_fmt(b)}")
    more = len(out) - limit
    return out[:limit] + ([f"and {more} more"] if more > 0 else [])
