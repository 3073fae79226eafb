"""Lightning's ``Trainer`` on the simulated device: an accelerator for ``sim`` and the strategy
that puts a single-device run on it.

Why: Lightning picks its device itself. ``Trainer(accelerator="auto")`` on a box without CUDA
trains on the CPU, silently, so counters around ``trainer.fit`` on ``sim`` count nothing; and
a custom accelerator alone is not enough, because Lightning places a single-device run of any
accelerator but its own GPU ones on the CPU (``_choose_strategy``). So::

    import lightning as L
    from perf.sim.lightning import sim_trainer_kwargs

    trainer = L.Trainer(**sim_trainer_kwargs(devices=1), max_epochs=1)

runs on ``sim:0`` (``devices=N``: DDP over ``sim:0`` ... ``sim:N-1``, one process each,
through ``sim``'s own process-group backend, as ``cuda`` runs over NCCL). The classes are
made for the ``lightning`` package, or for ``pytorch_lightning`` with
``package="pytorch_lightning"`` (a Trainer takes only its own package's classes). Importing
this module imports neither; :func:`sim_trainer_kwargs` imports the one it is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from perf.sim import ordinals
from perf.sim.tensors import NAME

__all__ = ["sim_accelerator_class", "sim_trainer_kwargs"]

_CLASSES: dict[str, type] = {}
_PACKAGES = ("lightning", "pytorch_lightning")


def _module(package: str, sub: str) -> Any:
    """``package``'s Trainer submodule ``sub`` (``lightning.pytorch.<sub>`` or
    ``pytorch_lightning.<sub>``)."""
    if package not in _PACKAGES:
        raise ValueError(f"package must be one of {', '.join(_PACKAGES)}, got {package!r}")
    name = f"lightning.pytorch.{sub}" if package == "lightning" else f"{package}.{sub}"
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(
            f"perf.sim.lightning needs the {package!r} package ({e}); install it, or pass "
            f"package={'pytorch_lightning' if package == 'lightning' else 'lightning'!r} "
            "for the other name Lightning is published under"
        ) from None


def _parse(devices: Any) -> list[int]:
    """Lightning's ``devices`` for ``sim``: a count, ``-1`` / ``"auto"`` (all), a list of
    indices, or a string of either; an index past the simulated devices is refused."""
    n = ordinals.count
    if isinstance(devices, str):
        text = devices.strip()
        if text in ("auto", "-1"):
            devices = -1
        elif "," in text:
            devices = [int(p) for p in text.split(",") if p.strip()]
        else:
            devices = int(text)
    if devices == -1:
        return list(range(n))
    if isinstance(devices, int) and not isinstance(devices, bool):
        if not 0 < devices <= n:
            raise ValueError(
                f"devices={devices}: there are {n} simulated device(s) "
                f"(perf.simulated_device(count=N) or PERF_SIM_DEVICES sets how many)"
            )
        return list(range(devices))
    indices = [int(i) for i in devices]
    bad = [i for i in indices if not 0 <= i < n]
    if bad or not indices:
        raise ValueError(f"devices={devices!r}: the simulated devices are {NAME}:0..{n - 1}")
    return indices


def sim_accelerator_class(package: str = "lightning") -> type:
    """Lightning's ``Accelerator`` for ``sim`` (the class made for ``package``)."""
    if package in _CLASSES:
        return _CLASSES[package]
    base = _module(package, "accelerators").Accelerator

    class SimAccelerator(base):  # type: ignore[misc,valid-type]
        """perf's simulated device as a Lightning accelerator (device stats: ``sim``'s
        caching-allocator model, as ``CUDAAccelerator`` reports CUDA's)."""

        def setup(self, trainer: Any) -> None:
            _amp_on_sim(trainer.strategy.precision_plugin)

        def setup_device(self, device: torch.device) -> None:
            if device.type != NAME:
                raise ValueError(
                    f"the sim accelerator got the device {device}: Lightning places a "
                    "single-device run of a custom accelerator on the CPU; pass the strategy "
                    "of perf.sim.lightning.sim_trainer_kwargs() (a SingleDeviceStrategy on "
                    f"{NAME}:0)"
                )
            torch.accelerator.set_device_index(device.index or 0)

        def get_device_stats(self, device: Any) -> dict[str, Any]:
            return dict(torch.sim.memory_stats(device))  # type: ignore[attr-defined]

        def teardown(self) -> None:
            pass

        @staticmethod
        def parse_devices(devices: Any) -> list[int]:
            return _parse(devices)

        @staticmethod
        def get_parallel_devices(devices: Any) -> list[torch.device]:
            return [torch.device(NAME, i) for i in _parse(devices)]

        @staticmethod
        def auto_device_count() -> int:
            return ordinals.count

        @staticmethod
        def is_available() -> bool:
            return True

        @staticmethod
        def name() -> str:
            return NAME

        @classmethod
        def register_accelerators(cls, accelerator_registry: Any) -> None:
            accelerator_registry.register(cls.name(), cls, description=cls.__name__)

    SimAccelerator.__module__ = __name__
    _CLASSES[package] = SimAccelerator
    return SimAccelerator


def _amp_on_sim(plugin: Any) -> None:
    """Lightning's mixed precision on ``sim``: for any accelerator but the CPU and MPS,
    Lightning autocasts for ``"cuda"`` (``MixedPrecision(precision, "cuda")``), which does
    nothing to ``sim`` tensors (fp32, with a warning), and makes a ``GradScaler("cuda")``,
    disabled without CUDA. The plugin is pointed at ``sim`` and gets a ``sim`` scaler, as it
    has a CUDA one on a GPU (one ``.item()`` a step: the scaler's check for infs)."""
    if getattr(plugin, "device", None) != "cuda" or not hasattr(plugin, "scaler"):
        return
    plugin.device = NAME
    scaler = plugin.scaler
    if plugin.precision == "16-mixed" and (scaler is None or not scaler.is_enabled()):
        plugin.scaler = torch.amp.GradScaler(NAME)


def sim_trainer_kwargs(
    devices: Any = 1, package: str = "lightning", precision: str | None = None
) -> dict[str, Any]:
    """``accelerator``, ``strategy`` and ``devices`` for a Lightning ``Trainer`` that trains on
    ``sim``: one device, a ``SingleDeviceStrategy`` on ``sim:i``; several, Lightning's DDP (one
    process per device, its process group ``sim``'s backend). ``precision="16-mixed"`` or
    ``"bf16-mixed"``: also the mixed-precision plugin that autocasts on ``sim`` (a
    ``precision=`` given to the ``Trainer`` itself is pointed at ``sim`` too, after Lightning
    has warned that it disabled CUDA's autocast). ``perf.simulated_device()`` must
    be installed first (it is what makes ``sim`` a device)."""
    from perf.sim import device

    if device._device is None:
        raise RuntimeError(
            "sim_trainer_kwargs: the simulated device is not installed in this process; "
            "call perf.simulated_device() first"
        )
    indices = _parse(devices)
    accelerator = sim_accelerator_class(package)()
    strategies = _module(package, "strategies")
    out: dict[str, Any] = {"accelerator": accelerator}
    if len(indices) == 1:
        out["strategy"] = strategies.SingleDeviceStrategy(device=torch.device(NAME, indices[0]))
        out["devices"] = 1
    else:
        out["strategy"] = _ddp_class(strategies)()
        out["devices"] = indices
    if precision is not None:
        if precision not in ("16-mixed", "bf16-mixed"):
            raise ValueError(
                f"precision={precision!r}: sim_trainer_kwargs makes the mixed-precision plugin "
                "('16-mixed' or 'bf16-mixed'); pass other precisions to the Trainer"
            )
        plugins = _module(package, "plugins.precision")
        scaler = torch.amp.GradScaler(NAME) if precision == "16-mixed" else None
        out["plugins"] = [plugins.MixedPrecision(precision, NAME, scaler)]
    return out


def _ddp_class(strategies: Any) -> type:
    key = strategies.__name__
    if key not in _CLASSES:

        class SimDDPStrategy(strategies.DDPStrategy):
            """Lightning's DDP on ``sim``: the model wrapped without ``device_ids``, which
            Lightning gives any non-CPU device and then runs the wrapping in a
            ``torch.cuda.Stream`` (CUDA only). ``DistributedDataParallel`` takes
            ``device_ids=None`` for a module on one device, and wraps it the same."""

            def determine_ddp_device_ids(self) -> None:
                return None

        SimDDPStrategy.__module__ = __name__
        _CLASSES[key] = SimDDPStrategy
    return _CLASSES[key]
