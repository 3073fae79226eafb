"""pytest glue: options, markers and the ``device`` / ``tensor_size`` fixtures. No measuring
logic here (the metric channel is :mod:`perf.plugin.metrics`).

A good guest (rules in :mod:`perf.plugin.guest`): loading this module imports neither torch nor
scipy nor the instruments; a test that uses nothing of perf runs as if perf were not
installed. Torch is imported when a test uses perf's fixtures or markers.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from perf.core.gpu_pool import DeviceLocks
from perf.plugin import guest as _guest
from perf.plugin.guest import PERF_CUDA, PERF_MARKERS, PERF_TIMING, PERF_TOLERANCE, parse_sizes

if TYPE_CHECKING:
    import torch


DEVICES_KEY = pytest.StashKey[list[str]]()
SIZES_KEY = pytest.StashKey[list[int]]()
#: Test definitions (``path::name``) that perf parametrized with its own fixtures.
PARAMETRIZED_KEY = pytest.StashKey[set[str]]()
#: xdist controller: the timing locks' base path it hands to its workers; worker: the locks.
LOCK_PATH_KEY = pytest.StashKey[str]()
LOCK_KEY = pytest.StashKey[DeviceLocks]()

CUDA_SKIP_REASON = "needs CUDA: torch.cuda.is_available() is False on this machine"

__all__ = [
    "CUDA_SKIP_REASON",
    "DEVICES_KEY",
    "LOCK_KEY",
    "LOCK_PATH_KEY",
    "PARAMETRIZED_KEY",
    "SIZES_KEY",
    "device",
    "make_device",
    "perf_device_of",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_configure_node",
    "pytest_generate_tests",
    "pytest_runtest_protocol",
    "pytest_unconfigure",
    "tensor_size",
    "uses_perf",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perf", "PyTorch performance properties (perf)")
    group.addoption(
        "--perf-devices",
        default=None,
        help="Devices for perf's `device` fixture: comma list of cpu, cuda, cuda:N, mps, sim "
        "(the simulated accelerator of CPU-only boxes), all (default: ini perf_devices, else all "
        "devices present).",
    )
    group.addoption(
        "--perf-sizes",
        default=None,
        help="Sizes for perf's `tensor_size` fixture: comma list of positive integers, e.g. "
        "64,512,4096 (default: ini perf_sizes).",
    )
    group.addoption(
        "--perf-gpu-target",
        default=None,
        help="GPU whose time perf.model_gpu_time models for the `perf_gpu_target` fixture "
        "(default: ini perf_gpu_target, 'H100 SXM'); figures are modelled, not measured.",
    )
    group.addoption(
        "--perf-gpu-host-op-us",
        default=None,
        help="Host cost of one dispatched op in microseconds for the `perf_gpu_target` fixture "
        "(default: ini perf_gpu_host_op_us, else the target's: 25 us, measured on an H200 "
        "runner); benchmarks/model_vs_gpu.py fits it on a GPU runner.",
    )
    parser.addini("perf_gpu_target", "default for --perf-gpu-target", default="H100 SXM")
    parser.addini("perf_gpu_host_op_us", "default for --perf-gpu-host-op-us", default="")
    parser.addini("perf_devices", "default for --perf-devices", default="all")
    parser.addini("perf_sizes", "default for --perf-sizes", default="64,512,2048")


def make_device(name: Any) -> torch.device:
    """The ``torch.device`` for a device name of ``--perf-devices`` (the one constructor;
    ``sim`` installs the simulated accelerator into this process)."""
    from perf.core.devices import make_device as _make

    return _make(str(name))


def _devices(config: pytest.Config) -> list[str]:
    """``--perf-devices`` parsed against the devices present (imports torch: first use)."""
    if DEVICES_KEY not in config.stash:
        from perf.core.devices import parse_devices

        spec = config.getoption("--perf-devices") or str(config.getini("perf_devices"))
        try:
            config.stash[DEVICES_KEY] = parse_devices(spec)
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        if "sim" in config.stash[DEVICES_KEY]:
            # Now, at collection, before any test: autograd sizes its device queues at the
            # first backward of the process, and a device installed after that cannot
            # run backward.
            from perf.sim.device import SimulatedDeviceError

            try:
                make_device("sim")
            except SimulatedDeviceError as e:
                raise pytest.UsageError(f"--perf-devices: sim: {e}") from None
    return config.stash[DEVICES_KEY]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{PERF_CUDA}(min_devices=1): needs CUDA (and at least min_devices GPUs); skipped with "
        "a reason naming CUDA where there is none; perf's `device` runs it on CUDA devices only.",
    )
    config.addinivalue_line(
        "markers",
        f"{PERF_TIMING}: measures wall-clock time; under pytest-xdist no two such tests run at "
        f"once (deselect with -m 'not {PERF_TIMING}' for a counters-only run).",
    )
    config.addinivalue_line(
        "markers",
        f"{PERF_TOLERANCE}(default=None, **per_metric): relative gate margin for this test's "
        "metrics, e.g. perf_tolerance(0.1, step_time_s=0.25).",
    )
    size_spec = config.getoption("--perf-sizes") or str(config.getini("perf_sizes"))
    try:
        config.stash[SIZES_KEY] = parse_sizes(size_spec)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    if config.getoption("--perf-devices"):
        _devices(config)  # asked for on the command line: a wrong device fails now
    if config.getoption("--perf-gpu-host-op-us") is not None:
        _check_host_cost(config)  # likewise a host cost that is no number
    config.stash[PARAMETRIZED_KEY] = set()
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and workerinput.get("perf_timing_lock"):
        config.stash[LOCK_KEY] = DeviceLocks(workerinput["perf_timing_lock"])


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker gets the base path of this session's timing locks."""
    config = node.config
    if LOCK_PATH_KEY not in config.stash:
        name = f"perf-timing-{os.getpid()}-{uuid.uuid4().hex[:8]}.lock"
        config.stash[LOCK_PATH_KEY] = os.path.join(tempfile.gettempdir(), name)
    node.workerinput["perf_timing_lock"] = config.stash[LOCK_PATH_KEY]


def pytest_unconfigure(config: pytest.Config) -> None:
    if LOCK_PATH_KEY in config.stash:
        _guest.remove_quietly(DeviceLocks(config.stash[LOCK_PATH_KEY]).files())


# -- markers --------------------------------------------------------------------------------


def _cuda_need(node: Any) -> int | None:
    """``perf_cuda``'s device count for a test, None when unmarked; bad arguments are a
    usage error naming the test."""
    m = node.get_closest_marker(PERF_CUDA)
    if m is None:
        return None
    try:
        return _guest.cuda_marker_need(m.args, m.kwargs)
    except ValueError as e:
        raise pytest.UsageError(f"{node.nodeid}: {e}") from None


def _check_timing_marker(node: Any) -> None:
    m = node.get_closest_marker(PERF_TIMING)
    if m is not None:
        try:
            _guest.timing_marker_check(m.args, m.kwargs)
        except ValueError as e:
            raise pytest.UsageError(f"{node.nodeid}: {e}") from None


# -- device / tensor_size parametrization ---------------------------------------------------


def _resolves_to_perf(metafunc: pytest.Metafunc, name: str) -> bool:
    """Whether ``name`` in this test is perf's fixture and still unparametrized.

    pytest has no public lookup of the fixture definitions a test sees, nor of the
    parametrizations applied so far. ``Metafunc._arg2fixturedefs`` (closest last; a direct
    ``parametrize`` replaces it with a pseudo fixture) and ``Metafunc._calls`` have been
    stable since pytest 6; without them perf parametrizes nothing (the safe side).
    """
    defs = getattr(metafunc, "_arg2fixturedefs", {}).get(name)
    calls = getattr(metafunc, "_calls", None)
    if not defs or calls is None:
        return False
    if any(name in cs.params for cs in calls):
        return False  # the test, a conftest hook or a parametrized fixture did it already
    if any(
        name in _guest.parametrize_argnames(m.args, m.kwargs)
        for m in metafunc.definition.iter_markers("parametrize")
    ):
        return False
    ours = globals()[name]

    def is_ours(fd: Any) -> bool:
        f = getattr(fd, "func", None)
        return getattr(f, "__module__", None) == __name__ and getattr(
            f, "__name__", None
        ) == getattr(ours, "__name__", name)

    return _guest.resolves_to(defs, is_ours, name)


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # trylast: the test's own parametrize marks and every other plugin's / conftest's
    # pytest_generate_tests have run, so a parametrization of ours can never duplicate theirs.
    cfg = metafunc.config
    need = _cuda_need(metafunc.definition)
    _check_timing_marker(metafunc.definition)
    done = False
    if "device" in metafunc.fixturenames and _resolves_to_perf(metafunc, "device"):
        devs = _devices(cfg)
        if need is not None:
            cuda = [d for d in devs if d.startswith("cuda")]
            params: list[Any] = (
                list(cuda)
                if cuda
                else [pytest.param("cuda", marks=pytest.mark.skip(reason=CUDA_SKIP_REASON))]
            )
            ids = cuda or ["cuda"]
        else:
            params, ids = list(devs), list(devs)
        metafunc.parametrize("device", params, ids=ids, indirect=True)
        done = True
    if "tensor_size" in metafunc.fixturenames and _resolves_to_perf(metafunc, "tensor_size"):
        sizes = cfg.stash[SIZES_KEY]
        metafunc.parametrize("tensor_size", sizes, ids=[f"n{s}" for s in sizes], indirect=True)
        done = True
    if done:
        cfg.stash[PARAMETRIZED_KEY].add(metafunc.definition.nodeid)


@pytest.fixture
def device(request: pytest.FixtureRequest) -> torch.device:
    """A ``torch.device``: each of ``--perf-devices`` in turn (perf parametrizes the tests
    that use this fixture). A project's own ``device`` fixture or parametrization wins."""
    if not hasattr(request, "param"):
        raise pytest.UsageError(
            f"{request.node.nodeid}: perf's `device` fixture is parametrized at collection; "
            "ask for it as a test argument, not through request.getfixturevalue()"
        )
    return make_device(request.param)


@pytest.fixture
def tensor_size(request: pytest.FixtureRequest) -> int:
    """An int: each of ``--perf-sizes`` (ini ``perf_sizes``) in turn."""
    if not hasattr(request, "param"):
        raise pytest.UsageError(
            f"{request.node.nodeid}: perf's `tensor_size` fixture is parametrized at "
            "collection; ask for it as a test argument"
        )
    return int(request.param)


@pytest.fixture
def perf_gpu_target(request: pytest.FixtureRequest) -> Any:
    """The :class:`perf.instruments.gpu_targets.GpuTarget` of ``--perf-gpu-target`` (ini
    ``perf_gpu_target``): the GPU whose time ``perf.model_gpu_time`` models in this run, with
    the host cost per op of ``--perf-gpu-host-op-us`` (ini ``perf_gpu_host_op_us``) if set."""
    return gpu_target(request.config)


def _check_host_cost(config: pytest.Config) -> None:
    """A ``--perf-gpu-host-op-us`` that is no positive number fails at start. The target's
    name is checked where it is used: a conftest below the rootdir may add it later."""
    from perf.instruments.gpu_targets import DEFAULT_TARGET, get_target

    _with_host_cost(config, get_target(DEFAULT_TARGET))


def _with_host_cost(config: pytest.Config, target: Any) -> Any:
    """``target`` with ``--perf-gpu-host-op-us`` (ini ``perf_gpu_host_op_us``) if set."""
    from perf.instruments.gpu_targets import with_host_cost

    host = config.getoption("--perf-gpu-host-op-us") or str(config.getini("perf_gpu_host_op_us"))
    if not host.strip():
        return target
    try:
        return with_host_cost(target, host)
    except ValueError as e:
        raise pytest.UsageError(f"--perf-gpu-host-op-us: {e}") from None


def gpu_target(config: pytest.Config) -> Any:
    """The target of ``--perf-gpu-target`` with ``--perf-gpu-host-op-us`` (or their ini
    values); a wrong one is a usage error naming the option."""
    from perf.instruments.gpu_targets import get_target

    name = config.getoption("--perf-gpu-target") or str(config.getini("perf_gpu_target"))
    try:
        target = get_target(name)
    except ValueError as e:
        raise pytest.UsageError(f"--perf-gpu-target: {e}") from None
    return _with_host_cost(config, target)


def _definition_id(item: pytest.Item) -> str:
    parent = item.parent.nodeid if item.parent is not None else ""
    return f"{parent}::{getattr(item, 'originalname', item.name)}"


def perf_device_of(item: pytest.Item) -> str | None:
    """The ``--perf-devices`` name a test runs on, None where perf did not parametrize it."""
    if _definition_id(item) not in item.config.stash.get(PARAMETRIZED_KEY, set()):
        return None
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get("device") if callspec is not None else None
    return None if value is None else str(value)


def uses_perf(item: pytest.Item) -> bool:
    """A perf test: marked with a perf marker, or using a fixture of perf's."""
    if "perf_metrics" in getattr(item, "fixturenames", ()):
        return True
    if any(m.name in PERF_MARKERS for m in item.iter_markers()):  # one pass over the marks
        return True
    return _definition_id(item) in item.config.stash.get(PARAMETRIZED_KEY, set())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needs: list[tuple[pytest.Item, int]] = []
    for item in items:
        need = _cuda_need(item)
        if need is not None:
            needs.append((item, need))
        if item.get_closest_marker(PERF_TIMING) is not None and perf_device_of(item) == "sim":
            from perf.core.devices import SIM_TIMING_SKIP_REASON

            item.add_marker(pytest.mark.skip(reason=SIM_TIMING_SKIP_REASON))
    if not needs:
        return  # no perf_cuda test: torch stays unimported
    import torch

    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item, need in needs:
        if n_cuda < need:
            reason = (
                CUDA_SKIP_REASON
                if n_cuda == 0
                else f"needs {need} CUDA devices, this machine has {n_cuda}" + _pinned_note()
            )
            item.add_marker(pytest.mark.skip(reason=reason))


def _pinned_note() -> str:
    from perf.core.gpu_pool import PINNED_ENV

    gpu = os.environ.get(PINNED_ENV)
    return "" if gpu is None else f" (this xdist worker sees GPU {gpu}: --perf-gpu-per-worker)"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """xdist workers only: a perf test gets its share of the cores for torch's threads while
    it runs, and a ``perf_timing`` test holds its device's timing locks (one GPU's, or the
    host's: :class:`perf.core.gpu_pool.DeviceLocks`). Other tests and serial runs: nothing."""
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None or not uses_perf(item):
        return (yield)
    import torch

    share = _guest.thread_share(os.cpu_count(), int(workerinput.get("workercount", 1)))
    before = torch.get_num_threads()
    lock = item.config.stash.get(LOCK_KEY, None)
    timing = item.get_closest_marker(PERF_TIMING) is not None and lock is not None
    if share is not None:
        torch.set_num_threads(share)
    try:
        if timing:
            assert lock is not None
            from perf.core.gpu_pool import physical

            with lock.hold(physical(perf_device_of(item) or "", os.environ)):
                return (yield)
        return (yield)
    finally:
        if share is not None:
            torch.set_num_threads(before)
