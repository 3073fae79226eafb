"""Where an event came from: the first frame of the user's code, outside torch and perf.

Syncs, graph breaks and leaked allocations are all reported by their site
(``"train.py:88"``, the function, the source line), so a failing count names the line to fix.
"""

from __future__ import annotations

import linecache
import os
import sys
from types import FrameType

import torch

#: perf's own folder (this file is perf/instruments/sites.py)
_PERF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Frames in these folders are torch's or perf's own, never the user's.
SKIP_DIRS = tuple(
    d + os.sep for d in (os.path.dirname(os.path.abspath(torch.__file__ or "")), _PERF_DIR) if d
)


def user_site(depth: int = 1) -> tuple[str, str, str]:
    """The first frame outside torch and perf: ``("path.py:88", function, source line)``."""
    f: FrameType | None = sys._getframe(depth)
    while f is not None and _not_users(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return "<unknown>", "", ""
    return frame_site(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)


def _not_users(path: str) -> bool:
    # torch's and perf's files, code torch.fx generates (a compiled graph run op by op) and
    # the wrapper code Inductor writes into its cache folder (``.../torchinductor_<user>/``)
    return (
        path.startswith(SKIP_DIRS)
        or path.startswith("<eval_with_key>")
        or (os.sep + "torchinductor_" in path)
    )


def frame_site(path: str, line: int, function: str) -> tuple[str, str, str]:
    """``("path.py:88", function, source line)``, the path relative to the working directory
    where it is inside it."""
    try:
        rel = os.path.relpath(path)
        shown = path if rel.startswith("..") else rel
    except ValueError:  # another drive (Windows)
        shown = path
    return f"{shown}:{line}", function, linecache.getline(path, line).strip()
