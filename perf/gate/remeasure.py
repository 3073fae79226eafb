"""Re-measuring suspect tests in a fresh pytest process (pyperf's lesson: the process is the
unit of replication).

Measured on the 2-core dev VM: a pure-Python loop ran 14.6% slower in one whole pytest
process *and* in its in-process re-measurement, a per-process bias (memory layout, which
core, what else the host did) that re-running inside the same process cannot remove. So a
suspected regression is confirmed by child processes that run only the suspects, with the
user's own options minus everything that would save, compare, report, distribute or stop
early.

Pure functions here; :mod:`perf.plugin.gate` runs the child.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

# A child gets the options this run was configured with, not the ones that act on the run
# (pyperf builds its worker command from what it knows). Every option of the families perf
# knows (pytest's own, pytest-benchmark's, xdist's, perf's) is listed here with its arity and
# whether a child keeps it: an option of those families missing from the tables is dropped,
# and a test checks the tables against the installed pytest's ``--help``. Options of other
# plugins and of the project's conftests pass through unchanged: only the project knows what
# they mean, and they often decide *what* a test measures (``--device=cuda``, ``--size``).

#: Arity: 0 a flag, 1 one value, "?" an optional value (argparse ``nargs="?"``), "+" one or
#: more values.
Arity = int | str

#: Kept: they decide which configuration, plugins, conftests and import mode load, how
#: warnings, capture, assertions and logging behave, and how tests time and parametrise.
KEEP: dict[str, Arity] = {
    "-c": 1, "--config-file": 1, "--rootdir": 1, "--confcutdir": 1, "--noconftest": 0,
    "-p": 1, "--disable-plugin-autoload": 0, "-o": 1, "--override-ini": 1,
    "--import-mode": 1, "--pyargs": 0, "-W": 1, "--pythonwarnings": 1,
    "--strict-markers": 0, "--strict-config": 0, "--strict": 0, "--capture": 1, "-s": 0,
    "--assert": 1, "--runxfail": 0, "--log-level": 1, "--log-disable": 1,
    "--log-format": 1, "--log-date-format": 1, "--keep-duplicates": 0,
    "--collect-in-virtualenv": 0, "--continue-on-collection-errors": 0,
    "--benchmark-min-time": 1, "--benchmark-max-time": 1, "--benchmark-min-rounds": 1,
    "--benchmark-precision": 1, "--benchmark-confidence": 1, "--benchmark-timer": 1,
    "--benchmark-calibration-precision": 1, "--benchmark-warmup": "?",
    "--benchmark-warmup-iterations": 1, "--benchmark-disable-gc": 0,
    "--benchmark-disable": 0, "--benchmark-enable": 0,
    "--perf-devices": 1, "--perf-sizes": 1, "--perf-no-reference": 0, "--perf-trace-dir": 1,
    "--perf-rehearse-cuda": "?", "--perf-gpu-target": 1,
    "--perf-gpu-host-op-us": 1,
}  # fmt: skip

#: Dropped: selection (the child gets node ids), output and reports, saving and gating,
#: cache-driven selection, debuggers, xdist, help and collection-only modes.
DROP: dict[str, Arity] = {
    "-k": 1, "-m": 1, "--markers": 0, "-x": 0, "--exitfirst": 0, "--maxfail": 1,
    "--fixtures": 0, "--funcargs": 0, "--fixtures-per-test": 0, "--pdb": 0, "--pdbcls": 1,
    "--trace": 0, "--durations": 1, "--durations-min": 1, "-v": 0, "--verbose": 0,
    "--no-header": 0, "--no-summary": 0, "--no-fold-skipped": 0,
    "--force-short-summary": 0, "-q": 0, "--quiet": 0, "--verbosity": 1, "-r": 1,
    "--report-chars": 1, "--disable-warnings": 0, "--disable-pytest-warnings": 0,
    "-l": 0, "--showlocals": 0, "--no-showlocals": 0, "--tb": 1, "--xfail-tb": 0,
    "--show-capture": 1, "--full-trace": 0, "--color": 1, "--code-highlight": 1,
    "--pastebin": 1, "--junit-xml": 1, "--junitxml": 1, "--junit-prefix": 1,
    "--max-warnings": 1, "--collect-only": 0, "--co": 0, "--ignore": 1,
    "--ignore-glob": 1, "--deselect": 1, "--doctest-modules": 0, "--doctest-report": 1,
    "--doctest-glob": 1, "--doctest-ignore-import-errors": 0,
    "--doctest-continue-on-failure": 0, "--basetemp": 1, "-V": 0, "--version": 0,
    "-h": 0, "--help": 0, "--trace-config": 0, "--debug": "?", "--setup-only": 0,
    "--setup-show": 0, "--setup-plan": 0, "--log-cli-level": 1, "--log-cli-format": 1,
    "--log-cli-date-format": 1, "--log-file": 1, "--log-file-mode": 1,
    "--log-file-level": 1, "--log-file-format": 1, "--log-file-date-format": 1,
    "--log-auto-indent": 1,
    "--lf": 0, "--last-failed": 0, "--ff": 0, "--failed-first": 0, "--nf": 0,
    "--new-first": 0, "--cache-show": "?", "--cache-clear": 0, "--lfnf": 1,
    "--last-failed-no-failures": 1, "--sw": 0, "--stepwise": 0, "--sw-skip": 0,
    "--stepwise-skip": 0, "--sw-reset": 0, "--stepwise-reset": 0,
    "-n": 1, "--numprocesses": 1, "--maxprocesses": 1, "--max-worker-restart": 1,
    "--dist": 1, "--tx": 1, "--px": 1, "-d": 0, "--rsyncdir": 1, "--rsyncignore": 1,
    "--maxschedchunk": 1, "-f": 0, "--looponfail": 0, "--loadscope-reorder": 0,
    "--no-loadscope-reorder": 0, "--testrunuid": 1,
    "--benchmark-skip": 0, "--benchmark-only": 0, "--benchmark-save": 1,
    "--benchmark-autosave": 0, "--benchmark-save-data": 0, "--benchmark-json": 1,
    "--benchmark-compare": "?", "--benchmark-compare-fail": "+",
    "--benchmark-cprofile": 1, "--benchmark-cprofile-loops": 1,
    "--benchmark-cprofile-top": 1, "--benchmark-cprofile-dump": "?",
    "--benchmark-storage": 1, "--benchmark-netrc": "?", "--benchmark-verbose": 0,
    "--benchmark-quiet": 0, "--benchmark-sort": 1, "--benchmark-group-by": 1,
    "--benchmark-columns": 1, "--benchmark-name": 1, "--benchmark-time-unit": 1,
    "--benchmark-histogram": "?",
    "--perf-against": 1, "--perf-pairs": 1, "--perf-report": 1, "--perf-strict": 0,
    "--perf-remeasure": 1, "--perf-child-out": 1,
    "--perf-rehearse-stop": 0, "--perf-gpu-per-worker": 0,
}  # fmt: skip

#: Families whose every option is in the tables: an unlisted one is dropped, not passed on.
_KNOWN_FAMILIES = ("--benchmark-", "--perf-")


def _arity(opt: str) -> Arity | None:
    return KEEP.get(opt, DROP.get(opt))


def _short_group(args: Sequence[str], i: int) -> tuple[list[str], int] | None:
    """``args[i]`` as a group of short options (``-sv``, ``-n2``, ``-pno:x``, ``-W error``):
    the kept words and how many words the group used; None when a letter is not perf's."""
    token, kept, j = args[i], [], 1
    while j < len(token):
        opt = "-" + token[j]
        arity = _arity(opt)
        if arity is None:
            return None
        if arity == 0:
            kept += [opt] if opt in KEEP else []
            j += 1
            continue
        if j + 1 < len(token):  # the value is attached: -n2, -pno:xdist
            kept += [opt + token[j + 1 :]] if opt in KEEP else []
            return kept, 1
        if i + 1 < len(args):  # -p NAME
            kept += [opt, args[i + 1]] if opt in KEEP else []
            return kept, 2
        return kept, 1
    return kept, 1


def filter_args(args: Sequence[str], positionals: Iterable[str] = ()) -> list[str]:
    """The arguments a child inherits: the user's, minus test paths and every option that is
    not in :data:`KEEP` (see the tables above); options perf does not know pass through."""
    drop_pos = set(positionals)
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-") and not a.startswith("--") and len(a) >= 2:
            group = _short_group(args, i)
            if group is not None:
                out += group[0]
                i += group[1]
                continue
        name, eq, _ = a.partition("=") if a.startswith("--") else (a, "", "")
        arity = _arity(name)
        if arity is None and name.startswith(_KNOWN_FAMILIES):
            arity = 0  # an unlisted member of a known family: dropped (its value too if "=")
        if arity is None:  # not perf's to judge: passed on as written
            if a not in drop_pos:
                out.append(a)
            i += 1
            continue
        n = 1
        if not eq:
            if arity == 1:
                n = 2
            elif arity in ("?", "+"):
                while i + n < len(args) and not args[i + n].startswith("-"):
                    n += 1
                    if arity == "?":
                        break
        if name in KEEP:
            out += list(args[i : i + n])
        i += n
    return out


#: The parent's machine fingerprint (JSON), handed to its children: see
#: :func:`inherited_fingerprint`.
FINGERPRINT_ENV = "PERF_PARENT_FINGERPRINT"

#: Fields a handed-down fingerprint must have to be taken (perf.core.devices.fingerprint's).
_FINGERPRINT_FIELDS = frozenset(
    {"cpu_model", "cpu_count", "machine", "python", "torch", "torch_threads", "cuda", "gpus"}
)


def child_env(
    environ: Mapping[str, str],
    torch_threads: int | None,
    fingerprint: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """A child's environment: this one, with ``PYTEST_ADDOPTS`` filtered like the command line,
    the parent's torch intra-op threads (part of the fingerprint; they may come from xdist
    core sharing or a conftest, and a conftest that sets them runs in the child as well) and
    the parent's ``fingerprint`` (:func:`inherited_fingerprint`)."""
    env = dict(environ)
    env.pop(FINGERPRINT_ENV, None)
    if torch_threads is not None:
        env["OMP_NUM_THREADS"] = str(torch_threads)
    if fingerprint is not None:
        env[FINGERPRINT_ENV] = json.dumps(dict(fingerprint), sort_keys=True)
    if env.get("PYTEST_ADDOPTS"):
        env["PYTEST_ADDOPTS"] = shlex.join(filter_args(shlex.split(env["PYTEST_ADDOPTS"])))
    return env


def inherited_fingerprint(
    environ: Mapping[str, str], modules: Mapping[str, object] = sys.modules
) -> dict[str, Any] | None:
    """The parent's fingerprint for a child whose tests never imported torch, else None.

    A child runs the parent's interpreter on the parent's machine with the parent's thread
    settings, so its fingerprint is the parent's. Computing it means importing torch (about
    1.5 s of CPU), which a child timing torch-free code would otherwise never pay; a child
    that imported torch computes its own (cheap by then, and it sees what its tests set).
    Anything but a JSON object with the fingerprint's fields is ignored (None)."""
    if "torch" in modules:
        return None
    raw = environ.get(FINGERPRINT_ENV)
    if not raw:
        return None
    try:
        fp = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(fp, dict) or not fp.keys() >= _FINGERPRINT_FIELDS:
        return None
    return fp


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
