"""``torch.compile`` as exact counts (``perf.count_compiles``): graphs, graph breaks, recompiles.

A graph break (``.item()``, ``print``, a data-dependent ``if`` in ``forward``) or a recompile
(a Python float that changes every step, a new input shape) is a deterministic event of the
program: the same count on every run and machine with the same torch. Every figure here comes
from TorchDynamo's own bookkeeping, read as a difference between block entry and exit; no log
text is parsed and no logging is switched on (so counting costs nothing while compiling):

- graphs: ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` (one per FX graph Dynamo
  hands to the backend); frames: ``counters["frames"]["ok"]``.
- graph breaks: ``torch._dynamo.utils.graph_break_reasons``, the ``GraphCompileReason``
  records (reason + user stack) that ``torch._dynamo.explain`` reports; each is named by the
  first frame of its user stack outside torch and perf (innermost first).
- recompiles and compile times: ``torch._dynamo.utils.get_compilation_metrics()``, one
  ``CompilationMetrics`` record per frame compile (``recompile_reason`` is the first failed
  guard; ``*_cumulative_compile_time_us`` the phases).
- compiles that perf caused: Dynamo guards on the torch-function mode stack, and
  ``count_syncs`` pushes a torch-function mode, so compiled code first called inside it
  recompiles once (``___check_torch_function_mode_stack()``), which the program without perf
  never does; code first compiled inside it recompiles at its first call outside. The GPU
  time model's recorder on ``sim`` adds a dispatch key to the thread's set, which Dynamo's
  tensor guards read: the same happens around ``model_gpu_time`` there. At the
  start of each frame compile (``torch._dynamo.callback``) the frame's cache entries are
  checked again with perf's modes taken off the stack (or, where none is on, put on) and
  with the recorder's key switched: when
  one passes, the compile is perf's, and what it added (graphs, frames, breaks, compile time)
  is reported apart (:attr:`CompileCount.instrument_recompiles`) and left out of every other
  figure. A compile that the program needs anyway (a new shape met inside ``count_syncs``)
  counts.

Supported: torch 2.13 (tested: 2.13.0). These are private torch APIs: on a torch without one
of them, entering the block raises :class:`CompileCountError` naming it.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from perf.instruments.live import Live
from perf.instruments.sites import SKIP_DIRS, frame_site

TESTED_TORCH = "2.13.0"


class CompileCountError(RuntimeError):
    """Dynamo's bookkeeping is not there (another torch) or was reset inside the block."""


@dataclass(frozen=True)
class CompileCount:
    """What ``torch.compile`` did in a block.

    ``break_sites`` / ``recompile_sites`` are JSON-ready (the shape of
    :attr:`perf.instruments.syncs.SyncCount.sites`): ``"model.py:57"`` -> ``{"n": count,
    "function": ..., "code": source line, "what": "graph break (...)"}``; pass them to
    ``perf_metrics.record(..., sites=...)`` and a failing gate names the new ones.
    """

    #: FX graphs Dynamo compiled (a graph break splits one into two)
    graphs: int
    #: frames Dynamo compiled (a resume function after a break is a frame of its own)
    frames: int
    graph_breaks: int
    #: reason (Dynamo's graph-break type) -> count
    break_reasons: dict[str, int]
    break_sites: dict[str, dict[str, Any]]
    #: frame compiles after the first of a frame (a guard failed)
    recompiles: int
    #: the guard that failed (Dynamo's text without its compile id and source comment) -> count
    recompile_reasons: dict[str, int]
    #: by the recompiled function (its ``def`` line)
    recompile_sites: dict[str, dict[str, Any]]
    #: compile time: all of it, and its exclusive parts where PyTorch reports them
    compile_s: float = 0.0
    dynamo_s: float = 0.0
    aot_s: float = 0.0
    backend_s: float = 0.0
    backward_s: float = 0.0
    #: per frame compile: (function, compile id, recompile reason or "")
    compiles: tuple[tuple[str, str, str], ...] = field(default_factory=tuple)
    #: Inductor's FX graph cache during the block: ``"cold"`` (misses only), ``"warm"``
    #: (hits only), ``"mixed"``, or ``"none"`` (no lookup: another backend). A warm cache
    #: compiles ~10x faster, so compile times are compared only between equal states.
    cache: str = "none"
    #: recompiles caused by perf's own ``count_syncs`` (its torch-function mode on Dynamo's
    #: guarded mode stack): (function, compile id) each, left out of every figure above
    instrument_recompiles: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def record(self, perf_metrics: Any, prefix: str = "", *, compile_time: bool = False) -> None:
        """Record ``graphs``, ``graph_breaks``, ``recompiles`` (exact counts, with sites) on a
        ``perf_metrics`` fixture; with ``compile_time=True`` also ``compile_s``, of its own
        kind ``compile`` (unit ``compile_s``, the cache state in ``extra``). Not by default:
        a compile time stored as a timing pulled count tests into the timing gate's re-runs."""
        perf_metrics.record(f"{prefix}graphs", self.graphs, "count")
        perf_metrics.record(
            f"{prefix}graph_breaks", self.graph_breaks, "count", sites=self.break_sites
        )
        perf_metrics.record(
            f"{prefix}recompiles", self.recompiles, "count", sites=self.recompile_sites
        )
        if compile_time:
            perf_metrics.record(f"{prefix}compile_s", self.compile_s, "compile_s", cache=self.cache)


def _dynamo() -> tuple[Any, Any, Any]:
    """Dynamo's counters, graph-break records and compilation-metrics module, or a clear error."""
    try:
        import torch._dynamo.utils as utils
    except ImportError as e:  # pragma: no cover - torch without Dynamo
        raise CompileCountError(
            f"perf.count_compiles needs torch._dynamo (torch {torch.__version__} has none; "
            f"tested: torch {TESTED_TORCH})"
        ) from e
    needed = (
        "counters",
        "graph_break_reasons",
        "get_compilation_metrics",
        "CompilationMetrics",
        "set_compilation_metrics_limit",
    )
    missing = [n for n in needed if not hasattr(utils, n)]
    fields = getattr(utils.CompilationMetrics, "__dataclass_fields__", {})
    missing += [
        f"CompilationMetrics.{f}"
        for f in ("recompile_reason", "dynamo_cumulative_compile_time_us", "is_forward")
        if f not in fields
    ]
    if missing:
        raise CompileCountError(
            f"perf.count_compiles reads TorchDynamo's bookkeeping, which torch "
            f"{torch.__version__} does not have: torch._dynamo.utils.{', '.join(missing)}; "
            f"install a supported torch (tested: {TESTED_TORCH})"
        )
    return utils.counters, utils.graph_break_reasons, utils


#: Dynamo runs the rest of a function after a graph break as a generated "resume" function
#: (``torch_dynamo_resume_in_forward_at_57``, torch.2.13 ``resume_execution``): name it after
#: the user's function.
_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_\d+$")


def user_function(name: str) -> str:
    """The user's function behind a Dynamo resume function's name (others unchanged)."""
    while (m := _RESUME.match(name)) is not None:
        name = m.group(1)
    return name


def _site(path: str, line: int, function: str) -> tuple[str, str, str]:
    return frame_site(path, line, user_function(function))


def _first_user_frame(stack: list[Any]) -> tuple[str, str, str]:
    """The innermost frame of a Dynamo user stack outside torch and perf, as a site."""
    for fs in reversed(stack):
        if not fs.filename.startswith(SKIP_DIRS):
            return _site(fs.filename, fs.lineno, fs.name)
    if stack:  # all inside torch/perf: the innermost is still the best name
        fs = stack[-1]
        return _site(fs.filename, fs.lineno, fs.name)
    return "<unknown>", "", ""


def break_label(reason: str) -> str:
    """Dynamo's graph-break type: the first line of a ``GraphCompileReason.reason``.

    A data-dependent jump is recorded as ``generic_jump <value>`` (torch 2.13,
    ``InstructionTranslatorBase.jump_graph_break``), whose ``Unsupported`` graph-break type is
    ``"Data-dependent branching"``: it is named by that type.
    """
    first = reason.strip().splitlines()[0].strip() if reason.strip() else "unknown"
    if first.startswith("generic_jump"):
        return "Data-dependent branching"
    return first


_FRAME_IDS = re.compile(r"^(\d+)/(\d+)$")
_COMPILE_ID = re.compile(r"^\s*\[?\d+/\d+\]?:\s*")
_SOURCE_COMMENT = re.compile(r"\s+#\s.*$")
# torch 2.11's Dynamo names a guard on a Python-float lr through a tensor wrapper
# (``___as_tensor(self.param_groups[0]['lr']).item() == 0.025``; 2.13 strips it): the value
# guarded is the same, so the label is too.
_AS_TENSOR = re.compile(r"___as_tensor\((.+?)\)\.item\(\)")


def recompile_label(reason: str) -> str:
    """A guard failure as a short key: ``"0/0: lr == 0.1   # return p - lr * g  # ..."`` ->
    ``"lr == 0.1"`` (first line, without the compile id and the source comment Dynamo adds)."""
    first = reason.strip().splitlines()[0] if reason.strip() else "unknown"
    label = _SOURCE_COMMENT.sub("", _COMPILE_ID.sub("", first)).strip() or first.strip()
    return _AS_TENSOR.sub(r"\1", label)


def _add_site(sites: dict[str, dict[str, Any]], site: tuple[str, str, str], what: str) -> None:
    key, fn, code = site
    info = sites.setdefault(key, {"n": 0, "function": fn, "code": code, "what": []})
    info["n"] += 1
    if what not in info["what"]:
        info["what"].append(what)


def _finish_sites(sites: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``what`` as one short text: the first event at the site, and how many other kinds."""
    for info in sites.values():
        first, others = info["what"][0], len(info["what"]) - 1
        info["what"] = first + (f" and {others} other" + "s" * (others > 1) if others else "")
    return sites


def _us(v: Any) -> float:
    return v / 1e6 if isinstance(v, (int, float)) else 0.0


def _only_perfs_modes_differ() -> bool:
    """Inside Dynamo's compile of a frame (its start callback): whether one of the frame's
    cache entries passes its guards for this call once perf's torch-function modes are taken
    off the stack, or, with none on it, once one is put on, or once the GPU model recorder's
    dispatch key is switched (an entry compiled inside
    ``count_syncs`` and run outside it): the program without perf would have run compiled
    code instead. Reads ``convert_frame._compile``'s arguments (``locals``,
    ``cache_entries_for_reasons``, torch 2.13); anything unexpected answers False, so the
    compile counts as the program's."""
    import sys

    from perf.instruments.modes import FUNCTION_MODES

    f: Any = sys._getframe(1)
    while f is not None and not (
        f.f_code.co_name == "_compile" and f.f_code.co_filename.endswith("convert_frame.py")
    ):
        f = f.f_back
    recorder = _recorder()
    if f is None or not (FUNCTION_MODES or recorder):
        return False
    user_locals = f.f_locals.get("locals")
    entries = f.f_locals.get("cache_entries_for_reasons")
    if not isinstance(user_locals, dict) or not entries:
        return False
    ours = tuple(FUNCTION_MODES)
    c = torch._C
    saved = [c._pop_torch_function_stack() for _ in range(c._len_torch_function_stack())][::-1]
    others = [m for m in saved if not isinstance(m, ours)]
    # perf's modes on the stack: try without them; none on it: each kind on top (its type is
    # what the guard checks; the instance is never called)
    tries = [others] if len(others) < len(saved) else [[*others, object.__new__(k)] for k in ours]
    # the GPU model's recorder adds its dispatch key to the thread's set, which Dynamo's
    # tensor guards read: try the other setting of the key too
    included = bool(recorder and recorder.rec_included())
    keys = [included, not included] if recorder else [included]
    try:
        for key in keys:
            if recorder:
                recorder.rec_include(key)
            stacks = tries if key == included else [saved, *tries]
            if any(_passes(entries, user_locals, stack) for stack in stacks):
                return True
        return False
    except Exception:  # a guard that cannot be evaluated here: the program's compile
        return False
    finally:
        _set_function_mode_stack(saved)
        if recorder:
            recorder.rec_include(included)


def _recorder() -> Any:
    """``sim``'s C++ module where its recorder may have been on (``perf.sim.native``), else
    None."""
    from perf.sim import native

    mod = native.module()
    return mod if mod is not None and hasattr(mod, "rec_include") else None


def _set_function_mode_stack(modes: list[Any]) -> None:
    c = torch._C
    while c._len_torch_function_stack():
        c._pop_torch_function_stack()
    for m in modes:
        c._push_on_torch_function_stack(m)


def _passes(entries: list[Any], user_locals: dict[str, Any], stack: list[Any]) -> bool:
    """Whether a cache entry's guards pass for these locals with ``stack`` as the modes."""
    _set_function_mode_stack(stack)
    return any(bool(e.guard_manager.check(user_locals)) for e in entries)


def dynamo_callbacks() -> Any:
    """Dynamo's compile callback handler (start / end of each frame compile), or None."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:  # pragma: no cover - another torch: no attribution, counts as before
        return None
    needed = ("register_start_callback", "register_end_callback", "remove_start_callback")
    return callback_handler if all(hasattr(callback_handler, n) for n in needed) else None


class CompileCounter:
    """Snapshots of Dynamo's bookkeeping at entry; :meth:`result` is the difference."""

    def __init__(self) -> None:
        self._counters, self._breaks, self._utils = _dynamo()
        self._graphs0 = self._counters["stats"]["unique_graphs"]
        self._frames0 = self._counters["frames"]["ok"]
        self._cache0 = self._cache_lookups()
        self._breaks0 = len(self._breaks)
        self._breaks_tail = self._breaks[-1] if self._breaks else None
        self._frame_counter0 = self._frame_counter()
        metrics = self._utils.get_compilation_metrics()
        self._metrics0 = len(metrics)
        # Dynamo keeps the last 64 records; keep all of this block's, restore the limit after.
        self._limit: int | None = getattr(self._utils._compilation_metrics, "maxlen", None)
        self._utils.set_compilation_metrics_limit(max(self._limit or 0, 1 << 20))
        # frame recompiles that only perf's torch-function mode caused: compile id ->
        # [graphs, first break index, end break index] (-1 until the compile ended)
        self._perf_mode: dict[str, list[int]] = {}
        self._callbacks = dynamo_callbacks()
        if self._callbacks is not None:
            self._callbacks.register_start_callback(self._compile_start)
            self._callbacks.register_end_callback(self._compile_end)

    def _compile_start(self, args: Any) -> None:
        if _only_perfs_modes_differ():
            self._perf_mode[str(args.compile_id)] = [
                self._counters["stats"]["unique_graphs"],
                len(self._breaks),
                -1,
            ]

    def _compile_end(self, args: Any) -> None:
        rec = self._perf_mode.get(str(args.compile_id))
        if rec is not None and rec[2] < 0:
            rec[0] = self._counters["stats"]["unique_graphs"] - rec[0]
            rec[2] = len(self._breaks)

    def _cache_lookups(self) -> tuple[int, int]:
        """Inductor's FX graph cache (hits, misses) so far."""
        ind = self._counters.get("inductor", {}) if hasattr(self._counters, "get") else {}
        return int(ind.get("fxgraph_cache_hit", 0)), int(ind.get("fxgraph_cache_miss", 0))

    def _cache_state(self) -> str:
        h1, m1 = self._cache_lookups()
        hits, misses = h1 - self._cache0[0], m1 - self._cache0[1]
        if hits and misses:
            return "mixed"
        return "warm" if hits else "cold" if misses else "none"

    @staticmethod
    def _frame_counter() -> int:
        """Dynamo's frame id counter: it only grows, except in ``torch._dynamo.reset()``."""
        import torch._dynamo.convert_frame as convert_frame

        return int(getattr(convert_frame, "FRAME_COUNTER", 0))

    def _was_reset(self, graphs: int, metrics: list[Any]) -> bool:
        b, n0 = self._breaks, self._breaks0
        if (
            len(b) < n0
            or (n0 > 0 and b[n0 - 1] is not self._breaks_tail)
            or self._frame_counter() < self._frame_counter0
            or graphs < 0
            or len(metrics) < self._metrics0
        ):
            return True
        # A frame's first compile ("7/0") takes the next frame id; reset() starts them at 0 again.
        last = self._frame_counter0 - 1
        for m in metrics[self._metrics0 :]:
            ids = _FRAME_IDS.match(str(m.compile_id or ""))
            # Inductor on CUDA tunes its Triton kernels at their first run and records that
            # (``is_runtime``) under the compile's id: not a new compile, so not a restarted
            # frame counter (seen with torch 2.11 on an H200; 2.13 records it the same way)
            runtime = getattr(m, "is_runtime", False)
            if m.is_forward is False or runtime or ids is None or ids.group(2) != "0":
                continue
            if int(ids.group(1)) <= last:
                return True
            last = int(ids.group(1))
        return False

    def close(self) -> None:
        if self._limit is not None:
            self._utils.set_compilation_metrics_limit(self._limit)
            self._limit = None
        if self._callbacks is not None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove_start_callback(self._compile_start)
                self._callbacks.remove_end_callback(self._compile_end)
            self._callbacks = None

    def _instrument_compiles(self, metrics: list[Any]) -> dict[str, list[int]]:
        """The block's frame recompiles that only perf's mode caused: compile id -> record."""
        out = {}
        for m in metrics:
            cid = str(m.compile_id or "")
            rec = self._perf_mode.get(cid)
            if rec is not None and rec[2] >= 0:  # recorded only where an entry existed
                out[cid] = rec
        return out

    def result(self) -> CompileCount:
        graphs = self._counters["stats"]["unique_graphs"] - self._graphs0
        frames = self._counters["frames"]["ok"] - self._frames0
        metrics = self._utils.get_compilation_metrics()
        if self._was_reset(graphs, metrics):
            raise CompileCountError(
                "Dynamo's records were cleared inside count_compiles() (torch._dynamo.reset() "
                "or counters.clear()); reset before entering the block, not inside it"
            )
        ours = self._instrument_compiles(metrics[self._metrics0 :])
        skip = {i for rec in ours.values() for i in range(rec[1], rec[2])}
        graphs -= sum(rec[0] for rec in ours.values())
        frames -= len(ours)  # Dynamo counts a frame "ok" once its compile returned
        reasons: Counter[str] = Counter()
        sites: dict[str, dict[str, Any]] = {}
        n_breaks = 0
        for i, r in enumerate(list(self._breaks)[self._breaks0 :], self._breaks0):
            if not getattr(r, "graph_break", True) or i in skip:
                continue
            n_breaks += 1
            label = break_label(r.reason)
            reasons[label] += 1
            _add_site(sites, _first_user_frame(list(r.user_stack)), f"graph break ({label})")
        rec_reasons: Counter[str] = Counter()
        rec_sites: dict[str, dict[str, Any]] = {}
        compiles = []
        instrument = []
        total = dynamo = aot = backend = backward = 0.0
        for m in metrics[self._metrics0 :]:
            if str(m.compile_id or "") in ours:
                if m.is_forward is not False and not getattr(m, "is_runtime", False):
                    instrument.append((user_function(m.co_name or ""), str(m.compile_id)))
                continue
            if m.is_forward is False:
                backward += _us(getattr(m, "backward_cumulative_compile_time_us", None))
                continue
            if getattr(m, "is_runtime", False):
                continue
            frame_s = _us(m.dynamo_cumulative_compile_time_us)
            aot_s = _us(getattr(m, "aot_autograd_cumulative_compile_time_us", None))
            ind_s = _us(getattr(m, "inductor_cumulative_compile_time_us", None))
            total += frame_s
            backend += ind_s
            aot += max(aot_s - ind_s, 0.0) if aot_s else 0.0
            dynamo += max(frame_s - max(aot_s, ind_s), 0.0)
            why = m.recompile_reason or ""
            compiles.append((m.co_name or "", str(m.compile_id or ""), why))
            if why:
                label = recompile_label(why)
                rec_reasons[label] += 1
                path, line = m.co_filename or "<unknown>", m.co_firstlineno or 0
                _add_site(rec_sites, _site(path, line, m.co_name or ""), f"recompile ({label})")
        return CompileCount(
            graphs=graphs,
            frames=frames,
            graph_breaks=n_breaks,
            break_reasons=dict(reasons),
            break_sites=_finish_sites(sites),
            recompiles=sum(rec_reasons.values()),
            recompile_reasons=dict(rec_reasons),
            recompile_sites=_finish_sites(rec_sites),
            compile_s=total + backward,
            dynamo_s=dynamo,
            aot_s=aot,
            backend_s=backend,
            backward_s=backward,
            compiles=tuple(compiles),
            cache=self._cache_state(),
            instrument_recompiles=tuple(instrument),
        )


class _CompileProxy(Live):
    def __init__(self, counter: CompileCounter) -> None:
        self._counter = counter

    def _snapshot(self) -> CompileCount:
        return self._final if self._final is not None else self._counter.result()


@contextlib.contextmanager
def count_compiles() -> Iterator[_CompileProxy]:
    """Count what ``torch.compile`` does inside the block: graphs, graph breaks (named by
    their line), recompiles (named by the guard that failed) and compile time.

    Works on every device (Dynamo's counts do not depend on the backend or the device).
    Compiled code that was compiled before the block and runs inside it adds nothing: only
    compilation is counted. Raises :class:`CompileCountError` on a torch without the
    bookkeeping it reads (tested: torch 2.13.0).
    """
    counter = CompileCounter()
    proxy = _CompileProxy(counter)
    try:
        yield proxy
    finally:
        try:
            proxy._final = counter.result()
        finally:
            counter.close()
