"""A simulated accelerator: a device of its own type whose tensors live in host memory.

Why: on a CPU-only box nothing tells a host tensor from a would-be device tensor, so a sync
counter either counts host work as syncs (clipping, samplers, host loss buffers: 10x-100x too
many on real code) or counts nothing. ``simulated_device()`` installs a real torch device,
``sim``, so training code written for a GPU (``model.to(dev)``, ``x.to(dev, non_blocking=True)``,
``torch.randn(..., device=dev)``, ``x.pin_memory()``, ``loss.item()``, ``torch.autocast(dev.type)``,
``torch.amp.GradScaler(dev.type)``) runs unchanged, computes with the CPU kernels, and every
tensor knows whether it lives on the device or on the host. ``perf.count_syncs`` and
``perf.count_transfers`` then count on ``sim`` what the same code causes on ``cuda:0``.

How (what it relies on):

- PyTorch's Python backend for the ``PrivateUse1`` dispatch key
  (``torch.utils.backend_registration._setup_privateuseone_for_python_backend``, the
  ``torch._C._acc`` hooks and ``torch._C._acc.create_empty_tensor``; see PyTorch's
  ``test/test_privateuseone_python_backend.py``). These are experimental PyTorch APIs: tested on
  torch 2.13.0; where they are missing ``simulated_device()`` raises and says so.
- Sim tensors are plain ``torch.Tensor`` objects (so optimizers pick ``foreach`` by default as
  on CUDA, and ``nn.Parameter`` stays ``Parameter``). Their own storage is empty; the storage's
  Python object carries the host ``UntypedStorage`` that holds the data. Sizes, strides and
  offset of a sim tensor equal those of its host view, set through the ``Meta`` kernel of
  ``set_`` (which checks no bounds).
- One Python fallback kernel for ``PrivateUse1`` runs every op on host views and wraps the
  outputs; in-place and ``out=`` results are the caller's own tensors, views share host storage.
- ``pin_memory()`` / ``is_pinned()`` of host tensors are re-implemented for the ``CPU`` key: a
  pinned tensor is a host copy whose storage is marked pinned (there is no page-locking).
- Autocast on ``sim`` uses CUDA's cast policy (lists below, from ``autocast_mode.cpp``).
- ``Module.to`` / ``Module.cpu`` swap parameters (``torch.__future__``'s swap mode) for moves to
  or from ``sim`` only, so ``module.to(sim)`` keeps the Parameter objects (and tied weights) as
  ``module.to("cuda")`` does.

The caching allocator is a model (:mod:`perf.sim.memory`, :mod:`perf.sim.allocator`).
What it does not model: time (every op costs what the CPU kernel costs), streams and events
(all work is synchronous), random numbers (sim ops draw from the CPU generator), kernels that
exist only on CUDA (fused optimizers, flash attention). Several devices
(``simulated_device(count=N)``, ``PERF_SIM_DEVICES``) share the host's memory and time; each has
its own allocator model.
Use it in a process without another accelerator: once installed, ``sim`` is the process's
current accelerator and ``PrivateUse1`` cannot be renamed again.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import threading
import time
import warnings
import weakref
from collections import Counter
from typing import Any, ClassVar

import torch

import perf.sim.memory as _memory
import perf.sim.memory_api as _memory_api
import perf.sim.native as _native
import perf.sim.tensors as _tensors
from perf.sim import ordinals
from perf.sim.accelerator import (
    DeviceContext,
    SimEvent,
    SimStream,
    SimStreamContext,
    install_accelerator,
    sim_current_stream,
    sim_device_name,
    sim_stream,
)
from perf.sim.amp import ENV as AS_CUDA_ENV
from perf.sim.amp import requested as _as_cuda_requested
from perf.sim.amp import stand_in_for_cuda
from perf.sim.autocast import register_autocast
from perf.sim.comm import install as install_comm
from perf.sim.compile import install as _install_compile
from perf.sim.cuda_names import patch as _cuda_names
from perf.sim.cuda_ops import register_cuda_ops
from perf.sim.distributed import COLLECTIVES_ENV, register_backend, report_at_exit
from perf.sim.kernels import (
    after_op,
    conv,
    conv_backward,
    cpu_is_pinned,
    cpu_pin_memory,
    efficient_zero_tensor,
    fallback_kernel,
    python_key,
    register_math_bits,
    register_native,
    register_sparse,
    register_structured,
    register_views,
    sim_is_pinned,
    to_copy_kernel,
)
from perf.sim.memory_api import MemoryAPI, patch_accelerator
from perf.sim.paths import follow_python_branches, patch_setitem
from perf.sim.rnn import patch_flatten_parameters, register_rnn, reseeded
from perf.sim.storage import register_storage
from perf.sim.tensors import NAME

__all__ = [
    "SITE_DIR",
    "SimulatedDeviceError",
    "install_from_env",
    "is_launcher",
    "launch_env",
    "simulated_device",
    "unavailable_reason",
]

#: the folder whose ``sitecustomize.py`` installs ``sim`` in every Python process started with
#: it on ``PYTHONPATH`` (:func:`launch_env`)
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")

_lock = threading.Lock()
_libs: list[Any] = []
_device: torch.device | None = None
#: Why the installed device cannot be used (set once, by ``_check_autograd``).
_unusable: str | None = None


class SimulatedDeviceError(RuntimeError):
    """The simulated device cannot be installed in this process."""


class NativeBuildWarning(RuntimeWarning):
    """``sim``'s C++ path did not build: the Python path runs (same figures, slower on loops
    of small ops). ``PERF_SIM_NATIVE=0`` chooses it without trying."""


# --------------------------------------------------------------------------------------------
# the backend module (torch.sim) and installation


class _SimModule(MemoryAPI):
    """``torch.sim``: what torch asks of a backend module (one device, always ready), and
    ``torch.cuda``'s memory functions answered by the allocator model."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        """As ``torch.cuda.is_initialized()``: False until the first tensor on the device."""
        return _tensors.initialized

    @staticmethod
    def device_count() -> int:
        return ordinals.count

    @staticmethod
    def current_device() -> int:
        return ordinals.current()

    @staticmethod
    def set_device(device: Any) -> None:
        ordinals.set_current(ordinals.index_of(device))

    @staticmethod
    def synchronize(device: Any = None) -> None:
        pass  # all simulated work is synchronous

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed(seed: int) -> None:
        # sim ops draw from the CPU generator; a reseed makes cuDNN's RNN dropout state anew,
        # as CUDA's generator does (reset_rnn_state): the current device's only
        reseeded(ordinals.current())

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        reseeded()

    device = DeviceContext
    stream = staticmethod(sim_stream)
    current_stream = staticmethod(sim_current_stream)
    get_device_name = staticmethod(sim_device_name)
    Stream = SimStream
    Event = SimEvent

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    @staticmethod
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return True

    # What device-agnostic code asks of ``torch.get_device_module(dev)`` beyond the above
    # (torchtitan's memory monitor reads ``get_device_properties(i).total_memory``). Not here:
    # ``get_rng_state`` / ``set_rng_state``. sim ops draw from the CPU generator, whose state is
    # not CUDA's Philox seed and offset, and DTensor's RNG tracker, which takes over random ops
    # on any device module that has ``set_rng_state``, reads the state as those 16 bytes (it
    # failed in torchtitan's weight init with it).

    @staticmethod
    def get_device_properties(device: Any = None) -> SimDeviceProperties:
        if device is not None:
            ordinals.index_of(device)  # CUDA's "invalid device ordinal" past the devices
        return SimDeviceProperties(total_memory=_memory_api.total_memory())

    @classmethod
    def get_device_capability(cls, device: Any = None) -> tuple[int, int]:
        """CUDA's compute capability of the GPU whose code paths ``sim`` takes (sm90)."""
        props = cls.get_device_properties(device)
        return (props.major, props.minor)

    @staticmethod
    def get_arch_list() -> list[str]:
        return ["sm_90"]

    # sim ops draw from the CPU generator: seeding the device seeds it
    @staticmethod
    def seed() -> None:
        torch.seed()
        reseeded(ordinals.current())

    @staticmethod
    def seed_all() -> None:
        torch.seed()
        reseeded()

    @staticmethod
    def initial_seed() -> int:
        return torch.initial_seed()

    @staticmethod
    def default_stream(device: Any = None) -> torch.Stream:
        return sim_current_stream(device)  # one stream

    @staticmethod
    def set_stream(stream: Any) -> None:
        pass  # one stream

    StreamContext = SimStreamContext

    @staticmethod
    def init() -> None:
        pass

    @staticmethod
    def ipc_collect() -> None:
        pass


@dataclasses.dataclass(frozen=True)
class SimDeviceProperties:
    """``torch.sim.get_device_properties()``: the GPU whose code paths ``sim`` takes (CUDA's
    sm90 branches: compute capability 9.0; an H100 SXM's 132 multiprocessors, 50 MiB of L2),
    with the memory the allocator model reports (``mem_get_info``: its capacity, else 80 GiB).
    No hardware is measured: these are the answers CUDA code branches on."""

    name: str = "perf simulated accelerator (host memory, CPU kernels)"
    major: ClassVar[int] = 9
    minor: ClassVar[int] = 0
    total_memory: int = 80 * (1 << 30)
    multi_processor_count: int = 132
    warp_size: int = 32
    max_threads_per_multi_processor: int = 2048
    L2_cache_size: int = 50 * (1 << 20)
    is_integrated: bool = False
    is_multi_gpu_board: bool = False


def _keep_parameters_on_move() -> None:
    """``module.to(cuda)`` keeps each Parameter object (``param.data = moved``); for PrivateUse1
    devices PyTorch makes new ones, which unties weights tied before the move (nanoGPT's
    wte / lm_head) and leaves optimizers made before it holding stale parameters. For moves to
    or from ``sim`` only, ``Module.to`` / ``Module.cpu`` swap instead (PyTorch's
    ``torch.__future__.set_swap_module_params_on_conversion``), which keeps them. (A module with
    an RNN kept PyTorch's path until found on sb3-contrib's RecurrentPPO, whose optimizer,
    made before the move, then trained nothing: every parameter of the policy was replaced.)"""
    module = torch.nn.Module
    plain_to, plain_cpu = module.to, module.cpu

    def involves_sim(m: torch.nn.Module, target: Any) -> bool:
        tensors = (*m.parameters(), *m.buffers())
        # An RNN module holds a weak reference to each of its weights (_flat_weight_refs) and
        # drops them in its _apply, before the swap: those do not count.
        rnn_refs = Counter(
            id(w)
            for sub in m.modules()
            if isinstance(sub, torch.nn.RNNBase)
            for w in sub._flat_weights
            if w is not None
        )
        if any(weakref.getweakrefcount(t) > rnn_refs[id(t)] for t in tensors):
            return False  # swapping refuses weakly referenced tensors: PyTorch's default path
        if target is not None and torch.device(target).type == NAME:
            return True
        return any(t.device.type == NAME for t in tensors)

    def swapping(call: Any, m: torch.nn.Module, target: Any, *args: Any, **kwargs: Any) -> Any:
        fut = torch.__future__
        if fut.get_swap_module_params_on_conversion() or not involves_sim(m, target):
            return call(m, *args, **kwargs)
        fut.set_swap_module_params_on_conversion(True)
        try:
            return call(m, *args, **kwargs)
        finally:
            fut.set_swap_module_params_on_conversion(False)

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        target = torch._C._nn._parse_to(*args, **kwargs)[0]
        return swapping(plain_to, self, target, *args, **kwargs)

    def cpu(self: torch.nn.Module) -> Any:
        return swapping(plain_cpu, self, None)

    to.__doc__, cpu.__doc__ = plain_to.__doc__, plain_cpu.__doc__
    module.to, module.cpu = to, cpu  # type: ignore[method-assign]


#: Hugging Face accelerate's (and transformers') device override: :func:`launch_env` sets it
ACCELERATE_ENV = "ACCELERATE_TORCH_DEVICE"


def launch_env(count: int, environ: dict[str, str], *, as_cuda: bool = False) -> dict[str, str]:
    """``environ`` for a command whose Python processes (a ``torchrun`` launcher and each of
    its ranks) all run on ``count`` simulated devices, unmodified: ``PERF_SIM_DEVICES`` and
    :data:`SITE_DIR` first on ``PYTHONPATH``. CUDA is hidden (``CUDA_VISIBLE_DEVICES=""``):
    ``sim`` stands in for it and refuses a process that has it. ``as_cuda``: also
    ``PERF_SIM_AS_CUDA=1``, for scripts that name CUDA's AMP, device functions and NCCL.

    ``ACCELERATE_TORCH_DEVICE=sim`` too, unless set: Hugging Face's ``accelerate`` and
    ``transformers.TrainingArguments`` pick their device from a fixed list (CUDA, MPS, XPU,
    ...) and else the CPU, so a ``Trainer`` script would train on the CPU, silently; this
    variable is the device both take instead (accelerate's ``PartialState``)."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"the number of simulated devices must be >= 1, got {count!r}")
    env = dict(environ)
    env[ordinals.ENV] = str(count)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault(ACCELERATE_ENV, NAME)
    if as_cuda:
        env[AS_CUDA_ENV] = "1"
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
    env["PYTHONPATH"] = os.pathsep.join([SITE_DIR, *paths])
    return env


#: how launchers start (``torchrun``, ``python -m torch.distributed.run``): they start the
#: ranks and run no model, so the launcher's ``sitecustomize`` does not install ``sim`` there
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def is_launcher(argv: list[str]) -> bool:
    args = argv[1:3]
    return any(os.path.basename(a) in _LAUNCHERS for a in args)


def install_from_env() -> torch.device | None:
    """Install ``sim`` where ``PERF_SIM_DEVICES`` is set (the launcher's ``sitecustomize``),
    except in a launcher process; with ``PERF_SIM_COLLECTIVES=DIR`` also write this process's
    collective counts there at exit (:func:`perf.sim.distributed.report_at_exit`)."""
    if not os.environ.get(ordinals.ENV, "").strip():
        return None
    if is_launcher(list(getattr(sys, "orig_argv", []))):
        return None
    dev = simulated_device()
    out = os.environ.get(COLLECTIVES_ENV, "").strip()
    if out:
        report_at_exit(out)
    return dev


def _backward_on_calling_thread() -> None:
    """With several devices, run backward passes on the thread that calls them.

    Why: autograd sizes its per-device queues by the device guard's ``deviceCount()``, which
    a Python backend cannot answer (it is 1), so a backward through ``sim:1`` fails an
    internal assert (``device_ready_queues_``). With multithreading off for the call
    (``torch.autograd.set_multithreading_enabled(False)``), the engine runs every node from
    its CPU ready queue on the caller's thread: the same nodes, hooks and order (DDP's reducer
    hooks included), without CUDA's per-device threads, which ``sim`` does not model.
    """
    graph = torch.autograd.graph
    plain = graph._engine_run_backward

    def run_backward(*args: Any, **kwargs: Any) -> Any:
        with torch.autograd.set_multithreading_enabled(False):
            return plain(*args, **kwargs)

    graph._engine_run_backward = run_backward
    torch.autograd._engine_run_backward = run_backward


def _to_the_current_device() -> None:
    """With several devices, ``tensor.to("sim")`` goes to the current device, as
    ``tensor.to("cuda")`` does.

    Why: ``Tensor.to`` fills in a missing device index from the device guard before it
    dispatches, and a Python backend's guard always answers 0, so ``x.to("sim")`` on rank 1
    landed on ``sim:0`` (DTensor's ``distribute_tensor`` and FSDP2 checkpoint loading call
    exactly that). A bare ``sim`` device is given its index here, before ``Tensor.to``; a
    positional ``copy`` argument after a bare device string is not supported (keywords are).
    """
    plain = torch.Tensor.to
    parse = torch._C._nn._parse_to

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        copy = kwargs.get("copy", False)
        try:
            device, dtype, non_blocking, memory_format = parse(
                *args, **{k: v for k, v in kwargs.items() if k != "copy"}
            )
        except (RuntimeError, TypeError):  # a positional copy: Tensor.to's own parsing
            return plain(self, *args, **kwargs)
        if device is None or device.type != NAME or device.index is not None:
            return plain(self, *args, **kwargs)
        return plain(
            self,
            device=torch.device(NAME, ordinals.current()),
            dtype=dtype,
            non_blocking=non_blocking,
            copy=copy,
            memory_format=memory_format if memory_format is not None else torch.preserve_format,
        )

    to.__doc__ = plain.__doc__
    torch.Tensor.to = to  # type: ignore[method-assign,assignment]


def _real_accelerator() -> str | None:
    """``cuda`` or ``mps`` where this process has one (answered as torch answers it, so the
    CUDA rehearsal's answers count too), else None."""
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return None


def _accelerator_refusal(acc: str) -> str:
    hide = "hide the GPUs: CUDA_VISIBLE_DEVICES= python ...; " if acc == "cuda" else ""
    return (
        f"this process has {acc.upper() if acc == 'cuda' else acc}: count syncs on {acc} "
        f"directly; the simulated device is for CPU-only processes ({hide}to compare both, run "
        "the simulated side in another process, as tests/benchmarks/test_sim_parity.py does)"
    )


def unavailable_reason(*, allow_with_accelerator: bool = False) -> str | None:
    """Why ``simulated_device()`` would fail in this process, or None: the one list of
    reasons, which ``simulated_device()`` raises and skips (``perf.sim.unavailable_reason()``,
    ``perf.core.devices.sim_unavailable_reason``) give."""
    if _unusable is not None:
        return _unusable
    if _device is not None:
        return None
    acc = None if allow_with_accelerator else _real_accelerator()
    if acc is not None:
        return _accelerator_refusal(acc)
    missing = _requirements_missing()
    if missing is not None:
        return f"torch {torch.__version__} lacks {missing}"
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", NAME):
        return f"the PrivateUse1 backend slot already belongs to {current!r}"
    return None


def _requirements_missing() -> str | None:
    acc = getattr(torch._C, "_acc", None)
    if acc is None or not hasattr(acc, "create_empty_tensor"):
        return "torch._C._acc.create_empty_tensor (the Python PrivateUse1 backend hooks)"
    try:
        from torch.utils.backend_registration import (  # noqa: F401
            _setup_privateuseone_for_python_backend,
        )
    except ImportError:
        return "torch.utils.backend_registration._setup_privateuseone_for_python_backend"
    if not hasattr(torch.library.Library, "fallback"):
        return "torch.library.Library.fallback"
    return None


def simulated_device(
    *, count: int | None = None, allow_with_accelerator: bool = False, as_cuda: bool = False
) -> torch.device:
    """The simulated accelerator ``sim:0``, installed into this process on first call.

    ``count`` devices ``sim:0`` ... ``sim:{count-1}`` (default: the environment variable
    ``PERF_SIM_DEVICES``, else 1), with CUDA's semantics (:mod:`perf.sim.ordinals`). The count
    is fixed at installation: asking for another one later raises.

    ``as_cuda=True`` (or ``PERF_SIM_AS_CUDA=1``): ``sim`` stands in for CUDA, so CUDA-named
    AMP (``torch.cuda.amp.GradScaler()``, ``torch.autocast("cuda")``) acts on it
    (:mod:`perf.sim.amp`), and so do ``torch.cuda.set_device`` / ``current_device`` /
    ``device_count`` and ``init_process_group("nccl")`` (:mod:`perf.sim.cuda_names`).

    Raises ``SimulatedDeviceError`` naming the reason where it cannot work (the reasons of
    :func:`unavailable_reason`): this torch lacks the Python backend hooks, ``PrivateUse1``
    already belongs to another backend, or the process has a real accelerator, CUDA or MPS
    (``sim`` would become its current accelerator and take over ``pin_memory()``; pass
    ``allow_with_accelerator=True`` to install it anyway, untested).
    """
    global _device
    if _as_cuda_requested(as_cuda):
        stand_in_for_cuda()
        _cuda_names()
    with _lock:
        if _unusable is not None:
            raise SimulatedDeviceError(_unusable)
        if _device is not None:
            if count is not None and count != ordinals.count:
                raise SimulatedDeviceError(
                    f"the simulated device is installed with {ordinals.count} device(s); "
                    f"count={count} cannot change that in this process (set "
                    f"{ordinals.ENV}={count} or call perf.simulated_device(count={count}) "
                    "before anything else installs it)"
                )
            return _device
        if count is not None and (not isinstance(count, int) or count < 1):
            raise SimulatedDeviceError(
                f"simulated_device(count={count!r}): the number of devices must be an int >= 1"
            )
        try:
            n = count if count is not None else ordinals.count_from_env()
        except ValueError as e:
            raise SimulatedDeviceError(str(e)) from None
        acc = None if allow_with_accelerator else _real_accelerator()
        if acc is not None:
            raise SimulatedDeviceError(_accelerator_refusal(acc))
        missing = _requirements_missing()
        if missing is not None:
            raise SimulatedDeviceError(
                f"perf's simulated device needs {missing}, which torch {torch.__version__} "
                "does not have (tested: torch 2.13.0); count syncs on a real device instead"
            )
        current = torch._C._get_privateuse1_backend_name()
        if current != "privateuseone" and current != NAME:
            raise SimulatedDeviceError(
                f"perf's simulated device needs the PrivateUse1 backend slot, but this process "
                f"already registered backend {current!r} there; use the simulated device in a "
                "process without it"
            )
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        nat = None
        try:
            native_mode = _native.mode()
            if native_mode != "off":
                nat = _native.activate()
        except ValueError as e:
            raise SimulatedDeviceError(str(e)) from None
        except _native.NativeBuildError as e:
            if native_mode == "on":
                raise SimulatedDeviceError(str(e)) from None
            warnings.warn(
                f"{e} Running sim's Python path instead.", NativeBuildWarning, stacklevel=2
            )
        _tensors.native = nat
        ordinals.count = n
        if current != NAME:
            _setup_privateuseone_for_python_backend(NAME, backend_module=_SimModule())
        _tensors.register_devices(n)
        fb = torch.library.Library("_", "IMPL")
        # With the C++ path the Python fallback sits at PrivateUse2, reached by redispatch
        # from the C++ one for what it does not take (perf.sim.native).
        fb.fallback(fallback_kernel, python_key())
        # Ops without an autocast rule pass through, as for AutocastCUDA.
        fb.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("is_pinned", cpu_is_pinned, "CPU")
        lib.impl("_pin_memory", cpu_pin_memory, "CPU")
        lib.impl("is_pinned", sim_is_pinned, "PrivateUse1")
        # with the C++ path, its kernel takes _to_copy on the device and hands copies across
        # host and device to this one, at PrivateUse2 (perf.sim.native)
        lib.impl("_to_copy", to_copy_kernel, python_key())
        lib.impl("_efficientzerotensor", efficient_zero_tensor, "PrivateUse1")
        lib.impl("convolution_overrideable", conv, "PrivateUse1")
        lib.impl("convolution_backward_overrideable", conv_backward, "PrivateUse1")
        register_autocast(lib)
        register_storage(lib)
        register_structured(lib)
        register_views(lib)
        register_sparse(fb, lib)
        register_math_bits(lib)
        register_cuda_ops(lib, after_op)
        register_rnn(lib)  # cuDNN's RNN path (perf.sim.rnn)
        _libs.extend([fb, lib])
        if nat is not None:
            nat.install()
            register_native()
            nat.set_devices(n)
            ordinals.native_current = nat.set_current
        _keep_parameters_on_move()
        patch_setitem()  # x[i] = 5 as on CUDA (perf.sim.paths)
        follow_python_branches()  # torch's Python tests of the device type (perf.sim.paths)
        patch_flatten_parameters()  # RNN weights in one buffer, as on CUDA (perf.sim.rnn)
        if n > 1:
            _backward_on_calling_thread()
            _to_the_current_device()
        register_backend()  # torch.distributed's "sim" backend (perf.sim.distributed)
        install_comm()  # nn.DataParallel's CUDA-build primitives (perf.sim.comm)
        _install_compile()  # torch.compile's default backend runs sim graphs (perf.sim.compile)
        _memory.install()
        patch_accelerator(_memory.clear_cast_cache)
        install_accelerator()
        _device = torch.device(NAME, 0)
        _check_autograd(_device)
        atexit.register(_wait_for_autograd_threads)
        _memory.reset()  # the check's tensors are perf's, not the program's
        _tensors.initialized = False  # and so is the check's lazy initialisation
        return _device


def _autograd_threads_state(tasks: str = "/proc/self/task") -> tuple[tuple[str, int], ...] | None:
    """(state, CPU time in ns) of each of autograd's device threads (``pt_autograd_N``);
    None where ``/proc`` cannot say (not Linux)."""
    out = []
    try:
        for tid in sorted(os.listdir(tasks)):
            with open(f"{tasks}/{tid}/comm") as fh:
                if not fh.read().startswith("pt_autograd_"):
                    continue
            with open(f"{tasks}/{tid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            with open(f"{tasks}/{tid}/schedstat") as fh:
                out.append((state, int(fh.read().split()[0])))
    except (OSError, IndexError, ValueError):
        return None
    return tuple(out)


def _wait_for_autograd_threads(limit_s: float = 2.0, poll_s: float = 0.002) -> None:
    """At exit: let autograd's device threads finish before the interpreter shuts down.

    Why: as on CUDA, ``sim``'s backward runs on autograd's device thread, which goes on
    releasing the step's tensors (its graph task, its gradients) *after* ``backward()`` has
    returned. On ``sim`` those releases call Python (a tensor's Python object, the memory
    model's free of a sim storage), so the thread takes the GIL; a program that ends right
    after a backward can shut the interpreter down first, and a thread that asks for the GIL
    during finalization is ended by ``pthread_exit``, which aborts the process from inside a
    C++ destructor ("terminate called without an active exception", exit status -6; measured:
    about 1 run in 20 of a four-line script, 3 in 40 of a docs example with a CPU neighbour).

    Waits, with the GIL released, until every device thread sleeps (its queue) and has used no
    CPU over two polls: a thread that still has work or wants the GIL shows progress or runs.
    Bounded (``limit_s``); a no-op where ``/proc`` is not there.
    """
    prev = _autograd_threads_state()
    if not prev:
        return
    deadline = time.monotonic() + limit_s
    quiet = 0
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(poll_s)
        cur = _autograd_threads_state()
        if cur is None:
            return
        quiet = quiet + 1 if cur == prev and all(st == "S" for st, _ in cur) else 0
        prev = cur


def _check_autograd(device: torch.device) -> None:
    """One tiny backward on the new device. The autograd engine sizes its per-device queues
    once, at the first backward of the process: a device installed after that cannot run
    backward at all (an internal assert in torch), so say so here, once, clearly."""
    global _unusable
    x = torch.ones(1, device=device, requires_grad=True)
    try:
        (x * 2).sum().backward()
    except RuntimeError as e:
        if "device_ready_queues_" not in str(e):
            raise
        _unusable = (
            "the simulated device was installed after this process's first backward pass, and "
            "autograd fixes its devices at that moment: call perf.simulated_device() before "
            "any backward (e.g. at import time of your conftest.py); the pytest plugin does "
            "this itself for --perf-devices"
        )
        raise SimulatedDeviceError(_unusable) from None
