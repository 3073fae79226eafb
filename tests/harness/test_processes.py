"""The gate's child processes (:mod:`perf.gate.processes`): a child forked by the warm starter
is indistinguishable to its command from a fresh interpreter, dies with the gate, and its CPU
is the gate's own, never a neighbour's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from perf.core import contention
from perf.gate import processes

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the warm starter forks children on Linux only"
)

PROBE = """\
import json, os, sys
first = "torch" in sys.modules
import torch
print(json.dumps({
    "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
    "env": os.environ.get("PROBE_VALUE"), "stdin": sys.stdin.read(),
    "name": __name__, "torch_at_start": first,
    "session_leader": os.getsid(0) == os.getpid(),
}))
print("to stderr\\r\\nsecond line", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    path = tmp_path / "scripts" / "probe.py"
    path.parent.mkdir()
    path.write_text(PROBE)
    return path


@pytest.fixture(autouse=True)
def _no_starter_left() -> object:
    processes.close_starters()  # one an earlier test of this process left (it should not)
    yield
    processes.close_starters()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != processes.WARM_START_ENV}
    env.pop("PYTHONPATH", None)
    return {**env, **extra}


def _facts(r: subprocess.CompletedProcess[str]) -> dict[str, object]:
    return json.loads(r.stdout)


def test_warm_started_children_see_what_fresh_ones_see(probe: Path, tmp_path: Path) -> None:
    """Script and ``-m`` commands, run fresh and forked: the same arguments, ``sys.path[0]``,
    folder, environment, empty stdin, stdout, stderr (universal newlines) and exit status; the
    first forked child starts bare, later ones find torch imported (the ``-m`` probe skips
    torch: its case is the interpreter's, not the preloading's)."""
    light = probe.parent / "probe_mod.py"
    light.write_text(PROBE.replace("import torch\n", ""))
    cases = {
        "script": ([sys.executable, str(probe), "3", "x"], tmp_path, 3),
        "module": ([sys.executable, "-m", "probe_mod", "4"], probe.parent, 2),
    }
    for name, (cmd, cwd, n_warm) in cases.items():
        fresh = processes.run(
            cmd, cwd=cwd, env=_env(PROBE_VALUE="v", PERF_WARM_START="0"), timeout_s=120
        )
        assert not processes._starters
        warm = [
            processes.run(cmd, cwd=cwd, env=_env(PROBE_VALUE="v"), timeout_s=120)
            for _ in range(n_warm)
        ]
        assert len(processes._starters) == 1
        for r in warm:
            assert r.returncode == fresh.returncode == int(cmd[-1] if name == "module" else 3)
            assert r.stderr == fresh.stderr == "to stderr\nsecond line\n"
            got, want = _facts(r), _facts(fresh)
            assert {k: v for k, v in got.items() if k != "torch_at_start"} == {
                k: v for k, v in want.items() if k != "torch_at_start"
            }
            assert got["name"] == "__main__" and got["stdin"] == "" and got["session_leader"]
        if name == "script":
            assert [_facts(r)["torch_at_start"] for r in warm] == [False, True, True]
            assert _facts(fresh)["torch_at_start"] is False
        else:
            assert _facts(fresh)["path0"] == str(probe.parent)  # -m: the folder it ran in
        processes.close_starters()


ENDINGS = """\
import atexit, sys, threading, time
atexit.register(lambda: print("atexit ran"))
def late():
    time.sleep(0.3)
    print("thread done", flush=True)
threading.Thread(target=late).start()
print("unflushed", end="")
how = sys.argv[1]
if how == "message":
    sys.exit("a message")
if how == "big":
    sys.exit(300)
if how == "raise":
    def inner():
        raise ValueError("boom")
    inner()
if how == "interrupt":
    raise KeyboardInterrupt
"""


@pytest.mark.parametrize("how", ["end", "message", "big", "raise", "interrupt"])
def test_a_forked_child_ends_as_a_fresh_one(tmp_path: Path, how: str) -> None:
    """Without the interpreter's teardown (it ends by ``os._exit``), a forked child still
    joins its threads, runs ``atexit``, flushes its output and exits with the fresh
    interpreter's status (a message: printed, 1; 300: 44; an uncaught exception: its
    traceback from the script's own frames, 1; an uncaught KeyboardInterrupt: SIGINT)."""
    script = tmp_path / "endings.py"
    script.write_text(ENDINGS)
    cmd = [sys.executable, str(script), how]
    fresh = processes.run(cmd, cwd=tmp_path, env=_env(PERF_WARM_START="0"), timeout_s=120)
    for _ in range(2):  # the first child of a starter and a later one
        warm = processes.run(cmd, cwd=tmp_path, env=_env(), timeout_s=120)
        assert (warm.returncode, warm.stdout, warm.stderr) == (
            fresh.returncode,
            fresh.stdout,
            fresh.stderr,
        )
    assert fresh.stdout.startswith("unflushed") and "thread done" in fresh.stdout
    assert fresh.stdout.endswith("atexit ran\n")
    want = {"end": 0, "message": 1, "big": 44, "raise": 1, "interrupt": -signal.SIGINT}
    assert fresh.returncode == want[how]
    if how == "raise":
        assert fresh.stderr.startswith("Traceback") and "in inner" in fresh.stderr


def test_warm_startable_only_where_a_fork_is_a_fresh_start(tmp_path: Path) -> None:
    py = sys.executable
    env = _env()
    assert processes.warm_startable([py, "-m", "pytest", "-q"], env) == ["-m", "pytest", "-q"]
    assert processes.warm_startable([py, "/abs/child.py", "a"], env) == ["/abs/child.py", "a"]
    for cmd in (
        [py, "-X", "importtime", "-m", "pytest"],  # an interpreter option: start-up
        [py, "-c", "pass"],
        [py, "child.py"],  # relative: resolved against a folder the starter does not share
        ["/other/python", "-m", "pytest"],
        [py],
    ):
        assert processes.warm_startable(cmd, env) is None, cmd
    assert processes.warm_startable([py, "-m", "x"], {**env, "PYTHONPATH": "src"}) is None
    assert processes.warm_startable([py, "-m", "x"], {**env, "PERF_WARM_START": "0"}) is None


def _sleeper(tmp_path: Path, seconds: int) -> tuple[Path, Path]:
    """A script that writes its pid to a file, then sleeps: (the script, the pid file)."""
    script, pid_file = tmp_path / "sleeper.py", tmp_path / "sleeper.pid"
    script.write_text(
        f"import os, pathlib, time\npathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
        f"time.sleep({seconds})\n"
    )
    return script, pid_file


def test_a_child_past_its_timeout_or_killed_ends_with_its_status(tmp_path: Path) -> None:
    script, pid_file = _sleeper(tmp_path, 60)
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        processes.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), timeout_s=2)
    assert time.monotonic() - t0 < 30
    assert not _alive(int(pid_file.read_text()))
    killer = tmp_path / "killer.py"
    killer.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    r = processes.run([sys.executable, str(killer)], cwd=tmp_path, env=_env(), timeout_s=60)
    assert r.returncode == -signal.SIGTERM  # as subprocess reports a signal
    assert len(processes._starters) == 1  # the same starter served both


def test_a_gone_starter_means_a_fresh_child_not_a_failure(tmp_path: Path) -> None:
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    cmd = [sys.executable, str(script)]
    assert processes.run(cmd, cwd=tmp_path, env=_env(), timeout_s=60).stdout == "ran\n"
    (starter,) = processes._starters
    starter.proc.kill()
    starter.proc.wait()
    assert processes.run(cmd, cwd=tmp_path, env=_env(), timeout_s=60).stdout == "ran\n"


def test_children_die_with_a_killed_gate(tmp_path: Path) -> None:
    """SIGKILL to the gate: its starter and the child it forked die too (PR_SET_PDEATHSIG)."""
    child, pid_file = _sleeper(tmp_path, 120)
    gate = tmp_path / "gate.py"
    gate.write_text(
        textwrap.dedent(f"""\
        import os, sys
        from perf.gate import processes
        processes.run([sys.executable, {str(child)!r}], cwd={str(tmp_path)!r},
                      env=dict(os.environ), timeout_s=300)
        """)
    )
    root = str(Path(processes.__file__).parents[2])
    proc = subprocess.Popen([sys.executable, str(gate)], env=_env(PYTHONPATH=root))
    deadline = time.monotonic() + 120
    while not pid_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    assert os.getsid(pid) == pid  # forked by the starter, in its own session as a fresh child
    proc.kill()
    proc.wait()
    for _ in range(200):
        if not _alive(pid):
            break
        time.sleep(0.05)
    assert not _alive(pid)


def test_forked_childrens_cpu_is_the_gates_own(tmp_path: Path) -> None:
    """CPU a starter's child burnt counts as this process tree's own while the starter lives
    (else the gate would call its own children a busy neighbour), and once after it ends."""
    burn = tmp_path / "burn.py"
    burn.write_text(
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\n"
    )
    import resource

    def reaped() -> float:
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        return c.ru_utime + c.ru_stime

    before, reaped_before = contention._own_cpu_s(), reaped()
    processes.run([sys.executable, str(burn)], cwd=tmp_path, env=_env(), timeout_s=60)
    assert contention._own_cpu_s() - before >= 0.5
    assert reaped() == reaped_before  # the starter reaped it, not us
    processes.close_starters()
    assert reaped() - reaped_before >= 0.5  # the starter's total arrived with the starter
    assert contention._unreaped_descendants_cpu_s == 0  # so it is no longer counted by hand


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_warm_start_benchmark_runs(tmp_path: Path) -> None:
    """benchmarks/warm_start.py (docs/gating.md), smallest: one base child a gate run."""
    script = Path(__file__).parents[2] / "benchmarks" / "warm_start.py"
    out = tmp_path / "warm.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(script.parents[1]), env.get("PYTHONPATH", "")])
    r = subprocess.run(
        [sys.executable, str(script), "--reps", "1", "--pairs", "0", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(out.read_text())
    assert got["warm"]["children"] == got["fresh"]["children"] == 1
    assert "warm" in r.stdout and "fresh" in r.stdout
