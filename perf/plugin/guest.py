"""Rules that keep perf a good guest in other people's test suites.

perf is a ``pytest11`` plugin, so it is loaded in every pytest run of an environment where it
is installed, not only in perf tests. The rule: a test that uses nothing of perf runs exactly
as if perf were not installed. Its pieces live here as plain functions (no pytest, no torch,
so importing them costs nothing); :mod:`perf.plugin.core` applies them.

- perf parametrizes a test's ``device`` / ``tensor_size`` only where the fixture the test
  resolves to is perf's own and nothing has parametrized that name yet (:func:`resolves_to`).
- perf's acting markers are namespaced (``perf_cuda``, ``perf_timing``); their arguments are
  checked (:func:`cuda_marker_need`) so a typo is a usage error, not an INTERNALERROR.
- Under pytest-xdist, ``perf_timing`` tests never time the same device at once on different
  workers: each holds its device's file locks while it runs (one per physical GPU, and the
  host's; :class:`perf.core.gpu_pool.DeviceLocks`). xdist's scheduling (``--dist``) and its
  crash handling are left exactly as the user chose them.
- Torch's intra-op threads are shared among xdist workers only while a perf test runs
  (:func:`thread_share`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

PERF_CUDA = "perf_cuda"
PERF_TIMING = "perf_timing"
PERF_TOLERANCE = "perf_tolerance"
#: Markers that make a test a perf test (and that perf acts on).
PERF_MARKERS = (PERF_CUDA, PERF_TIMING, PERF_TOLERANCE)


def parse_sizes(spec: str) -> list[int]:
    """``--perf-sizes 64,512,4_096`` -> ``[64, 512, 4096]``; ``ValueError`` naming a bad size."""
    out: list[int] = []
    for raw in spec.split(","):
        tok = raw.strip().replace("_", "")
        if not tok:
            continue
        if not tok.isdigit() or int(tok) <= 0:
            raise ValueError(
                f"--perf-sizes: {raw.strip()!r} is not a size; a size is a positive integer "
                f"(e.g. --perf-sizes 64,512,4096)"
            )
        out.append(int(tok))
    if not out:
        raise ValueError("--perf-sizes names no size; give e.g. --perf-sizes 64,512,4096")
    return out


def cuda_marker_need(args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    """Minimum number of CUDA devices asked for by ``perf_cuda`` / ``perf_cuda(2)`` /
    ``perf_cuda(min_devices=2)``; ``ValueError`` saying how to write it otherwise."""
    usage = "write @pytest.mark.perf_cuda or @pytest.mark.perf_cuda(min_devices=N), N >= 1"
    unknown = sorted(set(kwargs) - {"min_devices"})
    if unknown:
        raise ValueError(f"perf_cuda got unknown argument(s) {', '.join(unknown)}; {usage}")
    if len(args) > 1 or (args and "min_devices" in kwargs):
        raise ValueError(f"perf_cuda takes one argument, got {len(args) + len(kwargs)}; {usage}")
    need = kwargs.get("min_devices", args[0] if args else 1)
    if isinstance(need, bool) or not isinstance(need, int) or need < 1:
        raise ValueError(f"perf_cuda(min_devices={need!r}) is not a device count; {usage}")
    return need


def timing_marker_check(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """``perf_timing`` takes no arguments (a test is timing or it is not)."""
    if args or kwargs:
        raise ValueError(
            "perf_timing takes no arguments; write @pytest.mark.perf_timing "
            "(a margin goes in @pytest.mark.perf_tolerance(...))"
        )


def parametrize_argnames(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[str]:
    """The names a ``@pytest.mark.parametrize(...)`` mark parametrizes."""
    names = args[0] if args else kwargs.get("argnames", ())
    if isinstance(names, str):
        return [n.strip() for n in names.split(",") if n.strip()]
    return [str(n) for n in names]


def resolves_to(fixturedefs: Sequence[Any], is_ours: Callable[[Any], bool], name: str) -> bool:
    """Whether a test asking for ``name`` gets our fixture, given the fixture definitions
    visible to it (``pytest.FixtureDef``-like: ``.argnames``), farthest first.

    pytest's own rule for parametrized fixtures: start at the closest definition; an override
    counts as ours only if it requests the fixture it overrides (``def device(device): ...``)
    all the way down to ours. A project's own ``device`` fixture that does not build on ours
    wins, and perf leaves the test alone.
    """
    for fd in reversed(fixturedefs):
        if is_ours(fd):
            return True
        if name not in getattr(fd, "argnames", ()):
            return False
    return False


def thread_share(cpu_count: int | None, workers: int) -> int | None:
    """Intra-op threads for one of ``workers`` xdist workers, or None to leave torch alone.

    ``-n 2`` on 2 cores with torch's default 2 threads per worker oversubscribes the CPU:
    OpenMP barriers wait for preempted threads and a 100-microsecond op takes tens of
    milliseconds (measured here: an Iris forward, 0.1 ms -> 25 ms). One share per worker is
    what torchrun does for its ranks. An explicit ``OMP_NUM_THREADS`` is respected.
    """
    if os.environ.get("OMP_NUM_THREADS") or workers < 2:
        return None
    return max(1, (cpu_count or 1) // workers)


def remove_quietly(paths: Iterable[str]) -> None:
    """Delete files that may or may not exist (a lock file at session end)."""
    for p in paths:
        with contextlib.suppress(OSError):
            os.unlink(p)
