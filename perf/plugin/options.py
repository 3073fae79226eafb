"""perf's options as the session reads them: pytest-benchmark's (absent when it is not
loaded), perf's ini values and the gate's policy from them, and the folders they choose.
Defaults are :class:`perf.gate.verdict.Policy`'s own (one source); an empty ini value means
unset."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from perf.gate.verdict import Policy

#: Exit status when perf could not write the run, ``--perf-report`` or the step summary
#: (disk full, read-only, a folder in the way) and nothing else failed. Not 1: that means
#: "regression / failed tests"; not 2-5: pytest's own (interrupted, internal error, usage
#: error, no tests). A CI script can tell "the code got slower" from "the runner's disk".
EXIT_NOT_WRITTEN = 6


def benchmark_option(config: pytest.Config, name: str, default: Any = None) -> Any:
    """pytest-benchmark's option, or ``default`` when pytest-benchmark is not loaded."""
    try:
        return config.getoption(name, default)
    except ValueError:
        return default


def ini_bool(config: pytest.Config, name: str) -> bool:
    """A boolean ini value; a usage error naming the value otherwise."""
    try:
        return bool(config.getini(name))
    except ValueError:
        raise pytest.UsageError(
            f"ini {name} = {config.inicfg.get(name)!r} is not a boolean (true or false)"
        ) from None


def _ini_fraction(config: pytest.Config, name: str) -> float:
    raw = str(config.getini(name)).strip()
    try:
        v = float(raw.rstrip("%"))
    except ValueError:
        raise pytest.UsageError(
            f"ini {name} = {raw!r} is not a number (e.g. 0.10 or 10% for 10%)"
        ) from None
    return v / 100.0 if raw.endswith("%") else v


_POLICY_INIS = {
    "time_tolerance": "perf_time_tolerance",
    "ratio_tolerance": "perf_ratio_tolerance",
    "bytes_tolerance": "perf_bytes_tolerance",
    "busy_cpu_fraction": "perf_busy_cpu_fraction",
}
_CHOICE_INIS = {"environment_change": "perf_environment_change", "undecided": "perf_undecided"}
POLICY_INIS = (*_POLICY_INIS.values(), *_CHOICE_INIS.values(), "perf_settle_budget_s")


def policy_from_config(config: pytest.Config) -> Policy:
    """The gate's :class:`perf.gate.verdict.Policy` from the ini values set (the defaults are
    the Policy's own: one source); a usage error naming a bad value."""
    from perf.gate.verdict import Policy

    kwargs: dict[str, Any] = {
        field_: _ini_fraction(config, ini)
        for field_, ini in _POLICY_INIS.items()
        if str(config.getini(ini)).strip()
    }
    for field_, ini in _CHOICE_INIS.items():
        value = str(config.getini(ini)).strip()
        if value:
            kwargs[field_] = value
    budget = str(config.getini("perf_settle_budget_s")).strip()
    if budget:
        try:
            kwargs["settle_budget_s"] = float(budget.removesuffix("s"))
        except ValueError:
            raise pytest.UsageError(
                f"ini perf_settle_budget_s = {budget!r} is not a number of seconds"
            ) from None
    try:
        return Policy(**kwargs)
    except ValueError as e:
        raise pytest.UsageError(f"perf ini: {e}") from None


def xdist_workers(config: pytest.Config) -> int:
    if benchmark_option(config, "dist", "no") in ("no", None):
        return 0
    n = benchmark_option(config, "numprocesses", 0)
    return int(n) if isinstance(n, int) else 2


#: Where a re-measuring child of the gate (which runs without pytest's cache provider, in
#: this tree or in the base commit's worktree) writes its snapshots: its parent's folder,
#: set by :meth:`perf.plugin.children.Children.env`.
MEMVIZ_DIR_ENV = "PERF_MEMVIZ_DIR"


def memviz_dir(config: pytest.Config) -> Path:
    """The snapshots' folder: ``--perf-trace-dir``, else the parent's (in a child), else
    pytest's cache folder ``.pytest_cache/d/perf-memviz`` (its default place when the cache
    provider is off), never the project root."""
    d = config.getoption("--perf-trace-dir", None)
    if d:
        return Path(d)
    inherited = os.environ.get(MEMVIZ_DIR_ENV)
    if inherited:
        return Path(inherited)
    cache = getattr(config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir("perf-memviz"))
    return Path(config.rootpath) / ".pytest_cache" / "d" / "perf-memviz"
