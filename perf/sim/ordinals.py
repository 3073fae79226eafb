"""Device ordinals of ``sim``: how many devices there are (``sim:0`` ... ``sim:N-1``), which
one is current, and plain sim tensors that live on ``sim:i`` for ``i > 0``.

Why: multi-GPU code (DDP's ``torch.cuda.set_device(rank)``, ``model.to(f"cuda:{rank}")``,
``.to(1)``) must run on a CPU-only box with CUDA's semantics: each tensor knows its device
index, ops keep it, a cross-device op without a copy fails, and an index past N is CUDA's
"invalid device ordinal" instead of silently landing on ``sim:0``.

How: PyTorch's Python backend makes every tensor on device index 0
(``torch._C._acc.create_empty_tensor`` hard-codes ``Device(PrivateUse1, 0)``), and ``set_``
refuses to move a tensor to a storage of another device. A tensor on ``sim:i`` starts as a
Meta-level ``alias`` of a seed tensor made once per index through DLPack (``kDLExtDev`` is
PyTorch's ``PrivateUse1``; a 0-element tensor with no data), then takes a fresh storage of
``sim:i`` (``torch._C._construct_storage_from_data_pointer``, no data: the bytes live in the
host storage it carries, as for ``sim:0``). That storage cannot be resized, so it is made
larger than any host storage and sizes/strides are set by ``as_strided_`` at the Meta level.
Index 0 keeps the original path, so one device costs nothing extra.

The current device is per thread, as CUDA's is (the runtime keeps one per host thread): a new
thread starts on ``sim:0`` whatever its parent set, so ``nn.DataParallel``'s replica threads,
each inside ``torch.cuda.device(i)``, and a DataLoader's pin-memory thread set theirs without
moving the program's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

NAME = "sim"
#: environment variable: the number of sim devices (default 1)
ENV = "PERF_SIM_DEVICES"
_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_aten = torch.ops.aten
#: the C++ size of a storage of sim:i (i > 0): never smaller than a host storage it carries
_FAKE_NBYTES = 1 << 62

count = 1


class _Current(threading.local):
    index = 0  # a thread's first value, as CUDA's: device 0


_current = _Current()
_seeds: dict[int, torch.Tensor] = {}
_keep: list[Any] = []  # the DLPack structures behind the seeds (never freed)
_lock = threading.Lock()


def count_from_env(environ: Any = None) -> int:
    """``PERF_SIM_DEVICES`` as a device count (default 1); a clear error for bad values."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return 1
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(
            f"{ENV}={raw!r}: the number of simulated devices must be a whole number >= 1 "
            f"(e.g. {ENV}=2 gives {NAME}:0 and {NAME}:1)"
        )
    return n


def invalid_ordinal(index: Any) -> RuntimeError:
    """CUDA's error for a device index past the device count, saying that it is ``sim``."""
    cls = getattr(torch, "AcceleratorError", RuntimeError)
    return cls(
        f"CUDA error: invalid device ordinal ({NAME}:{index} on perf's simulated device, which "
        f"has {count} device(s), {NAME}:0 to {NAME}:{count - 1}; set {ENV} or "
        f"perf.simulated_device(count=N) for more)"
    )


def check(index: int) -> int:
    if not 0 <= index < count:
        raise invalid_ordinal(index)
    return index


def current() -> int:
    """This thread's current ``sim`` device."""
    return _current.index


#: the C++ path's ``set_current`` (perf.sim.native), which keeps its own copy of this thread's
#: device for the ops it runs; None without it
native_current: Any = None


def set_current(index: int) -> None:
    _current.index = check(index)
    if native_current is not None:
        native_current(index)


@contextlib.contextmanager
def made_on(index: int) -> Iterator[None]:
    """``sim:index`` current inside, as the device guard of a backend kernel's wrapper makes
    it (C++ that creates a tensor without an index, a new ``SparseTensorImpl``'s first
    indices, lands on the current device)."""
    before = _current.index
    set_current(index)
    try:
        yield
    finally:
        set_current(before)


def index_of(device: Any) -> int:
    """The sim device index that ``device`` (a device, a string, an int or None) names;
    no index means the current device, as on CUDA."""
    if device is None:
        return _current.index
    if isinstance(device, int):
        return check(device) if device >= 0 else _current.index
    d = torch.device(device)
    if d.type != NAME:
        raise ValueError(f"expected a {NAME} device, got {d}")
    return _current.index if d.index is None else check(d.index)


def same_device_error(a: int, b: int, op: Any) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{NAME}:{a} and {NAME}:{b}! (in {getattr(op, '__name__', op)}; the simulated device "
        "fails where CUDA would: copy one of them with .to(...) first)"
    )


def op_index(op: Any, sim_args: Any, device: Any) -> int:
    """The device index of an op's outputs: that of its sim tensor arguments (all on one
    device, as CUDA requires), else the ``device`` argument (factories), else current."""
    index = -1
    for t in sim_args:
        i = t.device.index
        if index < 0:
            index = i
        elif i != index:
            raise same_device_error(index, i, op)
    if index >= 0:
        return index
    if isinstance(device, torch.device) and device.type == NAME:
        return index_of(device)
    return _current.index


# -- tensors and storages on sim:i (i > 0) ------------------------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]
_K_DL_EXT_DEV = 12  # dlpack.h kDLExtDev: PyTorch's PrivateUse1 (aten/src/ATen/DLConvertor.cpp)
_K_DL_UINT = 1


@_DELETER
def _no_delete(_: Any) -> None:
    return None


def _seed(index: int) -> torch.Tensor:
    """A 0-element uint8 tensor on ``sim:index`` (PrivateUse1 keys, no data), from DLPack."""
    seed = _seeds.get(index)
    if seed is not None:
        return seed
    with _lock:
        shape = (ctypes.c_int64 * 1)(0)
        strides = (ctypes.c_int64 * 1)(1)
        m = _DLManagedTensor()
        m.dl_tensor.data = None
        m.dl_tensor.device = _DLDevice(_K_DL_EXT_DEV, index)
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype = _DLDataType(_K_DL_UINT, 8, 1)
        m.dl_tensor.shape = shape
        m.dl_tensor.strides = strides
        m.dl_tensor.byte_offset = 0
        m.manager_ctx = None
        m.deleter = _no_delete
        _keep.extend([m, shape, strides])
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        seed = torch._C._from_dlpack(new(ctypes.addressof(m), b"dltensor", None))
        if seed.device != torch.device(NAME, index):
            raise RuntimeError(
                f"perf.sim: could not make a tensor on {NAME}:{index} (got {seed.device}); this "
                "torch maps DLPack devices differently: use one simulated device"
            )
        _seeds[index] = seed
        return seed


def empty_on(index: int, dtype: torch.dtype) -> torch.Tensor:
    """A new plain 0-element tensor of ``dtype`` on ``sim:index`` (index > 0)."""
    out = _aten.alias.default.redispatch(_META, _seed(index))
    if dtype != torch.uint8:
        out = _aten.view.dtype.redispatch(_META, out, dtype)
    return out


def storage_on(index: int) -> Any:
    """A new storage of ``sim:index`` (index > 0) with no data."""
    return torch._C._construct_storage_from_data_pointer(0, torch.device(NAME, index), _FAKE_NBYTES)


def set_on(outer: torch.Tensor, st: Any, offset: Any, size: Any, stride: Any) -> None:
    """``set_(st, offset, size, stride)`` at the Meta level for a tensor on ``sim:i``
    (i > 0), whose storage cannot be resized: ``set_`` with no elements, then ``as_strided_``
    (which only checks bounds against the storage's fake size)."""
    _aten.set_.source_Storage_storage_offset.redispatch(_META, outer, st, 0, [0], [1])
    _aten.as_strided_.default.redispatch(_META, outer, size, stride, offset)
