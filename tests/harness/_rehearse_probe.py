"""pytest plugin of test_rehearse_cuda (``-p _rehearse_probe``): what a run collected, what
skips at collection and why, and which tests use the simulated device, read from their code.

Why read the code: a test that installs the simulated device in a process with CUDA fails on
the GPU runner, but finding that out by running the suite takes minutes. A test "uses sim"
when its function, a function or fixture of its module that it calls or requests, or a
module-level string it names (a pytester test's source) names ``simulated_device`` or
``SIM``; it "moves sim to a CPU-only child" when that code names ``CUDA_VISIBLE_DEVICES``.
Writes JSON to ``$REHEARSE_PROBE_OUT`` at the end of collection.
"""

from __future__ import annotations

import inspect
import json
import os
import types
from typing import Any

import pytest

SIM_NAMES = {"simulated_device", "SIM"}
_collect_skips: list[dict[str, Any]] = []


def _names(code: types.CodeType, out: set[str], strings: list[str]) -> None:
    out.update(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _names(c, out, strings)
        elif isinstance(c, str):
            strings.append(c)
        elif isinstance(c, tuple):  # keyword names of a call: dict(env, CUDA_VISIBLE_DEVICES="")
            strings.extend(x for x in c if isinstance(x, str))


def reaches_sim(fn: Any, fixturenames: list[str]) -> str | None:
    """The test's code, a function or fixture of its module that it calls or requests, or a
    module-level string it names (a pytester test's code) uses the simulated device."""
    fn = inspect.unwrap(fn) if fn is not None else None
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    mod_globals = fn.__globals__

    def code_of(obj: Any) -> types.CodeType | None:
        if not callable(obj):
            return None
        obj = inspect.unwrap(obj)
        if getattr(obj, "__module__", None) != fn.__module__:
            return None
        return getattr(obj, "__code__", None)

    todo = [code] + [c for n in fixturenames if (c := code_of(mod_globals.get(n)))]
    seen: set[int] = set()
    found: str | None = None
    while todo:
        c = todo.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        names: set[str] = set()
        strings: list[str] = []
        _names(c, names, strings)
        strings += [g for n in names if isinstance(g := mod_globals.get(n), str)]
        if any("CUDA_VISIBLE_DEVICES" in s for s in strings):
            return "child"
        if names & SIM_NAMES or any("simulated_device(" in s for s in strings):
            found = "in-process"
        todo += [gc for n in names if (gc := code_of(mod_globals.get(n)))]
    return found


def _skip_reason(item: pytest.Item) -> str | None:
    for m in item.iter_markers("skip"):
        return str(m.kwargs.get("reason", m.args[0] if m.args else "unconditional skip"))
    for m in item.iter_markers("skipif"):
        conds = m.args or (m.kwargs.get("condition"),)
        if any(isinstance(c, bool) and c for c in conds):
            return str(m.kwargs.get("reason", ""))
    return None


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _collect_skips.append({"nodeid": report.nodeid, "reason": str(reason)})


def pytest_collection_finish(session: pytest.Session) -> None:
    items = []
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        items.append(
            {
                "nodeid": item.nodeid,
                "skip": _skip_reason(item),
                "sim": reaches_sim(getattr(item, "obj", None), list(item.fixturenames)),
                "device": str(params["device"]) if "device" in params else None,
            }
        )
    with open(os.environ["REHEARSE_PROBE_OUT"], "w", encoding="utf-8") as fh:
        json.dump({"items": items, "collect_skips": _collect_skips}, fh)
