"""Child processes the gate starts: they die with their parent and never outlive an
interrupted gate.

Why: a gate killed by CI (SIGTERM on a job timeout, SIGKILL after it) used to leave its
children running, writing into a temporary folder of a process that no longer existed.
Each child here asks the kernel to kill it when its parent dies (Linux ``PR_SET_PDEATHSIG``)
and runs in its own session, so a Ctrl-C in the terminal reaches only the parent, which then
stops the child itself and cleans up before reporting the interruption.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: SIGKILL when the parent dies (Linux); exit at once if the
    parent is already gone (it died between fork and this call)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def run(
    cmd: Sequence[str], *, cwd: str | os.PathLike[str], env: Mapping[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)`` whose child
    dies with this process, and is killed (and reaped) when this call ends by any exception,
    KeyboardInterrupt included. Raises ``subprocess.TimeoutExpired`` like ``run``."""
    parent = os.getpid()
    posix = os.name == "posix"  # Windows has neither sessions nor preexec_fn
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=posix,
        preexec_fn=(lambda: _die_with_parent(parent)) if posix else None,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        proc.kill()
        with contextlib.suppress(BaseException):
            proc.communicate(timeout=10)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interruption so that cleanup code runs."""


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While inside: SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) in the main
    thread instead of ending the process on the spot, so worktrees and children are removed
    by the ``finally`` blocks on the way out. A no-op outside the main thread."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
