"""The gate from the outside, as a careless user, a hostile PR and a busy CI runner drive it
(issue 17): each case runs real pytest on a real git repository, and asserts what the user is
told, the exit status and what is left on disk. The gate's children are always fresh
processes; the run itself is one too wherever a signal is sent or the environment differs,
else it runs in this process (``run_here``).

The fault-injection layer: interrupts (SIGINT, SIGTERM) and kills (SIGKILL) at each phase
of a ``--perf-against`` run (before the first child, while a child runs, between pairs) and
unreadable stores (a full disk while saving: ``test_gate_plugin.py``'s EFBIG tests).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _runs import GATE_RUN_ARGS

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}

# The step sleeps: a CPU neighbour cannot fake or hide a 3x change, so no test here is a
# perf_timing one (none waits for the suite's timing lock under xdist).
TEST_STEP = """
import os, time
import perf
import work

def test_step(perf_metrics):
    with open("pids.log", "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    if os.environ.get("PERF_FAULT_SELF_SIGINT"):  # the run itself, before any child starts
        import signal
        os.kill(os.getpid(), signal.SIGINT)
    perf_metrics.record("step_time_s", perf.measure(lambda: time.sleep(work.STEP_S), number=1,
                                                    samples=8, warmup=1))
    perf_metrics.record("calls", work.CALLS, unit="calls")

def test_plain():
    assert True
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
    ).stdout.strip()


def make_project(root: Path, *, ini: str = "", test: str = TEST_STEP) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(f'[tool.pytest.ini_options]\npythonpath = ["."]\n{ini}')
    (root / "test_step.py").write_text(test)
    (root / "work").mkdir(exist_ok=True)
    (root / "work" / "__init__.py").write_text("STEP_S = 0.002\nCALLS = 3\n")
    (root / ".gitignore").write_text("pids.log\n.benchmarks/\n*.xml\n*.md\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "first")
    return root


def pytest_cmd(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        *GATE_RUN_ARGS,
        *args,
    ]


def child_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "GITHUB_STEP_SUMMARY")
    }
    return {**env, **extra}


def _sigint_as_at_a_terminal() -> None:
    """A process started in the background by a non-interactive shell (``cmd &``, as a CI
    script may start this suite) inherits SIGINT *ignored*, and Python then installs no
    KeyboardInterrupt handler: the pytest under test gets Ctrl-C's default, as at a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(
    repo: Path, *args: str, env: dict[str, str] | None = None, **kw: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pytest_cmd(*args),
        cwd=repo,
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=_sigint_as_at_a_terminal,
        **kw,
    )


def run_here(pytester: pytest.Pytester, repo: Path, *args: str, **env: str) -> pytest.RunResult:
    """:func:`run`'s command in this process (pytester, in-process), for a case that sends no
    signal: torch is imported here already, so the run's machine fingerprint is free, where a
    fresh process would spend about 2 s of CPU importing torch for it. Its children are fresh
    processes as always."""
    with pytest.MonkeyPatch.context() as mp:
        for var in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "GITHUB_STEP_SUMMARY"):
            mp.delenv(var, raising=False)
        for var, value in env.items():
            mp.setenv(var, value)
        mp.chdir(repo)
        return pytester.runpytest(*pytest_cmd(*args)[3:])


def pids(repo: Path) -> list[int]:
    p = repo / "pids.log"
    return [int(x) for x in p.read_text().split()] if p.exists() else []


def worktrees(repo: Path) -> str:
    return git(repo, "worktree", "list")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("gate") / "proj")


@pytest.fixture(autouse=True)
def _fresh_log(repo: Path) -> None:
    (repo / "pids.log").unlink(missing_ok=True)


# -- usage errors, before any test runs ------------------------------------------------------


def test_unusable_refs_are_usage_errors_before_any_test(repo: Path, tmp_path: Path) -> None:
    r = run(repo, "--perf-against=")  # --perf-against="$BASE_SHA" with BASE_SHA unset
    assert r.returncode == 4, r.stdout + r.stderr
    assert "--perf-against is empty (an unset CI variable" in r.stderr
    r = run(repo, "--perf-against=HEAD; touch x")
    assert r.returncode == 4
    assert "--perf-against='HEAD; touch x': 'HEAD; touch x' is not a valid git revision" in (
        r.stderr
    )
    assert "fetch" not in r.stderr and not (repo / "x").exists()
    r = run(repo, "--perf-against=HEAD\x1b[2J")
    assert r.returncode == 4 and "\x1b" not in r.stderr and "'HEAD\\x1b[2J'" in r.stderr
    nogit = tmp_path / "bin"
    nogit.mkdir()
    r = run(repo, "--perf-against=HEAD", env=child_env(PATH=str(nogit)))
    assert r.returncode == 4
    assert "git is not installed or not on PATH" in r.stderr
    assert pids(repo) == []  # no test ran in any of these


# -- --perf-against's own report; children keep off the parent's files -------------------------


def test_against_alone_writes_report_and_summary_children_keep_off_junit(
    tmp_path: Path, pytester: pytest.Pytester
) -> None:
    # fixed samples: the subject is where reports go, and an A/A of identical samples
    # settles in one pair
    fixed = TEST_STEP.replace(
        "perf.measure(lambda: time.sleep(work.STEP_S), number=1,\n"
        "                                                    samples=8, warmup=1)",
        'perf.Timing((work.STEP_S,) * 8, number=1, device="cpu")',
    )
    assert fixed != TEST_STEP
    proj = make_project(tmp_path / "p", ini='addopts = "--junitxml=junit.xml"\n', test=fixed)
    summary = tmp_path / "summary.md"
    r = run_here(
        pytester,
        proj,
        "--perf-against=:/first",
        "--perf-pairs=5",
        "--perf-report=r.md",
        GITHUB_STEP_SUMMARY=str(summary),
    )
    assert r.ret == 0, r.stdout.str() + r.stderr.str()
    assert len(pids(proj)) >= 3  # the run and at least one pair
    junit = (proj / "junit.xml").read_text()
    assert 'tests="2"' in junit, junit  # this run's two tests, not a child's one
    for text in ((proj / "r.md").read_text(), summary.read_text()):
        assert "## perf gate against `:/first`" in text
        assert "passed: 0 regressions" in text
    # -o addopts on the command line is passed to children too: still the parent's file
    (proj / "junit.xml").unlink()
    r = run_here(
        pytester,
        proj,
        "--perf-against=HEAD",
        "--perf-pairs=5",
        "-o",
        "addopts=--junitxml=junit2.xml",
    )
    assert r.ret == 0, r.stdout.str() + r.stderr.str()
    assert 'tests="2"' in (proj / "junit2.xml").read_text()


# -- what the base side runs --------------------------------------------------------------------


def test_a_package_in_a_submodule_is_taken_at_refs_submodule_commit(
    tmp_path: Path, pytester: pytest.Pytester
) -> None:
    sub = tmp_path / "worklib"
    sub.mkdir()
    (sub / "work").mkdir()
    (sub / "work" / "__init__.py").write_text("STEP_S = 0.002\nCALLS = 3\n")
    git(sub, "init", "-q")
    git(sub, "add", "-A")
    git(sub, "commit", "-qm", "v1")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["lib"]\n')
    (proj / "test_step.py").write_text(TEST_STEP)
    (proj / ".gitignore").write_text("pids.log\n")
    git(proj, "init", "-q")
    git(proj, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "lib")
    git(proj, "add", "-A")
    git(proj, "commit", "-qm", "v1")
    (proj / "lib" / "work" / "__init__.py").write_text("STEP_S = 0.002\nCALLS = 5\n")
    git(proj / "lib", "commit", "-qam", "v2: more calls")
    git(proj, "commit", "-qam", "bump submodule")
    r = run_here(pytester, proj, "--perf-against=HEAD~1", "--perf-pairs=5")
    # the base side ran the submodule's v1 code: 5 calls against 3 is a regression
    assert r.ret == 1, r.stdout.str() + r.stderr.str()
    assert "REGRESS" in r.stdout.str() and "calls" in r.stdout.str()
    assert "perf-base-" not in worktrees(proj) + worktrees(proj / "lib")


def test_a_module_missing_at_ref_shows_the_base_childs_error(
    tmp_path: Path, pytester: pytest.Pytester
) -> None:
    proj = make_project(tmp_path / "p")
    (proj / "work" / "helper.py").write_text("X = 1\n")
    (proj / "test_step.py").write_text(
        TEST_STEP.replace("import work\n", "import work\nimport work.helper\n")
    )
    git(proj, "add", "-A")
    git(proj, "commit", "-qm", "helper")
    r = run_here(pytester, proj, "--perf-against=HEAD~1", "--perf-pairs=5")
    assert "No module named 'work.helper'" in r.stdout.str(), r.stdout.str()
    assert "timings on a busy machine" not in r.stdout.str()


# -- fault injection: interrupts and kills at each phase ------------------------------------------


def test_ctrl_c_before_the_first_child_is_pytests_interruption(repo: Path) -> None:
    r = run(repo, "--perf-against=HEAD", env=child_env(PERF_FAULT_SELF_SIGINT="1"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "KeyboardInterrupt" in r.stdout and "Traceback" not in r.stderr
    assert len(pids(repo)) == 1  # no child started
    assert "perf-base-" not in worktrees(repo)


def _start_and_signal(repo: Path, lines: int, sig: int) -> tuple[subprocess.Popen[str], list[int]]:
    """Start a --perf-against run and send ``sig`` once ``lines`` processes ran the test
    (1: the run itself, 2: the first child, 4: the first child of the second pair)."""
    proc = subprocess.Popen(
        pytest_cmd("--perf-against=HEAD", "--perf-pairs=8"),
        cwd=repo,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_as_at_a_terminal,
    )
    deadline = time.monotonic() + 300
    while len(pids(repo)) < lines:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, sig)
    return proc, pids(repo)


@pytest.mark.parametrize(
    ("sig", "lines", "said", "banner"),
    [
        # while the first child runs
        (signal.SIGINT, 2, "KeyboardInterrupt while measuring", "!!! KeyboardInterrupt !!!"),
        # between pairs: the second pair has begun
        (
            signal.SIGTERM,
            4,
            "SIGTERM while measuring",
            "!!! perf.gate.processes.Terminated: SIGTERM",
        ),
    ],
)
def test_an_interrupted_gate_cleans_up_and_says_so(
    repo: Path, sig: int, lines: int, said: str, banner: str
) -> None:
    proc, seen = _start_and_signal(repo, lines, sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, out + err
    assert f"interrupted: {said}" in out
    assert banner in out.replace("!!!!", "!!!")
    assert "Traceback" not in err and "INTERNALERROR" not in out
    assert "perf-base-" not in worktrees(repo)
    assert not any(alive(p) for p in seen[1:])  # no child outlives the gate


def test_a_killed_gate_takes_its_children_along_and_the_next_run_cleans_up(repo: Path) -> None:
    proc, seen = _start_and_signal(repo, 2, signal.SIGKILL)
    proc.communicate(timeout=60)
    child = seen[1]
    for _ in range(100):
        if not alive(child):
            break
        time.sleep(0.1)
    assert not alive(child)  # PR_SET_PDEATHSIG: the kernel killed it with its parent
    assert "perf-base-" in worktrees(repo)  # SIGKILL leaves no chance to clean up
    r = run(repo, "--perf-against=HEAD", "--collect-only", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "removed the base worktree" in r.stdout and "left by a killed run" in r.stdout
    assert "perf-base-" not in worktrees(repo)


# -- fault injection: the store -------------------------------------------------------------------


# in-process, pytest-benchmark's "nothing saved" / "can't compare" warnings reach this run
@pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")
def test_unreadable_stores_stop_the_gate_naming_the_file(
    tmp_path: Path, pytester: pytest.Pytester
) -> None:
    proj = make_project(tmp_path / "p")
    assert run_here(pytester, proj, "--benchmark-autosave").ret == 0
    (saved,) = (proj / ".benchmarks" / "perf").glob("*/0001_*.json")
    cut = saved.with_name("0002_cut.json")  # a writer killed without perf's atomic save
    cut.write_bytes(saved.read_bytes()[:100])
    r = run_here(pytester, proj, "--benchmark-compare=2")
    assert r.ret == 4, r.stdout.str() + r.stderr.str()
    assert f"ERROR: baseline {cut}: truncated JSON" in r.stdout.str().replace("\n", "")
    assert cut.read_bytes() == saved.read_bytes()[:100]  # untouched
    big = saved.with_name("0003_big.json")
    with open(big, "wb") as fh:
        fh.truncate(100 * 2**20)
    r = run_here(pytester, proj, "--benchmark-compare=3")
    assert r.ret == 4
    assert "more than a run file may have" in r.stdout.str()
