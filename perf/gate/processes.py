"""Child processes the gate starts: they die with their parent and never outlive an
interrupted gate.

Why: a gate killed by CI (SIGTERM on a job timeout, SIGKILL after it) used to leave its
children running, writing into a temporary folder of a process that no longer existed.
Each child here asks the kernel to kill it when its parent dies (Linux ``PR_SET_PDEATHSIG``)
and runs in its own session, so a Ctrl-C in the terminal reaches only the parent, which then
stops the child itself and cleans up before reporting the interruption.

Where it can (Linux, a ``python -m MODULE`` or ``python SCRIPT.py`` command of this
interpreter), a child is forked by a warm starter (:mod:`perf.gate.warm_start`) that has
torch imported already, instead of starting a fresh interpreter that imports it again: the
same command, folder, environment, streams, exit status and signals, less about 2 s of CPU a
child. ``PERF_WARM_START=0`` starts every child fresh.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

_PR_SET_PDEATHSIG = 1
#: ``0`` starts each of the gate's children as a fresh interpreter (no warm starter).
WARM_START_ENV = "PERF_WARM_START"
#: Variables a child reads after start-up only: children that differ in them share a starter.
_READ_AFTER_START = frozenset({"PERF_MEASURE_SCALE"})


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
    KeyboardInterrupt included. Raises ``subprocess.TimeoutExpired`` like ``run``. Forked by
    the warm starter where :func:`warm_startable` says so."""
    argv = warm_startable(cmd, env)
    if argv is not None:
        try:
            return _starter(env).run(list(cmd), argv, cwd=cwd, env=env, timeout_s=timeout_s)
        except NotStarted:  # the starter is gone (killed, out of memory): start this one fresh
            close_starters()
    return _run_fresh(cmd, cwd=cwd, env=env, timeout_s=timeout_s)


def warm_startable(cmd: Sequence[str], env: Mapping[str, str]) -> list[str] | None:
    """The interpreter's arguments (``["-m", MODULE, ...]`` or ``[SCRIPT, ...]``) when a fork
    of the warm starter runs ``cmd`` as a fresh interpreter would, else None: not Linux, not
    this interpreter, options before the module or script (``-X``, ``-W``: start-up), a
    relative ``PYTHONPATH`` entry, or ``PERF_WARM_START=0``."""
    if not sys.platform.startswith("linux") or env.get(WARM_START_ENV, "1") == "0":
        return None
    if len(cmd) < 2 or cmd[0] != sys.executable:
        return None
    if any(p and not os.path.isabs(p) for p in env.get("PYTHONPATH", "").split(os.pathsep)):
        return None
    if cmd[1] == "-m" and len(cmd) >= 3:
        return list(cmd[1:])
    if not cmd[1].startswith("-") and cmd[1].endswith(".py") and os.path.isabs(cmd[1]):
        return list(cmd[1:])
    return None


class NotStarted(Exception):
    """The warm starter did not fork the child (it is gone); nothing ran."""


class WarmStarter:
    """One :mod:`perf.gate.warm_start` process, started with one environment; it dies with
    this process, or when :meth:`close` hangs up."""

    def __init__(self, env: Mapping[str, str]) -> None:
        import socket

        from perf.gate import warm_start

        self.key = _key(env)
        ours, theirs = socket.socketpair()
        parent = os.getpid()
        with theirs:
            cmd = [sys.executable, warm_start.__file__, str(theirs.fileno()), str(parent)]
            if not _gpu_may_be_present(env):
                cmd.append("deep")
            self.proc = subprocess.Popen(
                cmd,
                pass_fds=[theirs.fileno()],
                cwd="/",
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.sock = ours
        self.reader = ours.makefile("rb")
        self.children_cpu_s = 0.0

    def _answer(self) -> dict[str, Any]:
        line = self.reader.readline()
        if not line:
            raise OSError(f"perf's warm starter (pid {self.proc.pid}) ended unexpectedly")
        return json.loads(line)

    def run(
        self,
        cmd: list[str],
        argv: list[str],
        *,
        cwd: str | os.PathLike[str],
        env: Mapping[str, str],
        timeout_s: float,
    ) -> subprocess.CompletedProcess[str]:
        import selectors
        import socket
        import time

        request = {"argv": argv, "cwd": os.path.abspath(cwd), "env": dict(env)}
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
        try:
            socket.send_fds(self.sock, [json.dumps(request).encode() + b"\n"], [out_w, err_w])
            os.close(out_w)
            os.close(err_w)
            answer = self._answer()
            if "error" in answer:
                raise OSError(answer["error"])
            pid = int(answer["pid"])
        except (OSError, ValueError, KeyError) as e:
            for fd in (out_r, err_r, out_w, err_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise NotStarted(str(e)) from e
        try:
            deadline = time.monotonic() + timeout_s
            with selectors.DefaultSelector() as sel:
                for fd in chunks:
                    sel.register(fd, selectors.EVENT_READ)
                while sel.get_map():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise subprocess.TimeoutExpired(cmd, timeout_s)
                    for key, _ in sel.select(left):
                        data = os.read(key.fd, 1 << 16)
                        if data:
                            chunks[key.fd].append(data)
                        else:
                            sel.unregister(key.fd)
            done = self._answer()
        except BaseException:
            for kill in (os.kill, os.killpg):  # the child, then its own session, if it made one
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGKILL)
            with contextlib.suppress(BaseException):
                self._count(float(self._answer().get("cpu_s", 0.0)))
            raise
        finally:
            os.close(out_r)
            os.close(err_r)
        self._count(float(done.get("cpu_s", 0.0)))
        return subprocess.CompletedProcess(
            cmd, int(done["status"]), _text(chunks[out_r]), _text(chunks[err_r])
        )

    def _count(self, cpu_s: float) -> None:
        from perf.core import contention

        self.children_cpu_s += cpu_s
        contention.count_descendant_cpu(cpu_s)

    def close(self) -> None:
        """Hang up and reap the starter (its children's CPU then arrives in our
        ``RUSAGE_CHILDREN``, so it stops being counted by hand)."""
        from perf.core import contention

        with contextlib.suppress(OSError):
            self.reader.close()
            self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        contention.count_descendant_cpu(-self.children_cpu_s)
        self.children_cpu_s = 0.0


def _gpu_may_be_present(env: Mapping[str, str]) -> bool:
    """Whether a child could see a GPU (then the starter preloads ``torch`` only)."""
    if env.get("CUDA_VISIBLE_DEVICES") == "" or env.get("HIP_VISIBLE_DEVICES") == "":
        return False
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg"))


def _text(chunks: list[bytes]) -> str:
    """As ``subprocess``'s ``text=True`` decodes: the locale's encoding, universal newlines."""
    import locale

    raw = b"".join(chunks).decode(locale.getpreferredencoding(False), errors="replace")
    return raw.replace("\r\n", "\n").replace("\r", "\n")


def _key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k not in _READ_AFTER_START))


_starters: list[WarmStarter] = []


def _starter(env: Mapping[str, str]) -> WarmStarter:
    """This process's warm starter for ``env``: one is kept (a new environment replaces it)."""
    key = _key(env)
    if _starters and _starters[0].key == key and _starters[0].proc.poll() is None:
        return _starters[0]
    close_starters()
    _starters.append(WarmStarter(env))
    return _starters[0]


@contextlib.contextmanager
def warm_starts() -> Iterator[None]:
    """Children started inside share a warm starter, which ends with the block."""
    try:
        yield
    finally:
        close_starters()


def close_starters() -> None:
    """End this process's warm starter, if any."""
    while _starters:
        _starters.pop().close()


atexit.register(close_starters)


def _run_fresh(
    cmd: Sequence[str], *, cwd: str | os.PathLike[str], env: Mapping[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
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
