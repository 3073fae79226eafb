"""The CUDA rehearsal: a process where CUDA is reported present, for CPU boxes.

Why: the GPU job is the half of a suite that no CPU CI runs. Its collection, its ``cuda:N``
parametrization, its skips and its results file depend only on what ``torch.cuda`` *answers*
before the first real CUDA call, so a process where those answers are an H100's rehearses
all of it on a CPU box, and a defect there shows up on the next push instead of on the first
GPU.

What the fake answers (patched into ``torch.cuda`` as soon as torch imports it):
``is_available()`` True, ``torch.version.cuda`` :data:`CUDA_VERSION` (a CUDA build's),
``device_count()`` N (after ``CUDA_VISIBLE_DEVICES``, parsed as CUDA
does: indices into the N devices, stopping at the first invalid entry, ``GPU-<uuid>`` prefixes
accepted), ``is_initialized()`` False, and ``get_device_properties`` / ``get_device_name`` /
``get_device_capability`` with an H100 SXM's name, capability, memory and SM count (each
device has its own ``uuid``, ``GPU-<...>-<physical index>``, so a process can tell which
physical device it was given); ``get_rng_state`` / ``set_rng_state`` answer without CUDA
(Dynamo saves and restores CUDA's RNG state around every compile, CPU code's too: bookkeeping
that cannot fail on a GPU).

What it cannot answer: everything after. The first real CUDA call (``torch.cuda._lazy_init``,
which every CUDA tensor creation calls, also from C++) raises :class:`CudaRehearsalStop`,
"rehearsal: reached the first real CUDA call at file:line"; a ``BaseException``, so that no
``except Exception`` in the code under test swallows it. The pytest plugin reports a test that
got there as skipped with that reason. C++ entry points of a CPU build that do not go through
``_lazy_init`` (CUDA events, streams and generators, ``pin_memory``) fail with the CPU build's
own errors; :func:`reached_real_cuda` recognises those too.

How it reaches every process: :data:`ENV` (``PERF_REHEARSE_CUDA=N``) is inherited by
children, and :func:`activate` puts :data:`SITE_DIR` (a ``sitecustomize``) first on
``PYTHONPATH``, so any Python child (pytest's, a driver's) installs the fake at start-up,
before its own code runs. Installing does not import torch: a finder patches ``torch.cuda``
when torch imports it.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import os
import sys
import traceback
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

#: ``PERF_REHEARSE_CUDA=N``: report N CUDA devices (1-8) in this process and its children.
ENV = "PERF_REHEARSE_CUDA"
#: A folder with a ``sitecustomize.py`` that installs the fake from :data:`ENV`.
SITE_DIR = str(Path(__file__).with_name("rehearse_site"))
MAX_DEVICES = 8
STOP_PREFIX = "rehearsal: reached the first real CUDA call"
#: What a CPU build of torch raises at CUDA entry points that do not call ``_lazy_init``.
CPU_BUILD_ERRORS = (
    "Torch not compiled with CUDA enabled",
    "compiled without CUDA support",
    "Tried to instantiate dummy base class",
    "Cannot get CUDA generator without ATen_cuda",
    "Cannot access accelerator device when none is available",
    "has no attribute '_cuda",
)
_UUID = "GPU-5e4ea75e-ba0d-4c3e-9f1a-0000000000{:02d}"
#: ``torch.version.cuda`` of the rehearsed build (a CUDA build says so whatever devices it
#: sees; gpu.yml's CUDA check compares it with the pool's wheel variant, cu128).
CUDA_VERSION = "12.8"


class CudaRehearsalStop(BaseException):
    """The code under rehearsal reached a real CUDA call, which a CPU box cannot make."""


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` gives on an H100 SXM (torch 2.13's fields
    that perf and common test code read)."""

    name: str = "NVIDIA H100 80GB HBM3"
    major: int = 9
    minor: int = 0
    total_memory: int = 81_559 * 2**20
    multi_processor_count: int = 132
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    L2_cache_size: int = 50 * 2**20
    max_threads_per_multi_processor: int = 2048
    warp_size: int = 32
    uuid: str = ""
    pci_bus_id: int = 0


def parse_count(value: str | None) -> int:
    """The device count of a :data:`ENV` value; 0 when unset. ``ValueError`` says why."""
    if value is None or value.strip() == "":
        return 0
    v = value.strip()
    if not v.isdigit() or not 1 <= int(v) <= MAX_DEVICES:
        raise ValueError(
            f"{ENV}={value!r}: give the number of CUDA devices to report, 1 to {MAX_DEVICES}"
        )
    return int(v)


def visible(total: int, cuda_visible_devices: str | None) -> list[int]:
    """Physical indices of the ``total`` rehearsed devices a process sees, in its order, by
    the driver's rule (:func:`perf.core.devices.cuda_visible`)."""
    from perf.core.devices import cuda_visible

    return cuda_visible(cuda_visible_devices, [_UUID.format(i) for i in range(total)])


def properties(physical: int) -> DeviceProperties:
    return DeviceProperties(uuid=_UUID.format(physical), pci_bus_id=0x18 + physical)


def _site(frames: list[traceback.FrameSummary]) -> str:
    """``file:line`` of the innermost frame outside torch and this module (a file's first)."""
    here = os.path.normcase(__file__)
    torch_dir = os.sep + "torch" + os.sep
    ours = [
        fs
        for fs in frames
        if os.path.normcase(fs.filename) != here and torch_dir not in os.path.normcase(fs.filename)
    ]
    files = [fs for fs in ours if not fs.filename.startswith("<")] or ours
    return f"{files[-1].filename}:{files[-1].lineno}" if files else "?"


def stop_message(what: str) -> str:
    stack = traceback.extract_stack()[:-2]  # without this function and the fake's caller
    site = _site(stack)
    torch_dir = os.sep + "torch" + os.sep
    caller = stack[-1] if stack else None
    if caller is not None and torch_dir in caller.filename:  # a torch function made the call
        what += f" from torch/{caller.filename.rsplit(torch_dir, 1)[1]}:{caller.lineno}"
    return f"{STOP_PREFIX} at {site} ({what}); only a GPU runs past it"


#: how a child process's traceback names the stop (``python -m`` prints the class's module)
_CHILD_STOP = f"CudaRehearsalStop: {STOP_PREFIX}"


def reached_real_cuda(exc: BaseException) -> str | None:
    """The rehearsal's reason when ``exc`` (or its cause) means the code reached real CUDA."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        if isinstance(e, CudaRehearsalStop):
            return str(e)
        text = str(e)
        if _CHILD_STOP in text:  # a child process stopped there; its traceback is the message
            line = next(ln for ln in text.splitlines() if _CHILD_STOP in ln)
            return line[line.index(STOP_PREFIX) :] + " (in a child process)"
        if any(m in text for m in CPU_BUILD_ERRORS):
            site = _site(traceback.extract_tb(e.__traceback__))
            first = text.splitlines()[0] if text else type(e).__name__
            return f"{STOP_PREFIX} at {site}, which this CPU build of torch refused: {first}"
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def _patch(cuda: Any, n: int) -> None:
    """Replace ``torch.cuda``'s answers (idempotent; ``cuda`` is the module)."""
    if getattr(cuda, "_perf_rehearsal", None) == n:
        return
    original_lazy_init = getattr(cuda, "_perf_original_lazy_init", None) or cuda._lazy_init

    def seen() -> list[int]:
        return visible(n, os.environ.get("CUDA_VISIBLE_DEVICES"))

    def is_available() -> bool:
        return bool(seen())

    def device_count() -> int:
        return len(seen())

    def is_initialized() -> bool:
        return False

    def _lazy_init() -> None:
        if not seen():  # CUDA_VISIBLE_DEVICES hides every device: a CPU-only process
            original_lazy_init()
        raise CudaRehearsalStop(stop_message("torch.cuda._lazy_init"))

    def get_device_properties(device: Any = None) -> DeviceProperties:
        idx = _index(device)
        devs = seen()
        if not 0 <= idx < len(devs):
            raise AssertionError("Invalid device id")  # torch's own words
        return properties(devs[idx])

    def get_rng_state(device: Any = "cuda") -> Any:
        import torch

        return torch.zeros(16, dtype=torch.uint8)  # Philox: seed and offset, 8 bytes each

    def set_rng_state(new_state: Any, device: Any = "cuda") -> None:
        pass

    answers = {
        "_perf_original_lazy_init": original_lazy_init,
        "is_available": is_available,
        "device_count": device_count,
        "is_initialized": is_initialized,
        "_lazy_init": _lazy_init,
        "get_device_properties": get_device_properties,
        # Dynamo saves and restores CUDA's RNG state around every compile, also of CPU code:
        # bookkeeping that cannot fail on a GPU and that no CPU test observes.
        "get_rng_state": get_rng_state,
        "set_rng_state": set_rng_state,
    }
    cuda.__dict__.update(answers)
    version = sys.modules.get("torch.version")
    if version is not None and getattr(version, "cuda", None) is None:
        version.__dict__["cuda"] = CUDA_VERSION  # a CUDA build's, even with every GPU hidden
    # torch.cuda's submodules bound `_lazy_init` / `is_initialized` when they were imported.
    for name, mod in list(sys.modules.items()):
        stale = getattr(mod, "_lazy_init", None) is original_lazy_init
        if name.startswith("torch.cuda.") and stale:
            mod.__dict__["_lazy_init"] = _lazy_init
    cuda._perf_rehearsal = n


def _index(device: Any) -> int:
    """A device argument as torch.cuda takes it (None: the current one, 0 before init)."""
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    idx = getattr(device, "index", None)
    if idx is not None or hasattr(device, "type"):
        return int(idx or 0)
    text = str(device)
    return int(text.split(":", 1)[1]) if ":" in text else 0


class _PatchOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Patches ``torch.cuda`` right after torch imports it (installing imports no torch)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._loader: Any = None

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != "torch.cuda" or self._loader is not None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _patch(module, self.n)


def install(n: int) -> None:
    """Report ``n`` CUDA devices in this process from now on (before or after torch import)."""
    if n < 1:
        return
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None:
        _patch(cuda, n)
        return
    for f in sys.meta_path:
        if isinstance(f, _PatchOnImport):
            f.n = n
            return
    sys.meta_path.insert(0, _PatchOnImport(n))


def install_from_env(environ: MutableMapping[str, str] | None = None) -> int:
    """Install the fake if :data:`ENV` asks for it; the device count (0: not rehearsing)."""
    n = parse_count((os.environ if environ is None else environ).get(ENV))
    install(n)
    return n


def activate(n: int, environ: MutableMapping[str, str] | None = None) -> None:
    """Rehearse with ``n`` devices in this process and in every Python child it starts."""
    env = os.environ if environ is None else environ
    parse_count(str(n))
    env[ENV] = str(n)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
    env["PYTHONPATH"] = os.pathsep.join([SITE_DIR, *paths])
    if environ is None or environ is os.environ:
        install(n)


def active() -> int:
    """The device count this process rehearses with (0: a real process)."""
    cuda = sys.modules.get("torch.cuda")
    n = getattr(cuda, "_perf_rehearsal", None) if cuda is not None else None
    if n:
        return int(n)
    return next((f.n for f in sys.meta_path if isinstance(f, _PatchOnImport)), 0)
