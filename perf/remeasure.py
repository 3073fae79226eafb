"""Re-measuring suspect tests in a fresh pytest process (pyperf's lesson: the process is the
unit of replication).

Measured on the 2-core dev VM: a pure-Python loop ran 14.6% slower in one whole pytest
process *and* in its in-process re-measurement, a per-process bias (memory layout, which
core, what else the host did) that re-running inside the same process cannot remove. So a
suspected regression is confirmed by child processes that run only the suspects, with the
user's own options minus everything that would save, compare, report, distribute or stop
early.

Pure functions here; :mod:`perf.plugin_gate` runs the child.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

#: Options dropped together with their value (``--opt VALUE`` or ``--opt=VALUE``).
_WITH_VALUE = frozenset(
    {
        "--benchmark-save",
        "--benchmark-json",
        "--perf-report",
        "--perf-remeasure",
        "--perf-child-out",
        "--perf-against",
        "--perf-pairs",
        "--junitxml",
        "--junit-xml",
        "--basetemp",
        "-n",
        "--numprocesses",
        "--maxprocesses",
        "--dist",
        "--tx",
        "--pdbcls",
        "--lfnf",
        "--last-failed-no-failures",
    }
)
#: Options whose value is optional (argparse ``nargs="?"``): the next word is theirs unless
#: it looks like an option, exactly as argparse decides.
_OPTIONAL_VALUE = frozenset(
    {"--benchmark-compare", "--benchmark-histogram", "--benchmark-cprofile-dump", "--cache-show"}
)
#: Options taking one or more values (``nargs="+"``).
_MANY_VALUES = frozenset({"--benchmark-compare-fail"})
#: Flags dropped: saving, gating, cache-driven selection (the child runs without the cache
#: plugin, so its options would be unknown there), debuggers.
_FLAGS = frozenset(
    {
        "--benchmark-autosave",
        "--perf-strict",
        "--lf",
        "--last-failed",
        "--ff",
        "--failed-first",
        "--nf",
        "--new-first",
        "--cache-clear",
        "--sw",
        "--stepwise",
        "--sw-skip",
        "--stepwise-skip",
        "--sw-reset",
        "--stepwise-reset",
        "--pdb",
        "--trace",
        "--looponfail",
        "-f",
    }
)


def filter_args(args: Sequence[str], positionals: Iterable[str] = ()) -> list[str]:
    """The user's pytest arguments minus test paths and the options a re-measuring child
    must not inherit (see the sets above). Everything else (``-p``, ``-o``, ``-c``,
    ``--rootdir``, ``-m``, ``-k``, ``--perf-devices``, ``--benchmark-min-rounds``, ...) is
    kept, so the child collects and times the suspects the way this run did.
    """
    drop_pos = set(positionals)
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        name = a.split("=", 1)[0] if a.startswith("--") else a
        attached = a.startswith("--") and "=" in a
        if a.startswith("-n") and len(a) > 2 and not a.startswith("--"):
            i += 1  # -n2, -nauto
            continue
        if name in _FLAGS:
            i += 1
        elif name in _WITH_VALUE:
            i += 1 if attached else 2
        elif name in _OPTIONAL_VALUE:
            i += 1
            if not attached and i < len(args) and not args[i].startswith("-"):
                i += 1
        elif name in _MANY_VALUES:
            i += 1
            if not attached:
                while i < len(args) and not args[i].startswith("-"):
                    i += 1
        elif a in drop_pos:
            i += 1
        else:
            out.append(a)
            i += 1
    return out


def child_env(environ: Mapping[str, str], torch_threads: int | None) -> dict[str, str]:
    """A child's environment: this one, with ``PYTEST_ADDOPTS`` filtered like the command line
    and the parent's torch intra-op threads (part of the fingerprint; they may come from xdist
    core sharing or a conftest, and a conftest that sets them runs in the child as well)."""
    env = dict(environ)
    if torch_threads is not None:
        env["OMP_NUM_THREADS"] = str(torch_threads)
    if env.get("PYTEST_ADDOPTS"):
        env["PYTEST_ADDOPTS"] = shlex.join(filter_args(shlex.split(env["PYTEST_ADDOPTS"])))
    return env


def absolute_nodeid(nodeid: str, rootpath: Path) -> str:
    """``tests/x.py::test[a]`` -> ``/abs/root/tests/x.py::test[a]`` (valid from any cwd)."""
    path, sep, rest = nodeid.partition("::")
    return str(rootpath / path) + sep + rest


def child_command(
    args: Sequence[str],
    positionals: Iterable[str],
    nodeids: Sequence[str],
    rootpath: Path,
    out_path: Path,
    *,
    xdist_loaded: bool,
    python: str = sys.executable,
) -> list[str]:
    """The command line of a child that re-runs ``nodeids`` and writes its run to ``out_path``."""
    cmd = [python, "-m", "pytest", *filter_args(args, positionals)]
    cmd += ["-p", "no:cacheprovider", "-q", f"--perf-child-out={out_path}"]
    if xdist_loaded:
        cmd += ["-n", "0"]  # addopts may ask for workers; the child must run serially
    cmd += [absolute_nodeid(n, rootpath) for n in nodeids]
    return cmd
