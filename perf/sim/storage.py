"""Storages of sim tensors: checkpointing (``torch.save`` / ``torch.load``), pickling and
``copy.deepcopy`` as on CUDA.

Why: a sim tensor's own storage has no data (its bytes live in the host storage it carries), so
PyTorch's storage-level code, which reads a storage's data pointer (``torch.save`` dedupes by
it), copies a storage to the host (``storage.cpu()`` when saving, ``_write_file`` when
pickling), allocates a new device storage (``clone()`` in deepcopy, ``storage.to(device)``
when loading) or rebuilds a tensor with ``set_(storage, ...)``, failed with "invalid python
storage" (or would crash: ``PrivateUse1`` has no allocator). Each such step is answered here
through the sim tensor API, so it does on ``sim`` what it does on ``cuda``:

- ``torch.save``: one blocking device-to-host copy per distinct storage
  (``torch/serialization.py`` ``_save``: ``if storage.device.type != "cpu": storage =
  storage.cpu()``), the location tag ``"sim:0"``;
- ``torch.load``: storages tagged ``sim`` (or mapped there with ``map_location``) become sim
  storages by one blocking host-to-device copy each (``_deserialize``:
  ``obj.to(device=device)``); ``map_location="cpu"`` gives host tensors and needs no ``sim``;
- ``copy.deepcopy``: a device-to-device copy of the storage (``_StorageBase.clone``);
- ``storage.resize_(n)`` (FSDP2 frees and re-allocates unsharded parameters with it): the
  host storage is resized in place, a free and an allocation for the memory model.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from perf.sim import ordinals, tensors
from perf.sim.tensors import HOST, META, NAME, aten, host_view

_U8 = torch.uint8
_LOCATION = re.compile(rf"{NAME}(:\d+)?$")


def _host_of(storage: Any) -> Any:
    if tensors.native is not None:
        if not isinstance(storage, torch.UntypedStorage):
            return None
        return tensors.native.host_storage(storage)
    return getattr(storage, HOST, None)


def _as_sim_bytes(storage: Any) -> torch.Tensor:
    """A 1-d uint8 sim tensor over all of ``storage``'s host bytes."""
    if tensors.native is not None:
        return tensors.native.bytes_of(storage)
    host = _host_of(storage)
    index = storage.device.index or 0
    if index:  # sim:i, i > 0 (perf.sim.ordinals)
        out = ordinals.empty_on(index, _U8)
        ordinals.set_on(out, storage, 0, [host.nbytes()], [1])
        return out
    out = torch._C._acc.create_empty_tensor((0,), _U8)
    aten.set_.source_Storage_storage_offset.redispatch(META, out, storage, 0, [host.nbytes()], [1])
    return out


def _bytes_of(storage: Any) -> torch.Tensor:
    if _host_of(storage) is not None:
        return _as_sim_bytes(storage)
    return torch.empty(0, dtype=_U8, device=storage.device).set_(storage)


def _install_storage_methods() -> None:
    cls = torch.UntypedStorage
    plain_data_ptr, plain_clone = cls.data_ptr, cls.clone
    plain_write, plain_nbytes = cls._write_file, cls.nbytes
    plain_read, plain_copy = cls._set_from_file, cls.copy_
    plain_resize = cls.resize_

    def data_ptr(self: Any) -> int:
        host = _host_of(self)
        return plain_data_ptr(self) if host is None else plain_data_ptr(host)

    def nbytes(self: Any) -> int:
        host = _host_of(self)
        return plain_nbytes(self) if host is None else plain_nbytes(host)

    def clone(self: Any) -> Any:
        if _host_of(self) is None:
            return plain_clone(self)
        out = torch.empty(self.nbytes(), dtype=_U8, device=self.device)
        out.copy_(_as_sim_bytes(self))  # device to device, as on CUDA
        return out.untyped_storage()

    def write_file(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _host_of(self) is None:
            return plain_write(self, *args, **kwargs)
        return plain_write(self.cpu(), *args, **kwargs)

    def set_from_file(self: Any, *args: Any, **kwargs: Any) -> Any:
        # pickle's legacy format reads the bytes after restoring the storage to its device
        if _host_of(self) is None:
            return plain_read(self, *args, **kwargs)
        tmp = plain_read(torch.UntypedStorage(self.nbytes()), *args, **kwargs)
        _as_sim_bytes(self).copy_(_bytes_of(tmp))
        return self

    def copy_(self: Any, src: Any, non_blocking: bool = False) -> Any:
        # storage.cpu() (torch.save) and .to(device) copy storage to storage
        if _host_of(self) is None and _host_of(src) is None:
            return plain_copy(self, src, non_blocking)
        _bytes_of(self).copy_(_bytes_of(src), non_blocking)
        return self

    def resize_(self: Any, size: int) -> Any:
        # FSDP2 frees each unsharded parameter with storage.resize_(0) and allocates it again
        # with resize_(nbytes) (torch/distributed/fsdp/_fully_shard/_fsdp_param.py,
        # free_storage / alloc_storage). On CUDA resize_bytes_cuda allocates the new block,
        # copies what fits and frees the old: here the host storage is resized in place (the
        # same copy) and the memory model sees the same allocation and free.
        host = _host_of(self)
        if host is None:
            return plain_resize(self, size)
        plain_resize(host, size)
        if tensors.native is not None:
            tensors.native.note_resized(self)
        elif tensors.storage_hook is not None:
            tensors.storage_hook(host, self.device.index or 0)
        return self

    for fn, plain in (
        (data_ptr, plain_data_ptr),
        (clone, plain_clone),
        (nbytes, plain_nbytes),
        (resize_, plain_resize),
    ):
        fn.__doc__ = plain.__doc__
    cls.data_ptr = data_ptr  # type: ignore[method-assign]
    cls.nbytes = nbytes  # type: ignore[method-assign]
    cls.size = nbytes  # type: ignore[method-assign]
    cls.clone = clone  # type: ignore[method-assign]
    cls._write_file = write_file  # type: ignore[method-assign]
    cls._set_from_file = set_from_file  # type: ignore[method-assign]
    cls.copy_ = copy_  # type: ignore[method-assign,assignment]
    cls.resize_ = resize_  # type: ignore[method-assign]


def _tag(storage: Any) -> str | None:
    return None  # sim storages carry their device; PyTorch's PrivateUse1 tagger names them


def _restore(storage: Any, location: str) -> Any:
    """``torch.load``'s restore for ``sim`` locations: one blocking host-to-device copy."""
    if not _LOCATION.match(location):
        return None
    if storage.device.type == NAME:
        return storage
    out = torch.empty(storage.nbytes(), dtype=_U8, device=location)
    out.copy_(_bytes_of(storage))
    return out.untyped_storage()


def _set_storage(
    self: torch.Tensor,
    source: Any,
    storage_offset: int = 0,
    size: Any = None,
    stride: Any = None,
) -> torch.Tensor:
    """``set_(storage, ...)`` on a sim tensor: ``torch.load``'s and deepcopy's rebuild."""
    host = _host_of(source)
    if host is None:
        raise RuntimeError(
            f"set_(storage) on a {NAME} tensor with a storage of device {source.device}: "
            f"move the storage to {NAME} first (as CUDA requires a CUDA storage)"
        )
    if size is None:
        size = [host.nbytes() // self.element_size()]
    if stride is None or len(stride) == 0:
        stride = torch.empty(size, device="meta").stride()
    if tensors.native is not None:
        tensors.native.set_storage(self, source, storage_offset, list(size), list(stride))
    elif source.device.index:  # sim:i, i > 0: its storages cannot be resized (perf.sim.ordinals)
        ordinals.set_on(self, source, storage_offset, size, stride)
    else:
        aten.set_.source_Storage_storage_offset.redispatch(
            META, self, source, storage_offset, size, stride
        )
    host_view(self)  # fails here, not later, if the view lies outside the host storage
    return self


def _set_storage_plain(self: torch.Tensor, source: Any) -> torch.Tensor:
    return _set_storage(self, source)


def register_storage(lib: Any) -> None:
    _install_storage_methods()
    torch.serialization.register_package(9, _tag, _restore)
    if hasattr(torch._C._acc, "create_empty_tensor"):
        lib.impl("set_.source_Storage_storage_offset", _set_storage, "PrivateUse1")
        lib.impl("set_.source_Storage", _set_storage_plain, "PrivateUse1")
