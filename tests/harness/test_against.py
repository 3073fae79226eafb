"""``--perf-against``: base and head code measured alternately (perf.gate.against,
perf.plugin.against)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from _runs import GATE_RUN_ARGS

from perf.core.verdicts import Reason
from perf.gate import against as A
from perf.gate.against_child import EXIT_BASE_IMPORT
from perf.gate.base_tree import (
    OWNER_FILE,
    ImportMap,
    Refused,
    map_to_base,
    missing_commit_problem,
    project_roots,
    remove_stale_worktrees,
    repo_root,
    resolve_commit,
    worktree,
)
from perf.gate.paired import (
    Alternation,
    Pair,
    PairedResult,
    Side,
    Timed,
    bounds,
    decide,
    is_open,
    location,
    lower_rank,
)

# -- the paired verdict (pure) ------------------------------------------------------------------


def test_lower_rank_is_the_binomial_order_statistic() -> None:
    # P(all n pairs on one side of the median) = 0.5**n: n = 4 gives 6.25% > 5%, n = 5 3.1%.
    assert lower_rank(4, 0.95) == 0
    assert lower_rank(5, 0.95) == 1
    assert lower_rank(8, 0.95) == 2  # P(B <= 1) = 9/256 = 3.5%
    with pytest.raises(ValueError, match="cannot bound a median"):
        decide([1.5], 0.1, max_pairs=4)


def test_decide_needs_a_real_and_large_change_and_stops_once_settled() -> None:
    # real: with 5 pairs every ratio must say "slower" (the 1st smallest is the 95% bound)
    assert decide([1.3], 0.10, 5) == "undecided"
    assert decide([1.3] * 4, 0.10, 5) == "undecided"
    assert decide([1.3] * 5, 0.10, 5) == "regression"
    # one pair says "not slower": not a regression, and with a median of 1.3 not unchanged
    # either (issue 28: this was "unchanged"); nothing more can decide it within 5 pairs
    assert decide([1.3, 1.3, 0.99], 0.10, 5) == "undecided"
    assert not is_open([1.3, 1.3, 0.99], 0.10, 5)
    # large: more than half beyond the margin, not every pair (a 15% change, 10% margin)
    assert decide([1.15, 1.12, 1.05, 1.08, 1.2], 0.10, 5) == "regression"
    # unchanged is equivalence: the 95% bounds of the median inside the margin both ways,
    # which takes 5 pairs (all inside); 3 inside are not yet evidence (was "unchanged")
    assert decide([1.05] * 5, 0.10, 5) == "unchanged"
    assert decide([1.05, 1.04, 1.06], 0.10, 5) == "undecided"
    assert is_open([1.05, 1.04, 1.06], 0.10, 5)
    assert decide([1.02], 0.10, 5) == "undecided"
    assert decide([1.02, 0.98], 0.10, 5) == "undecided"
    assert is_open([1.02, 0.98], 0.10, 5)
    assert decide([1.02, 0.98, 1.0, 1.01, 0.99], 0.10, 5) == "unchanged"
    assert decide([0.7] * 5, 0.10, 5) == "improvement"
    assert decide([0.7, 0.7, 0.7, 0.7, 1.01], 0.10, 5) == "undecided"  # was "unchanged"
    # 8 pairs: the 2nd smallest bounds the median, so one stray pair is tolerated
    assert decide([1.3] * 6 + [1.0], 0.10, 8) == "undecided"
    assert decide([1.3] * 7 + [1.0], 0.10, 8) == "regression"
    # a +30% median with two pairs "not slower": undecided, never unchanged (was "unchanged")
    assert decide([1.3] * 6 + [1.0, 1.0], 0.10, 8) == "undecided"
    assert decide([1.0] * 7 + [1.3], 0.10, 8) == "unchanged"  # one stray pair tolerated


def test_bounds_are_ordered_order_statistics_or_unbounded() -> None:
    assert bounds([1.2, 1.1, 1.3, 1.4, 1.25], 5, 0.95) == (1.1, 1.4)
    lo, hi = bounds([1.2], 5, 0.95)  # one pair bounds nothing at 95% (was (1.2, 1.2))
    assert lo == -float("inf") and hi == float("inf")
    lo, hi = bounds([1.2], 4, 0.95)
    assert lo == -float("inf") and hi == float("inf")
    # 2 or 3 of 8 pairs: the full design's 2nd smallest and 2nd largest would cross
    # (issue 28 printed "1.002x [1.014, 0.991]"); the bounds are always low <= high
    for rs in ([1.014, 0.991], [0.311, 0.256, 0.284], [1.0, 1.1, 0.9, 1.05, 0.95, 1.2]):
        lo, hi = bounds(rs, 8, 0.95)
        assert lo <= hi


def test_location_is_the_low_quantile_of_times_and_oriented_ratios() -> None:
    t = {"kind": "time", "value": 3.0, "samples": [1.0, 2.0, 3.0, 4.0, 5.0]}
    assert location(t) == pytest.approx(2.0)
    assert location({"kind": "ratio", "value": 2.0}) == 2.0
    assert location({"kind": "ratio", "value": 2.0, "higher_is_better": True}) == 0.5
    assert location({"kind": "count", "value": 2}) is None
    assert location({"kind": "time", "value": 0.0, "samples": []}) is None


def _metric(v: float) -> dict[str, object]:
    return {"name": "t", "kind": "time", "unit": "s", "value": v, "samples": [v] * 5}


def _fake_child(head_s: float, base_s: float, log: list[str]):
    def run_child(side: Side, nodeids: list[str]) -> tuple[Timed, float | None]:
        log.append(side)
        v = base_s if side == "base" else head_s
        return {(n, "t"): _metric(v) for n in nodeids}, 0.0

    return run_child


def test_alternation_runs_abba_and_stops_when_decided() -> None:
    log: list[str] = []
    alt = Alternation(_fake_child(1.3, 1.0, log), {("t.py::a", "t"): 0.1}, max_pairs=5)
    alt.run()
    assert log == ["base", "head", "head", "base", "base", "head", "head", "base", "base", "head"]
    (res,) = alt.results({})
    assert res.verdict == "regression" and len(res.pairs) == 5
    assert [p.base_first for p in res.pairs] == [True, False, True, False, True]
    assert res.median_ratio == pytest.approx(1.3)

    log.clear()
    alt = Alternation(_fake_child(1.0, 1.0, log), {("t.py::a", "t"): 0.1}, max_pairs=5)
    alt.run()
    assert len(log) == 10  # equivalence at 95% takes 5 pairs inside the margin
    assert alt.results({})[0].verdict == "unchanged"


def test_a_spent_budget_ends_the_pairs_undecided() -> None:
    log: list[str] = []
    alt = Alternation(_fake_child(1.0, 1.0, log), {("t.py::a", "t"): 0.1}, max_pairs=5)
    alt.budget_s = 0.0  # spent after the first pair
    alt.run()
    assert len(log) == 2 and alt.budget_spent
    (res,) = alt.results({})
    assert res.verdict == "undecided" and res.reason is Reason.BUDGET_SPENT
    assert "budget spent" in res.describe()


def test_a_pair_whose_children_saw_different_load_is_set_aside_and_rerun() -> None:
    """A neighbour that came or went between base and head breaks the pair's premise; one
    present during both does not (the ratio cancels it)."""
    shares = iter([0.0, 0.6] + [0.5, 0.5] * 5)  # pair 1 skewed, then steady load

    def run_child(side: Side, nodeids: list[str]) -> tuple[Timed, float | None]:
        v = 1.3 if side == "head" else 1.0
        return {(n, "t"): _metric(v) for n in nodeids}, next(shares)

    alt = Alternation(run_child, {("t.py::a", "t"): 0.1}, max_pairs=5, max_load_skew=0.1)
    alt.run()
    (res,) = alt.results({})
    assert res.verdict == "regression" and len(res.pairs) == 5 and len(res.skewed) == 1
    assert alt.children == 12
    assert "1 pair(s) set aside" in res.describe() and "load changed by 60%" in res.describe()

    # load that keeps changing: at most max_pairs extra children pairs, then inconclusive
    def flapping(side: Side, nodeids: list[str]) -> tuple[Timed, float | None]:
        return {(n, "t"): _metric(1.3 if side == "head" else 1.0) for n in nodeids}, (
            0.6 if side == "head" else 0.0
        )

    alt = Alternation(flapping, {("t.py::a", "t"): 0.1}, max_pairs=5, max_load_skew=0.1)
    alt.run()
    (res,) = alt.results({})
    assert res.verdict == "undecided" and alt.children == 20 and len(res.skewed) == 10


def test_a_child_in_a_slower_machine_state_sets_its_pair_aside() -> None:
    """The dev VM's vCPUs flip between two speeds 2x apart: a base child measured wholly in
    the slow state would vote "faster" for a slower head. Judged within one side only."""
    base_s = iter([2.0] + [1.0] * 9)

    def run_child(side: Side, nodeids: list[str]) -> tuple[Timed, float | None]:
        v = 1.3 if side == "head" else next(base_s)
        return {(n, "t"): _metric(v) for n in nodeids}, None

    alt = Alternation(run_child, {("t.py::a", "t"): 0.1}, max_pairs=5)
    alt.run()
    (res,) = alt.results({})
    assert res.verdict == "regression" and len(res.pairs) == 5 and alt.children == 12
    assert res.skewed[0].ratio == pytest.approx(0.65)
    assert res.skew_reasons == ("base child x2.00 its side's fastest",)

    # a head side that is uniformly slower is a change between the sides, never set aside
    alt = Alternation(_fake_child(2.0, 1.0, []), {("t.py::a", "t"): 0.1}, max_pairs=5)
    alt.run()
    (res,) = alt.results({})
    assert res.verdict == "regression" and not res.skewed and alt.children == 10


def test_alternation_runs_only_undecided_tests_and_reports_unmeasured_ones() -> None:
    seen: list[list[str]] = []

    def run_child(side: Side, nodeids: list[str]) -> tuple[Timed, float | None]:
        seen.append(nodeids)
        out: Timed = {}
        for n in nodeids:
            slow = n.endswith("slow") and side == "head"
            if n.endswith("gone") and side == "head":
                continue
            out[(n, "t")] = _metric(1.5 if slow else 1.0)
        return out, None

    keys = {("x::slow", "t"): 0.1, ("x::same", "t"): 0.1, ("x::gone", "t"): 0.1}
    alt = Alternation(run_child, keys, max_pairs=5)
    alt.run()
    assert seen[0] == ["x::gone", "x::same", "x::slow"]
    assert all(ids == ["x::same", "x::slow"] for ids in seen[2:])
    verdicts = {r.nodeid: r.verdict for r in alt.results({})}
    assert verdicts == {"x::slow": "regression", "x::same": "unchanged", "x::gone": "undecided"}
    assert "head side" in alt.missing[("x::gone", "t")]


def test_base_command_swaps_the_module_and_keeps_the_arguments() -> None:
    imap = ImportMap({"pkg": "/tmp/base/src"})
    cmd = A.base_command(imap, ["/py", "-m", "pytest", "-q", "t.py::x"])
    assert cmd[0] == "/py" and cmd[1].endswith("/against_child.py")
    assert ImportMap.from_json(cmd[2]).roots == {"pkg": "/tmp/base/src"}
    assert cmd[3:] == ["-q", "t.py::x"]
    with pytest.raises(ValueError):
        A.base_command(imap, ["/py", "script.py"])


# -- what is mapped -----------------------------------------------------------------------------


def test_project_roots_maps_repo_packages_but_not_tests_perf_or_outside(tmp_path: Path) -> None:
    repo = tmp_path
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "src" / "pkg" / "__init__.py").write_text("")
    (repo / "tests").mkdir()
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "test_a.py").write_text("")
    (repo / "helpers.py").write_text("")

    def mod(file: Path, pkg: bool = False) -> types.ModuleType:
        m = types.ModuleType("m")
        m.__file__ = str(file)
        if pkg:
            m.__path__ = [str(file.parent)]
        return m

    modules = {
        "pkg": mod(repo / "src" / "pkg" / "__init__.py", pkg=True),
        "pkg.sub": mod(repo / "src" / "pkg" / "sub.py"),
        "helpers": mod(repo / "helpers.py"),
        "tests": mod(repo / "tests" / "__init__.py", pkg=True),
        "conftest": mod(repo / "conftest.py"),
        "perf": mod(repo / "perf" / "__init__.py", pkg=True),
        "perf.instruments.timing": mod(repo / "perf" / "timing.py"),
        "perf.workloads": mod(repo / "perf" / "workloads" / "__init__.py", pkg=True),
        "venvpkg": mod(repo / ".venv" / "lib" / "venvpkg" / "__init__.py", pkg=True),
        "os": os,
    }
    tracked = {
        "src/pkg/__init__.py",
        "helpers.py",
        "tests/__init__.py",
        "perf/__init__.py",
        "perf/timing.py",
        "perf/workloads/__init__.py",
        "conftest.py",
    }
    roots = project_roots(modules, repo, [repo / "tests" / "test_a.py"], tracked)
    # in perf's own repository its workloads are code under test; the instrument is not
    assert roots == {"pkg": Path("src"), "helpers": Path("."), "perf.workloads": Path("perf")}


def test_map_to_base_refuses_compiled_extensions_and_missing_packages(tmp_path: Path) -> None:
    repo, base = tmp_path / "repo", tmp_path / "base"
    for root in (repo, base):
        (root / "src" / "pkg").mkdir(parents=True)
        (root / "src" / "pkg" / "__init__.py").write_text("")
    assert map_to_base({"pkg": Path("src")}, repo, base).roots == {"pkg": str(base / "src")}
    (repo / "newmod.py").write_text("")
    with pytest.raises(Refused, match=r"'newmod' .* does not exist .* in the base commit"):
        map_to_base({"newmod": Path(".")}, repo, base)
    import importlib.machinery

    (repo / "src" / "pkg" / f"_c{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    with pytest.raises(Refused, match="compiled extension modules"):
        map_to_base({"pkg": Path("src")}, repo, base)


def _git(repo: Path, *args: str) -> str:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def test_resolve_commit_and_worktree_with_real_git(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "one")
    (tmp_path / "a.txt").write_text("two")
    _git(tmp_path, "commit", "-qam", "two")
    repo = repo_root(tmp_path)
    assert repo == tmp_path.resolve()
    first = resolve_commit(repo, "HEAD~1")
    assert first is not None and len(first) == 40
    assert resolve_commit(repo, "no-such-branch") is None
    assert resolve_commit(repo, "--all") is None  # never an option for git
    with worktree(repo, first) as tree:
        assert (tree / "a.txt").read_text() == "one"
        assert (tmp_path / "a.txt").read_text() == "two"
    assert not tree.exists()
    assert "perf-base-" not in _git(tmp_path, "worktree", "list")


# -- end to end (pytester, real git, fresh processes) -------------------------------------------

PROJECT_TEST = """
import time
import perf
import work

def test_step(perf_metrics):
    perf_metrics.record("step_time_s", perf.measure(lambda: time.sleep(work.STEP_S), number=1,
                                                    samples=12, warmup=1))
    perf_metrics.record("calls", work.CALLS, unit="calls")
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A git project whose package ``work`` (flat layout, on ``pythonpath``) is timed."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\npythonpath = ["."]\n')
    pytester.makepyfile(test_step=PROJECT_TEST)
    (pytester.path / "work").mkdir()
    _git(pytester.path, "init", "-q")
    return pytester


def _commit(p: pytest.Pytester, source: str, msg: str) -> None:
    (p.path / "work" / "__init__.py").write_text(source)
    _git(p.path, "add", "-A")
    _git(p.path, "commit", "-qm", msg)


def _against(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    # sleep-bound workload, so CPU neighbours cannot fake or hide a 2x slowdown: these tests
    # are not perf_timing ones and need not wait for the suite's timing lock under xdist.
    # In-process: this process has torch imported, so the run's machine fingerprint costs
    # nothing (a fresh parent imports torch for it: about 2 s of CPU a run); its children
    # are fresh processes or forks of the gate's warm starter, which ends with the gate.
    from perf.gate import processes

    r = p.runpytest(*GATE_RUN_ARGS, *args)
    assert not processes._starters, "the gate's warm starter outlived its session"
    return r


def test_a_slower_second_commit_is_failed(project: pytest.Pytester) -> None:
    _commit(project, "STEP_S = 0.002\nCALLS = 3\n", "fast")
    _commit(project, "STEP_S = 0.006\nCALLS = 4\n", "slow")
    r = _against(project, "--perf-against=HEAD~1", "--perf-pairs=5")
    assert r.ret == 1, r.stdout.str()
    r.stdout.fnmatch_lines(["*perf gate against HEAD~1*", "*interleaved against HEAD~1*"])
    out = r.stdout.str()
    # all 5 of 5 pairs (with 8, the 7th settles it: test_decide_needs_a_real_and_large_change)
    assert "regression: median head/base" in out and "over 5 of at most 5" in out
    assert "calls" in out and "REGRESS" in out  # the count is gated against the base run too


def test_unchanged_code_passes(project: pytest.Pytester) -> None:
    _commit(project, "STEP_S = 0.002\nCALLS = 3\n", "one")
    (project.path / "README").write_text("docs only")
    _git(project.path, "add", "-A")
    _git(project.path, "commit", "-qm", "docs")
    r = _against(project, "--perf-against=HEAD~1", "-v")
    assert r.ret == 0, r.stdout.str()
    import re

    children = int(re.search(r"interleaved against HEAD~1 .*: (\d+) child runs", r.stdout.str())[1])
    # whole pairs; "unchanged" is an equivalence claim and takes at least 5 pairs (issue 28:
    # it used to stop at the first pair that disagreed on the direction)
    assert children % 2 == 0 and children >= 10
    if "UNDECIDED (" in r.stdout.str():  # a machine too noisy to show equivalence: not a finding
        pytest.skip("this machine could not show the unchanged code equivalent within 8 pairs")
    r.stdout.fnmatch_lines(["*perf gate passed: 0 regressions, 0 improvements, 2 unchanged*"])


def test_children_keep_a_conftest_option_and_drop_selection(project: pytest.Pytester) -> None:
    """Base and head children run with the project's own option (it may decide what a test
    measures) and without the run's selection and output options."""
    project.makeconftest(
        """
        def pytest_addoption(parser):
            parser.addoption("--flavour", default="plain")
        """
    )
    project.makepyfile(
        test_flavour="""
        import os
        import perf

        def test_flavoured(request, perf_metrics):
            with open("flavours.log", "a") as fh:
                fh.write(f"{os.getpid()} {request.config.getoption('flavour')}\\n")
            # fixed samples: the subject is the options (A/A settles in one pair)
            perf_metrics.record("t_s", perf.Timing((0.002,) * 8, number=1, device="cpu"))
        """
    )
    _commit(project, "STEP_S = 0.002\nCALLS = 3\n", "one")
    r = _against(project, "--perf-against=HEAD", "--flavour", "spicy", "-x", "-k", "flavoured")
    assert r.ret == 0, r.stdout.str()
    lines = (project.path / "flavours.log").read_text().splitlines()
    assert len({ln.split()[0] for ln in lines}) >= 3  # this run and at least one pair
    assert {ln.split()[1] for ln in lines} == {"spicy"}


def test_a_missing_commit_is_a_usage_error_before_any_test(project: pytest.Pytester) -> None:
    _commit(project, "STEP_S = 0.002\nCALLS = 3\n", "one")
    r = _against(project, "--perf-against=0123456789abcdef0123")
    assert r.ret == 4
    r.stderr.fnmatch_lines(
        ["*--perf-against=0123456789abcdef0123: no such commit in *fetch-depth*"]
    )
    assert "passed" not in r.stdout.str()


def test_a_base_that_cannot_be_imported_is_refused(project: pytest.Pytester) -> None:
    _commit(project, "raise ImportError('work needs its extension built')\n", "broken")
    _commit(project, "STEP_S = 0.002\nCALLS = 3\n", "fixed")
    r = _against(project, "--perf-against=HEAD~1")
    assert r.ret == 4, r.stdout.str()
    r.stdout.fnmatch_lines(
        [
            "*ERROR: cannot measure HEAD~1*cannot import 'work' from the base tree*needs its "
            "extension built*"
        ]
    )


def test_child_main_loads_mapped_packages_from_the_base_tree(tmp_path: Path) -> None:
    for side, value in (("base", 1), ("head", 2)):
        (tmp_path / side / "pkgx").mkdir(parents=True)
        (tmp_path / side / "pkgx" / "__init__.py").write_text(f"VALUE = {value}\n")
    (tmp_path / "head" / "test_v.py").write_text(
        "import pkgx\n\ndef test_v():\n    assert pkgx.VALUE == 1, pkgx.__file__\n"
    )
    imap = ImportMap({"pkgx": str(tmp_path / "base")})
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "head"))
    env.pop("PYTEST_ADDOPTS", None)
    cmd = A.base_command(
        imap,
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:xdist",
            "-W",
            "error",
            "-p",
            "no:cacheprovider",
            "test_v.py",
        ],
    )
    p = subprocess.run(cmd, cwd=tmp_path / "head", env=env, capture_output=True, text=True)
    # head on sys.path first, base still wins; no assert-rewrite warning under -W error
    assert p.returncode == 0, p.stdout + p.stderr
    (tmp_path / "base" / "pkgx" / "__init__.py").write_text("raise RuntimeError('no build')\n")
    p = subprocess.run(cmd, cwd=tmp_path / "head", env=env, capture_output=True, text=True)
    assert p.returncode == EXIT_BASE_IMPORT, p.stdout + p.stderr
    assert "perf: cannot import 'pkgx' from the base tree" in p.stderr


# -- the stored-baseline gate settles doubtful timings against the baseline's commit -----------
# (a suspect settled as the code's regression: test_gate_env.py's planted code slowdown)


# in-process, pytest-benchmark's "nothing saved" / "no benchmark files" warnings reach this run
@pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")
def test_stored_gate_falls_back_when_the_baseline_commit_is_gone(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-measured in this tree, with children outside the interleaved gate's block of
    starters: the session ends their starter (``_against`` asserts it). Also where the
    ``perf.gate`` package holds another copy of ``perf.gate.processes`` than ``sys.modules``,
    as after pytester's in-process runs restore their snapshots: the gate makes its starter in
    the package's copy, and the session, which looked in ``sys.modules``, left it running (a
    failure that depended on the order xdist gave two test files)."""
    import importlib.util

    import perf.gate
    from perf.gate import processes

    spec = importlib.util.find_spec("perf.gate.processes")
    assert spec is not None and spec.loader is not None
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    monkeypatch.setitem(sys.modules, "perf.gate.processes", other)
    monkeypatch.setattr(perf.gate, "processes", processes)
    _commit(project, "STEP_S = 0.002\nCALLS = 3\n", "fast")
    assert _against(project, "--benchmark-autosave").ret == 0
    gone = _git(project.path, "rev-parse", "HEAD")
    # rewrite history: the commit the baseline names no longer exists anywhere
    _git(project.path, "commit", "-q", "--amend", "-m", "rewritten")
    _git(project.path, "reflog", "expire", "--expire=now", "--all")
    _git(project.path, "gc", "-q", "--prune=now")
    _commit(project, "STEP_S = 0.004\nCALLS = 3\n", "slow")
    r = _against(project, "--benchmark-compare", "--perf-remeasure=1")
    assert r.ret == 1, r.stdout.str()
    r.stdout.fnmatch_lines(
        [f"*the baseline's commit {gone[:12]} is not in *re-measured in this tree only*"]
    )
    assert "re-measured: test_step.py::test_step" in r.stdout.str()


def test_steady_load_during_both_children_is_information_not_a_veto() -> None:
    """A neighbour present during every child slows base and head alike: the pairs still
    judge (busy is reported), where the stored gate would have to give up."""
    from perf.gate.interleaved import paired_rows
    from perf.gate.verdict import Policy

    def outcome(busy: float | None) -> A.AgainstOutcome:
        pairs = tuple(
            Pair(1.0, r, i % 2 == 0, busy, busy)
            for i, r in enumerate([1.17, 1.21, 1.14, 1.16, 1.19])
        )
        res = PairedResult("t.py::x", "t", "s", "regression", pairs, 0.1, 5, 1.14, 1.21)
        return A.AgainstOutcome("c" * 40, (res,), None, 10, 1.0)

    (quiet,) = paired_rows(outcome(0.01), Policy())
    assert quiet.status == "regression" and "shared the machine" not in quiet.reason
    (busy,) = paired_rows(outcome(0.5), Policy())
    assert busy.status == "regression"
    assert "10 of 10 children shared the machine (up to 50% of the CPUs)" in busy.reason
    assert busy.pairs == pytest.approx((1.17, 1.21, 1.14, 1.16, 1.19))  # data, not text


# -- refs as a hostile or careless caller writes them (issue 17, cases 11 and 13) ------------


@pytest.fixture(scope="module")
def two_commits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("refs")
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "the base commit")
    (repo / "a.txt").write_text("two")
    _git(repo, "commit", "-qam", "the head commit")
    return repo.resolve()


def test_colon_slash_message_search_names_a_commit(two_commits: Path) -> None:
    assert resolve_commit(two_commits, ":/base") == _git(two_commits, "rev-parse", "HEAD~1")
    assert resolve_commit(two_commits, ":/no such message") is None


def test_refused_refs_are_quoted_and_fetch_advice_only_fits_commits(two_commits: Path) -> None:
    problem = missing_commit_problem
    hostile = problem(two_commits, "HEAD; touch x")
    assert hostile == "'HEAD; touch x' is not a valid git revision name"
    assert not (two_commits / "x").exists()
    ctl = problem(two_commits, "main\x1b[31m\nx")
    assert "\x1b" not in ctl and "\n" not in ctl and "'main\\x1b[31m\\nx'" in ctl
    tree = _git(two_commits, "rev-parse", "HEAD^{tree}")
    blob = _git(two_commits, "rev-parse", "HEAD:a.txt")
    assert problem(two_commits, tree) == f"{tree} names a tree, not a commit"
    assert problem(two_commits, blob) == f"{blob} names a blob, not a commit"
    assert resolve_commit(two_commits, tree) is None
    gone = problem(two_commits, "0123456789abcdef0123")
    assert "fetch it first" in gone and "git fetch origin 0123456789abcdef0123`" in gone
    assert "git fetch origin feature/x`" in problem(two_commits, "feature/x~2")
    assert "fetch" not in problem(two_commits, "-all")


def test_a_killed_runs_worktree_is_removed_by_the_next_run(two_commits: Path) -> None:
    """A run killed with SIGKILL cannot clean up: its worktree stays registered. The next run
    removes every perf worktree whose owner process is gone, and no other."""
    commit = _git(two_commits, "rev-parse", "HEAD~1")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with worktree(two_commits, commit) as live:
        left = Path(str(live).replace("perf-base-", "perf-base-killed-"))
        _git(two_commits, "worktree", "add", "--detach", "-q", str(left), commit)
        (left.parent / OWNER_FILE).write_text(dead)
        notes = remove_stale_worktrees(two_commits)
        assert notes == [f"removed the base worktree {left} left by a killed run (pid {dead})"]
        listed = _git(two_commits, "worktree", "list")
        assert str(live) in listed and str(left) not in listed  # ours (alive) stays
        assert not left.parent.exists()
    assert "perf-base-" not in _git(two_commits, "worktree", "list")
