"""Fresh pytest processes that re-run some of this session's tests (:class:`Children`): one
command, one environment, one timeout for every child perf starts."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from perf.gate.against import AgainstOutcome
    from perf.gate.verdict import Policy
    from perf.store.runs import Run

#: A child that runs longer than this is abandoned (the verdict says so).
CHILD_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Children:
    """Fresh pytest processes that re-run some of this session's tests and write their run
    (stored-run JSON) to a file: the user's configuration, none of their saving, gating,
    reporting or distribution (:func:`perf.gate.remeasure.filter_args`)."""

    config: pytest.Config

    def command(self, nodeids: list[str], out: Path, *, no_reference: bool = False) -> list[str]:
        from perf.gate import remeasure

        config = self.config
        positionals = config.args if config.args_source == pytest.Config.ArgsSource.ARGS else []
        cmd = remeasure.child_command(
            config.invocation_params.args,
            positionals,
            nodeids,
            config.rootpath,
            out,
            xdist_loaded=config.pluginmanager.hasplugin("xdist"),
        )
        if no_reference:  # pairs cancel the machine's drift: the reference would cost time only
            cmd[3:3] = ["--perf-no-reference"]
        # Reports a child could inherit from ini addopts (or -o addopts) go to its own
        # temporary folder: a later option wins, and the parent's files stay the parent's.
        own = [f"--junitxml={out.parent / (out.stem + '.junit.xml')}"]
        if config.pluginmanager.hasplugin("benchmark"):
            own += [
                f"--benchmark-storage=file://{out.parent / (out.stem + '.benchmarks')}",
                f"--benchmark-json={out.parent / (out.stem + '.benchmark.json')}",
            ]
        first_test = len(cmd) - len(nodeids)
        cmd[first_test:first_test] = own
        return cmd

    def env(self, measure_scale: float = 1.0) -> dict[str, str]:
        from perf.core.devices import fingerprint
        from perf.gate import remeasure
        from perf.instruments.timing import MEASURE_SCALE_ENV
        from perf.plugin.options import MEMVIZ_DIR_ENV, memviz_dir

        torch = sys.modules.get("torch")  # same intra-op threads as this session, if in use
        env = remeasure.child_env(
            os.environ, torch.get_num_threads() if torch else None, fingerprint()
        )
        env.pop(MEASURE_SCALE_ENV, None)
        env.pop("GITHUB_STEP_SUMMARY", None)  # the parent's report, never a child's
        env[MEMVIZ_DIR_ENV] = str(memviz_dir(self.config).resolve())  # not the project root
        if measure_scale > 1:
            env[MEASURE_SCALE_ENV] = str(measure_scale)
        return env

    @property
    def cwd(self) -> Path:
        return self.config.invocation_params.dir

    def run(self, nodeids: list[str], attempt: int) -> tuple[Run | None, str | None]:
        """Run ``nodeids`` once in this tree; the child's run, or None and why not."""
        from perf.gate import processes
        from perf.store.runs import load
        from perf.store.schema import BaselineError

        with tempfile.TemporaryDirectory(prefix="perf-remeasure-") as tmp:
            out = Path(tmp) / "run.json"
            try:
                proc = processes.run(
                    self.command(nodeids, out),
                    cwd=self.cwd,
                    env=self.env(),
                    timeout_s=CHILD_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired:
                return None, f"re-measurement {attempt} timed out after {CHILD_TIMEOUT_S:.0f} s"
            if not out.exists():
                tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
                return None, (
                    f"re-measurement {attempt} wrote no results (exit {proc.returncode}): "
                    + " | ".join(tail)
                )
            try:
                return load(out), None
            except BaselineError as e:
                return None, f"re-measurement {attempt}: {e}"

    def interleave(
        self,
        session: pytest.Session,
        repo: Path,
        commit: str,
        margins: dict[tuple[str, str], float],
        units: dict[tuple[str, str], str],
        all_nodeids: list[str],
        policy: Policy,
        budget_s: float | None = None,
    ) -> AgainstOutcome:
        """:func:`perf.gate.against.interleave` with these children and this session's packages;
        Ctrl-C or SIGTERM is reported the way pytest reports one (exit status 2) and raised
        as :class:`perf.gate.settle.MeasurementInterrupted`."""
        from perf.gate import against, processes
        from perf.gate.base_tree import project_roots
        from perf.gate.paired import MEASURE_SCALE
        from perf.gate.settle import MeasurementInterrupted

        kids = self
        project = project_roots(sys.modules, repo, [str(item.path) for item in session.items])
        try:
            with processes.terminate_as_interrupt():
                return against.interleave(
                    repo=repo,
                    commit=commit,
                    project=project,
                    head_cmd=lambda ids, out: kids.command(ids, out, no_reference=True),
                    env=kids.env(measure_scale=MEASURE_SCALE),
                    cwd=kids.cwd,
                    margins=margins,
                    units=units,
                    all_nodeids=all_nodeids,
                    max_pairs=self.config.getoption("--perf-pairs"),
                    confidence=policy.confidence,
                    max_load_skew=policy.busy_cpu_fraction
                    if policy.busy_cpu_fraction < 1
                    else None,
                    timeout_s=CHILD_TIMEOUT_S,
                    budget_s=budget_s,
                )
        except KeyboardInterrupt as e:
            # pytest's own handling of Ctrl-C ends before sessionfinish: report it the way
            # pytest does (exit status 2, "!!! KeyboardInterrupt !!!"), after the worktree
            # and the running child were removed on the way out.
            what = "SIGTERM" if isinstance(e, processes.Terminated) else "KeyboardInterrupt"
            why = (
                f"{what} while measuring against {commit[:12]}: the running child was "
                "stopped and the base worktree removed; no timing verdict"
            )
            self.config.hook.pytest_keyboard_interrupt(
                excinfo=pytest.ExceptionInfo.from_exception(e)
            )
            session.exitstatus = pytest.ExitCode.INTERRUPTED
            raise MeasurementInterrupted(why) from None
