"""One GPU per pytest-xdist worker, and timing locks per physical device.

Why: on a runner with N GPUs, ``pytest -n N`` with every worker seeing every GPU puts each
worker's tests on ``cuda:0``, and one session-wide timing lock makes N GPUs time one test at
a time. With a pool, worker ``gwK`` sees only GPU ``K mod N`` (``CUDA_VISIBLE_DEVICES``, an
index into any outer ``CUDA_VISIBLE_DEVICES``), chosen from ``PYTEST_XDIST_WORKER`` before any
conftest or test module can initialise CUDA (the driver reads the variable once, at its first
call; xdist sets ``PYTEST_XDIST_WORKER`` before the worker loads its plugins, while the
controller's ``workerinput`` only arrives after the conftests).

Counting the pool initialises nothing: the rehearsal's count, the outer
``CUDA_VISIBLE_DEVICES``, else NVML (``libnvidia-ml``, as ``torch.cuda.device_count`` does
before initialisation), else ``/proc/driver/nvidia/gpus``.

Timing locks (:class:`DeviceLocks`), one set per session: a ``perf_timing`` test on a CUDA
device holds that physical GPU's lock exclusively and the host lock shared, so timing tests on
different GPUs run at once and those on one GPU one at a time; a timing test on ``cpu`` /
``sim`` / an unknown device holds the host lock exclusively, so it runs alone among timing
tests (its clock is the host's, which every timing test loads). Locks are ``flock``s: the
kernel frees them when a worker dies. Where ``fcntl`` is missing (Windows) every timing test
takes the host lock exclusively (the one-at-a-time rule of a single session lock).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping

#: Set in a pinned worker: its GPU, as the entry of the outer ``CUDA_VISIBLE_DEVICES`` (or
#: the index) that it was given.
PINNED_ENV = "PERF_GPU_WORKER_DEVICE"


class PoolError(RuntimeError):
    """The GPU pool cannot be set up as asked."""


def _nvml_count() -> int | None:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if lib.nvmlInit_v2() != 0:
        return None
    try:
        n = ctypes.c_uint(0)
        return int(n.value) if lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0 else None
    finally:
        lib.nvmlShutdown()


def gpu_count() -> int:
    """GPUs on this machine, without initialising CUDA (0 where none is known)."""
    from perf.core import rehearse

    n = rehearse.active()
    if n:
        return n
    nvml = _nvml_count()
    if nvml is not None:
        return nvml
    return len(glob.glob("/proc/driver/nvidia/gpus/*"))


def pool(environ: Mapping[str, str]) -> list[str]:
    """The GPUs workers share: the outer ``CUDA_VISIBLE_DEVICES`` entries, else every GPU."""
    outer = environ.get("CUDA_VISIBLE_DEVICES")
    if outer is not None:
        return [e.strip() for e in outer.split(",") if e.strip()]
    return [str(i) for i in range(gpu_count())]


def worker_index(worker: str) -> int:
    """``gw3`` -> 3 (xdist's worker ids)."""
    digits = worker.removeprefix("gw")
    if not digits.isdigit():
        raise PoolError(f"cannot tell a worker number from PYTEST_XDIST_WORKER={worker!r}")
    return int(digits)


def pin_this_worker(environ: MutableMapping[str, str]) -> str | None:
    """In an xdist worker: set ``CUDA_VISIBLE_DEVICES`` to this worker's GPU; return it.
    None outside a worker, or where there is no GPU (nothing to share)."""
    worker = environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return None
    if environ.get(PINNED_ENV) is not None and environ.get(PINNED_ENV) == environ.get(
        "CUDA_VISIBLE_DEVICES"
    ):
        return environ[PINNED_ENV]  # a pytest started by a pinned worker: already done
    gpus = pool(environ)
    if not gpus:
        return None
    mine = gpus[worker_index(worker) % len(gpus)]
    environ["CUDA_VISIBLE_DEVICES"] = mine
    environ[PINNED_ENV] = mine
    return mine


def physical(device: str, environ: Mapping[str, str]) -> str | None:
    """The physical GPU behind ``cuda:K`` in this process (the pool's entry), None for
    anything that is not CUDA."""
    if not device.startswith("cuda"):
        return None
    k = int(device.split(":", 1)[1]) if ":" in device else 0
    pinned = environ.get(PINNED_ENV)
    if pinned is not None:
        return pinned
    outer = [e.strip() for e in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    if "CUDA_VISIBLE_DEVICES" in environ:
        return outer[k] if k < len(outer) else str(k)
    return str(k)


#: Lock files this thread holds now (flock is per open file: a nested hold in the same
#: thread must not reopen the file and wait on itself).
_THIS_THREAD = threading.local()


def held() -> set[str]:
    if not hasattr(_THIS_THREAD, "held"):
        _THIS_THREAD.held = set()
    return _THIS_THREAD.held


class DeviceLocks:
    """The session's timing locks: ``<base>.host`` and ``<base>.gpu-<id>`` files."""

    def __init__(self, base: str) -> None:
        self.base = base

    def path(self, name: str) -> str:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
        return f"{self.base}.{safe}"

    @contextlib.contextmanager
    def hold(self, gpu: str | None) -> Iterator[None]:
        """Hold what a timing test on ``gpu`` (a physical id; None: host clock) needs."""
        try:
            import fcntl
        except ImportError:  # Windows: one timing test at a time
            from filelock import FileLock

            with FileLock(self.path("host")):
                yield
            return
        order = [("host", fcntl.LOCK_EX if gpu is None else fcntl.LOCK_SH)]
        if gpu is not None:
            order.append((f"gpu-{gpu}", fcntl.LOCK_EX))
        fds: list[int] = []
        taken: list[str] = []
        try:
            for name, mode in order:  # one order everywhere: no deadlock
                path = self.path(name)
                if path in held():
                    # Held by this thread already (a timing test that runs an in-process
                    # pytest whose items take the same locks): a second open file would wait
                    # on the first one's flock forever.
                    continue
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                fds.append(fd)
                fcntl.flock(fd, mode)
                held().add(path)
                taken.append(path)
            yield
        finally:
            for path in taken:
                held().discard(path)
            for fd in reversed(fds):
                os.close(fd)  # closing releases the flock

    def files(self) -> list[str]:
        return glob.glob(glob.escape(self.base) + ".*")
