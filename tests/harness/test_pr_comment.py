"""The PR-comment step of docs/ci.md, run exactly as written: one comment per pull request,
found again by its hidden marker and updated in place; a fork's pull request is skipped.

The real ``gh`` cannot reach GitHub here, so a stand-in on ``PATH`` plays the REST API of
issue comments (list, create, update) over a JSON file, records every call, and applies
``--jq`` with the real ``jq``, so the step's own filter is what selects the comment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="reading the documented step needs PyYAML (test extra)")
if shutil.which("jq") is None:
    pytest.skip("the documented step uses jq (on GitHub-hosted runners); not on PATH here",
                allow_module_level=True)  # fmt: skip

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- pytest-torch-perf -->"
REPO = "acme/train"

#: A ``pull_request`` event as GitHub writes it to ``GITHUB_EVENT_PATH`` (trimmed to the
#: fields a step may read: numbers, repositories, refs).
EVENT: dict[str, Any] = {
    "action": "synchronize",
    "number": 42,
    "pull_request": {
        "number": 42,
        "state": "open",
        "head": {"ref": "faster-loader", "sha": "1" * 40, "repo": {"full_name": REPO}},
        "base": {"ref": "main", "sha": "2" * 40, "repo": {"full_name": REPO}},
    },
    "repository": {"full_name": REPO},
}

FAKE_GH = r"""
import json, os, subprocess, sys

state_path, log_path = os.environ["FAKE_GH_STATE"], os.environ["FAKE_GH_LOG"]
args = sys.argv[1:]
with open(log_path, "a") as fh:
    fh.write(json.dumps(args) + "\n")
assert args[0] == "api", args
state = json.load(open(state_path))
method, jq, fields, path, i = "GET", None, {}, None, 1
while i < len(args):
    a = args[i]
    if a == "--method":
        method, i = args[i + 1], i + 2
    elif a == "--jq":
        jq, i = args[i + 1], i + 2
    elif a == "-F":
        k, _, v = args[i + 1].partition("=")
        fields[k] = open(v[1:]).read() if v.startswith("@") else v
        i += 2
    elif a == "--paginate":
        i += 1
    else:
        path, i = a, i + 1
parts = path.split("/")
if method == "GET" and parts[3:] == ["issues", parts[4], "comments"] and parts[5:] == ["comments"]:
    out = json.dumps([c for c in state["comments"] if c["issue"] == int(parts[4])])
    if jq:
        out = subprocess.run(["jq", "-r", jq], input=out, capture_output=True, text=True,
                             check=True).stdout
    sys.stdout.write(out)
elif method == "POST" and parts[5:] == ["comments"]:
    c = {"id": state["next"], "issue": int(parts[4]), "user": {"login": "github-actions[bot]"},
         "body": fields["body"]}
    state["next"] += 1
    state["comments"].append(c)
    print(json.dumps(c))
elif method == "PATCH" and parts[3:5] == ["issues", "comments"]:
    (c,) = [c for c in state["comments"] if c["id"] == int(parts[5])]
    c["body"] = fields["body"]
    print(json.dumps(c))
else:
    sys.exit(f"fake gh: unexpected call {args}")
json.dump(state, open(state_path, "w"))
"""


def _step() -> dict[str, Any]:
    text = (ROOT / "docs" / "ci.md").read_text()
    m = re.search(r"<!-- perf-pr-comment-step -->\n```yaml\n(.*?)\n```", text, re.S)
    assert m, "docs/ci.md: the PR-comment step block is gone"
    (step,) = yaml.safe_load(m.group(1))
    return step  # type: ignore[no-any-return]


class FakeGitHub:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.bin.mkdir()
        gh = self.bin / "gh"
        gh.write_text(f"#!{sys.executable}\n{FAKE_GH}")
        gh.chmod(0o755)
        self.state = tmp / "state.json"
        self.state.write_text(json.dumps({"next": 1001, "comments": []}))
        self.log = tmp / "calls.jsonl"
        self.log.write_text("")
        self.work = tmp / "work"
        self.work.mkdir()

    @property
    def comments(self) -> list[dict[str, Any]]:
        return json.loads(self.state.read_text())["comments"]  # type: ignore[no-any-return]

    @property
    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def add(self, login: str, body: str, issue: int = 42) -> None:
        state = json.loads(self.state.read_text())
        state["comments"].append(
            {"id": state["next"], "issue": issue, "user": {"login": login}, "body": body}
        )
        state["next"] += 1
        self.state.write_text(json.dumps(state))

    def run(self, report: str, event: dict[str, Any] = EVENT) -> subprocess.CompletedProcess[str]:
        step = _step()
        (self.work / "perf-report.md").write_text(report)
        event_path = self.tmp / "event.json"
        event_path.write_text(json.dumps(event))
        script = self.tmp / "step.sh"
        script.write_text(step["run"])
        assert step["env"] == {"GH_TOKEN": "${{ github.token }}"}
        env = {
            **os.environ,
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "GH_TOKEN": "token-for-the-test",
            "GITHUB_EVENT_PATH": str(event_path),
            "GITHUB_REPOSITORY": REPO,
            "FAKE_GH_STATE": str(self.state),
            "FAKE_GH_LOG": str(self.log),
        }
        return subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=self.work, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip


@pytest.fixture
def gh(tmp_path: Path) -> FakeGitHub:
    return FakeGitHub(tmp_path)


def test_step_runs_on_pull_requests_with_a_report_only():
    cond = _step()["if"]
    assert "github.event_name == 'pull_request'" in cond
    assert "hashFiles('perf-report.md')" in cond and "always()" in cond


def test_first_run_posts_later_runs_update_the_same_comment(gh: FakeGitHub):
    p = gh.run("## perf gate\n\n❌ failed: 1 regressions\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "perf report: posted a comment on #42"
    (c,) = gh.comments
    assert c["body"] == f"{MARKER}\n## perf gate\n\n❌ failed: 1 regressions\n"
    p = gh.run("## perf gate\n\n✅ passed\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"perf report: updated comment {c['id']} on #42"
    (c2,) = gh.comments
    assert c2["id"] == c["id"] and c2["body"] == f"{MARKER}\n## perf gate\n\n✅ passed\n"
    methods = [
        next((a[i + 1] for i, a_ in enumerate(a) if a_ == "--method"), "GET") for a in gh.calls
    ]
    assert methods == ["GET", "POST", "GET", "PATCH"]
    assert gh.calls[0][:3] == ["api", "--paginate", f"repos/{REPO}/issues/42/comments"]


def test_a_persons_comment_quoting_the_marker_is_left_alone(gh: FakeGitHub):
    gh.add("octocat", f"{MARKER}\nquoted from the bot")
    gh.add("github-actions[bot]", "an unrelated bot comment")
    gh.add("github-actions[bot]", f"{MARKER}\nold report", issue=7)  # another PR's
    p = gh.run("## perf gate\n")
    assert p.returncode == 0, p.stderr
    bodies = [(c["user"]["login"], c["issue"], c["body"]) for c in gh.comments]
    assert bodies[:3] == [
        ("octocat", 42, f"{MARKER}\nquoted from the bot"),
        ("github-actions[bot]", 42, "an unrelated bot comment"),
        ("github-actions[bot]", 7, f"{MARKER}\nold report"),
    ]
    assert bodies[3] == ("github-actions[bot]", 42, f"{MARKER}\n## perf gate\n")


def test_fork_pull_request_is_skipped_with_a_notice(gh: FakeGitHub):
    fork = json.loads(json.dumps(EVENT))
    fork["pull_request"]["head"]["repo"]["full_name"] = "someone/train"
    p = gh.run("## perf gate\n", event=fork)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("::notice title=perf report::not posted: a fork's pull request")
    assert gh.calls == [] and gh.comments == []


def test_a_long_report_is_cut_below_githubs_comment_limit(gh: FakeGitHub):
    p = gh.run("x" * 100_000)
    assert p.returncode == 0, p.stderr
    (c,) = gh.comments
    assert len(c["body"]) == len(MARKER) + 1 + 60_000 < 65_536
