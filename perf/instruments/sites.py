"""Where an event came from: the first frame of the user's code, outside torch and perf.

Syncs, graph breaks and leaked allocations are all reported by their site
(``"train.py:88"``, the function, the source line), so a failing count names the line to fix.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
from types import FrameType

import torch

#: perf's own folder (this file is perf/instruments/sites.py)
_PERF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Frames in these folders are torch's or perf's own, never the user's.
SKIP_DIRS = tuple(
    d + os.sep for d in (os.path.dirname(os.path.abspath(torch.__file__ or "")), _PERF_DIR) if d
)


def user_site(depth: int = 1) -> tuple[str, str, str]:
    """The first frame outside torch and perf: ``("path.py:88", function, source line)``.

    On a thread without user code (autograd runs a device's backward on a thread of its own)
    it is the user frame of the thread waiting for that backward: the ``loss.backward()``
    line."""
    f: FrameType | None = sys._getframe(depth)
    while f is not None and _not_users(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        f = _waiting_for_backward()
        if f is None:
            return "<unknown>", "", ""
    return frame_site(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)


def _waiting_for_backward() -> FrameType | None:
    """The user frame of another thread that waits in autograd's engine (``backward()``,
    ``torch.autograd.grad``), or None."""
    me = threading.get_ident()
    for tid, f in sys._current_frames().items():
        if tid == me:
            continue
        waiting = False
        g: FrameType | None = f
        while g is not None:
            if g.f_code.co_name == "_engine_run_backward":
                waiting = True
            elif waiting and not _not_users(g.f_code.co_filename):
                return g
            g = g.f_back
    return None


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
