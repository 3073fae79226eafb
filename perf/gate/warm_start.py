"""The warm starter: one process per gate that forks the gate's children, so that each child
starts with torch imported instead of importing it again (2 s of CPU or more each on a 2-core
CI runner; a stored gate or ``--perf-against`` run starts 2 to 40 children).

Run as a script, ``python /path/to/warm_start.py FD PARENT_PID [deep]``, by
:mod:`perf.gate.processes`, which talks to it over the socket ``FD``. Nothing of perf is
imported here: a child must import perf's plugin itself, after pytest, for pytest to rewrite
its asserts.

Why a fork is as good as a fresh process for a measurement: the starter is a fresh
interpreter, started with the child's environment, that has done nothing but import what the
previous child imported of torch and its heavy dependencies (:data:`PRELOAD_ROOTS`; the first
child starts bare), and every child, base or head, is forked from the same state. The
project's modules, pytest and perf are imported by each child, as in a fresh process; Python
reseeds ``random`` at a fork. What a fork cannot give a child (another interpreter start-up:
``PYTHONPATH``, ``-X`` options) the caller never asks for: it starts such a child fresh.

A child ends as multiprocessing's forked workers end: non-daemon threads joined, ``atexit``
handlers run, the standard streams flushed, then ``os._exit`` with the status a fresh
interpreter would exit with. It skips the interpreter's teardown (freeing every module of
torch: about 0.35 s of CPU a child on a 2-core runner, nearly half of what a forked child
costs); what only that teardown does (flushing a file object the code never closed) does not
happen.

Protocol, one request at a time: the caller sends a JSON request (``argv``, ``cwd``,
``env``) with the child's stdout and stderr as two file descriptors. The starter answers
``{"pid": N}`` once forked (``{"error": WHY}`` when it no longer forks), then
``{"status": S, "cpu_s": X}`` once the child ended (``S`` as ``subprocess`` gives it:
negative for a signal). Closing the socket ends the starter.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from typing import Any

#: The packages whose modules the starter imports once a child has imported them: heavy, and
#: never part of a project under test or of a pytest plugin whose asserts pytest rewrites.
#: Where a GPU may be present only ``torch`` itself (whose import never touches the CUDA
#: driver, as DataLoader's forked workers rely on): a module that asks the driver anything
#: would leave it initialised in the starter, and the CUDA driver does not survive a fork.
PRELOAD_ROOTS = ("torch", "torchgen", "functorch", "numpy", "sympy", "mpmath", "scipy")
_MAX_MSG = 1 << 22
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when ``parent`` dies (Linux); exit at once if it is gone."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _send(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def _preload(names: list[str], deep: bool) -> str | None:
    """Import what the last child imported of :data:`PRELOAD_ROOTS` (only ``torch`` unless
    ``deep``); why the starter can no longer fork safely, if an import started a Python
    thread or the CUDA runtime. (Native pools that handle a fork, such as OpenBLAS's, which
    ``numpy`` starts on import, are as in every forked DataLoader worker.)"""
    import importlib
    import threading

    for name in names if deep else [n for n in names if n == "torch"]:
        if name.split(".")[0] in PRELOAD_ROOTS and name not in sys.modules:
            with contextlib.suppress(BaseException):  # the next child imports it itself
                importlib.import_module(name)
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads after preloading"
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and cuda.is_initialized():
        return "CUDA was initialised while preloading"
    return None


def _serve(sock: socket.socket, deep: bool) -> tuple[dict[str, Any], list[int], int] | None:
    """Fork a child per request; return in the child (its request, its two descriptors and the
    write end of its report pipe), return None in the starter when the caller hangs up."""
    # A sitecustomize run at start-up (perf's simulated device, a coverage hook) may have
    # started a thread: then no child is forked from here.
    broken = _preload([], deep)
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MSG, 2)
        except OSError:
            return None
        if not msg:
            return None
        # A request is one line; recv_fds read at most its first part with the descriptors.
        while not msg.endswith(b"\n"):
            more = sock.recv(_MAX_MSG)
            if not more:
                return None
            msg += more
        request = json.loads(msg)
        if broken is not None:
            for fd in fds:
                os.close(fd)
            _send(sock, {"error": broken})
            continue
        report_r, report_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            sock.close()
            os.close(report_r)
            return request, fds, report_w
        os.close(report_w)
        for fd in fds:
            os.close(fd)
        _send(sock, {"pid": pid})
        _, status, usage = os.wait4(pid, 0)
        with os.fdopen(report_r, "rb") as fh:
            imported = fh.read().decode(errors="replace").split()[:20000]
        _send(
            sock,
            {
                "status": os.waitstatus_to_exitcode(status),
                "cpu_s": usage.ru_utime + usage.ru_stime,
            },
        )
        broken = _preload(imported, deep)  # the next child finds them imported


def _become(request: dict[str, Any], fds: list[int], report_w: int) -> None:
    """In the child: take the request's streams, folder, environment and arguments, then run
    its module or script as ``__main__`` the way the interpreter would."""
    import atexit
    import runpy

    os.setsid()  # as the gate's fresh children: a terminal's Ctrl-C reaches the gate only
    _die_with_parent(os.getppid())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in (null, *fds):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])

    def report() -> None:
        names = [n for n in list(sys.modules) if n.split(".")[0] in PRELOAD_ROOTS]
        with os.fdopen(report_w, "wb") as fh:
            fh.write(" ".join(names).encode())

    atexit.register(report)
    argv: list[str] = request["argv"]
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.realpath(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        _end(_exit_status(e.code))
    except BaseException as e:
        _print_uncaught(e)
        # an uncaught KeyboardInterrupt ends the interpreter by the signal, as it was sent
        _end(-signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1)
    _end(0)


def _print_uncaught(e: BaseException) -> None:
    """The traceback a fresh interpreter prints: from the child's own code on, without this
    module's and runpy's frames."""
    import runpy

    ours = {__file__, runpy.__file__, "<frozen runpy>"}
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    with contextlib.suppress(BaseException):
        sys.excepthook(type(e), e.with_traceback(tb), tb)  # the hook prints e's own


def _exit_status(code: object) -> int:
    """The status ``sys.exit(code)`` gives a fresh interpreter (a message: printed, 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _end(status: int) -> None:
    """End the child as a fresh interpreter would, less the teardown (module docstring):
    ``status`` < 0 ends it by that signal."""
    import atexit
    import threading

    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(BaseException):
            if stream is not None:
                stream.flush()
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)


def main() -> None:
    _die_with_parent(int(sys.argv[2]))
    sock = socket.socket(fileno=int(sys.argv[1]))
    served = _serve(sock, deep=sys.argv[3:4] == ["deep"])
    if served is None:
        return
    _become(*served)


if __name__ == "__main__":
    main()
