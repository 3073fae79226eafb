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
    from perf.store.baseline import Run

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

        torch = sys.modules.get("torch")  # same intra-op threads as this session, if in use
        env = remeasure.child_env(
            os.environ, torch.get_num_threads() if torch else None, fingerprint()
        )
        env.pop(MEASURE_SCALE_ENV, None)
        env.pop("GITHUB_STEP_SUMMARY", None)  # the parent's report, never a child's
        if measure_scale > 1:
            env[MEASURE_SCALE_ENV] = str(measure_scale)
        return env

    @property
    def cwd(self) -> Path:
        return self.config.invocation_params.dir

    def run(self, nodeids: list[str], attempt: int) -> tuple[Run | None, str | None]:
        """Run ``nodeids`` once in this tree; the child's run, or None and why not."""
        from perf.gate import processes
        from perf.store.baseline import BaselineError, load

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
