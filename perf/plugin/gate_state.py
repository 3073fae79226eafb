"""The stored gate's options, ini values and per-session state, shared by the gate's hooks
(:mod:`perf.plugin.gate`), its report (:mod:`perf.plugin.gate_report`) and the timing gate
(:mod:`perf.plugin.timing_gate`), which all import it and none of each other."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from perf.core import contention as _contention
    from perf.gate import compare as _gate
    from perf.gate import validate as _validate
    from perf.store import baseline as _baseline
    from perf.store import environment as _environment
else:

    class _Lazy:
        """A module imported on first attribute access: loading the plugin must not import
        numpy / torch (perf.gate.compare) in test runs that never gate."""

        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, attr: str) -> Any:
            import importlib

            return getattr(importlib.import_module(self._name), attr)

    _baseline = _Lazy("perf.store.baseline")
    _contention = _Lazy("perf.core.contention")
    _environment = _Lazy("perf.store.environment")
    _gate = _Lazy("perf.gate.compare")
    _validate = _Lazy("perf.gate.validate")

#: Exit status when perf could not write the run, ``--perf-report`` or the step summary
#: (disk full, read-only, a folder in the way) and nothing else failed. Not 1: that means
#: "regression / failed tests"; not 2-5: pytest's own (interrupted, internal error, usage
#: error, no tests). A CI script can tell "the code got slower" from "the runner's disk".
EXIT_NOT_WRITTEN = 6


@dataclass
class _State:
    """What this session asked for and what the gate found (mutable: filled as we go)."""

    save_name: str | None = None
    compare: str | bool | None = None
    strict: bool = False
    workers: int = 0
    reference: bool = True
    reference_start: list[float] = field(default_factory=list)
    cpu_start: _contention.CpuSnapshot | None = None
    #: Set in a re-measuring child: where to write its run instead of saving or gating.
    child_out: str | None = None
    result: _gate.GateResult | None = None
    #: The (baseline, current) runs behind ``result``: their metrics hold the sites that
    #: GitHub annotations point at (:mod:`perf.report.annotations`).
    runs: tuple[Any, Any] | None = None
    baseline_missing: str | None = None
    error: str | None = None
    saved: Path | None = None
    save_skipped: str | None = None
    #: Why this run is partial (stopped early, failed tests); stored with the run.
    partial: str | None = None
    collect_errors: int = 0
    #: Session-end write failures, each naming the path and the OS error.
    not_written: list[str] = field(default_factory=list)
    #: No test recorded a perf metric: perf saves, gates and prints nothing.
    quiet: bool = False
    #: Saved times flagged ``noisy`` ("nodeid metric" -> why), for the terminal.
    noisy: dict[str, str] = field(default_factory=dict)


STATE_KEY = pytest.StashKey[_State]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perf", "PyTorch performance properties (perf)")
    group.addoption(
        "--perf-report",
        metavar="PATH",
        default=None,
        help="Write the gate's Markdown report to PATH (it is also appended to "
        "$GITHUB_STEP_SUMMARY when that is set).",
    )
    group.addoption(
        "--perf-strict",
        action="store_true",
        default=False,
        help="With --benchmark-compare: fail when there is no baseline to compare with "
        "(default: a message and a passing run, e.g. the first run on a new runner).",
    )
    group.addoption(
        "--perf-remeasure",
        metavar="N",
        type=int,
        default=2,
        help="Re-run a test whose timing looks regressed in up to N fresh pytest processes "
        "before failing it; every re-measurement must confirm the regression "
        "(default 2; 0: never).",
    )
    group.addoption("--perf-child-out", default=None, help=argparse.SUPPRESS)
    group.addoption(
        "--perf-no-reference",
        action="store_true",
        default=False,
        help="Do not time the reference workload: saves ~1 s, but times are then judged "
        "raw, without reference normalisation (for quiet machines or sleep-bound tests; "
        "ini perf_busy_cpu_fraction = 1 also turns the busy-CPU check off).",
    )
    # Defaults come from perf.gate.compare.Policy when the value is empty ("" = unset):
    # importing the gate here would import numpy and torch in every pytest run.
    for kind in ("time", "ratio", "bytes"):
        parser.addini(
            f"perf_{kind}_tolerance",
            f"default relative margin for {kind} metrics (default: perf.gate.compare.Policy)",
            default="",
        )
    parser.addini(
        "perf_environment_change",
        "warn (default) or fail: what a timing gets that the stored baseline finds slower "
        "while its code measures as fast as the baseline's commit's here (interleaved), when "
        "a recorded difference that plausibly matters (packages, thread / allocator "
        "variables, machine) is the likely cause",
        default="",
    )
    parser.addini(
        "perf_undecided",
        "warn (default) or fail: what a timing verdict still undecided after settling does "
        "to the exit status (warn: exit 0, an UNDECIDED section, a ::warning on GitHub Actions)",
        default="",
    )
    parser.addini(
        "perf_settle_budget_s",
        "seconds of interleaved re-measurement (baseline's commit vs HEAD) one stored-gate "
        "session may spend settling doubtful and undecided timings (default 60)",
        default="",
    )
    parser.addini(
        "perf_busy_cpu_fraction",
        "times taken while other processes used more than this share of the CPUs are "
        "inconclusive (1 turns the check off, e.g. for sleep-bound tests; "
        "default: perf.gate.compare.Policy)",
        default="",
    )
    parser.addini(
        "perf_gate_benchmark",
        "true: pytest-benchmark's `benchmark` times also become perf metrics, stored with "
        "--benchmark-autosave and gated by perf with --benchmark-compare (default false: "
        "pytest-benchmark's behaviour unchanged)",
        type="bool",
        default=False,
    )
    parser.addini(
        "perf_machine_info",
        "true: add torch / CUDA / cuDNN versions, GPUs, driver and torch threads to "
        "pytest-benchmark's machine_info (default false: its keys unchanged)",
        type="bool",
        default=False,
    )


def _opt(config: pytest.Config, name: str, default: Any = None) -> Any:
    """pytest-benchmark's option, or ``default`` when pytest-benchmark is not loaded."""
    try:
        return config.getoption(name, default)
    except ValueError:
        return default


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


def _policy_inis_set(config: pytest.Config) -> bool:
    inis = (*_POLICY_INIS.values(), "perf_environment_change", "perf_undecided",
            "perf_settle_budget_s")  # fmt: skip
    return any(str(config.getini(ini)).strip() for ini in inis)


def policy_from_config(config: pytest.Config) -> _gate.Policy:
    kwargs: dict[str, Any] = {
        field_: _ini_fraction(config, ini)
        for field_, ini in _POLICY_INIS.items()
        if str(config.getini(ini)).strip()
    }
    for field_, ini in (("environment_change", "perf_environment_change"),
                        ("undecided", "perf_undecided")):  # fmt: skip
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
        return _gate.Policy(**kwargs)
    except ValueError as e:
        raise pytest.UsageError(f"perf ini: {e}") from None


def _ini_bool(config: pytest.Config, name: str) -> bool:
    try:
        return bool(config.getini(name))
    except ValueError:
        raise pytest.UsageError(
            f"ini {name} = {config.inicfg.get(name)!r} is not a boolean (true or false)"
        ) from None


def _workers(config: pytest.Config) -> int:
    if _opt(config, "dist", "no") in ("no", None):
        return 0
    n = _opt(config, "numprocesses", 0)
    return int(n) if isinstance(n, int) else 2


def _active(config: pytest.Config) -> bool:
    st = config.stash.get(STATE_KEY, None)
    return (
        st is not None
        and not hasattr(config, "workerinput")
        and (st.save_name is not None or st.compare is not None or bool(st.child_out))
    )


#: Set once this session wrote ``--perf-report``: a later writer (``--perf-against``) appends.
REPORT_WRITTEN_KEY = pytest.StashKey[bool]()


def write_markdown(config: pytest.Config, text: str) -> list[str]:
    """Write ``text`` to ``--perf-report`` (the first writer of the session replaces the
    file, later ones append) and append it to ``$GITHUB_STEP_SUMMARY``; returns what could
    not be written, each naming the path and the OS error."""
    import os

    problems = []
    path = config.getoption("--perf-report")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            mode = "a" if config.stash.get(REPORT_WRITTEN_KEY, False) else "w"
            with open(path, mode, encoding="utf-8") as fh:
                fh.write(text if mode == "w" else "\n" + text)
            config.stash[REPORT_WRITTEN_KEY] = True
        except OSError as e:
            problems.append(f"could not write --perf-report {path}: {_validate.os_error_text(e)}")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as e:
            problems.append(
                f"could not append to $GITHUB_STEP_SUMMARY {summary}: {_validate.os_error_text(e)}"
            )
    return problems
