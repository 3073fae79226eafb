"""The documentation as a reader uses it: every link of the README resolves, and every code
block marked runnable (a ``<!-- runnable -->`` line before a fenced ``python`` block) runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_RUNNABLE = re.compile(r"<!-- runnable -->\n```python\n(.*?)\n```", re.S)


def _slug(heading: str) -> str:
    """GitHub's (and MyST's ``myst_heading_anchors``) anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # not inside code
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+://", link) or link.startswith("mailto:"):
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading with that anchor")
    assert not broken, broken


def _test_functions() -> dict[str, set[str]]:
    """Test file name -> the functions it defines (this project's tests)."""
    import ast

    out = {}
    for f in (ROOT / "tests").rglob("test_*.py"):
        tree = ast.parse(f.read_text())
        out[f.name] = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    return out


def test_every_test_the_docs_name_exists() -> None:
    """The Reliability and Measurements tables name the test behind each claim: a renamed,
    merged or dropped test must take its row along. ``file.py::name`` of this project's test
    files anywhere, and bare ``test_*`` names on those two pages (elsewhere a bare name may be
    a peer project's or an example's)."""
    defined = _test_functions()
    every = set().union(*defined.values())
    missing = []
    for page in PAGES:
        text = page.read_text()
        for file, name in re.findall(r"(test_\w+\.py)::(test_\w+)", text):
            if file in defined and name not in defined[file]:  # else a user's example file
                missing.append(f"{page.name}: {file}::{name}")
        if page.name in ("reliability.md", "measurements.md"):
            for name in re.findall(r"`(test_\w+)(?:\[[^\]`]*\])?`", text):
                if name not in every:
                    missing.append(f"{page.name}: {name}")
    assert not missing, missing


#: "issue 17", "issues #3", "(#17)": this project's tracker; "pytest-xdist#1386" is fine
TRACKER = re.compile(r"\b[Ii]ssues? #?\d+|(?<![\w/.-])#\d+\b")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_speaks_of_the_tracker(page: Path) -> None:
    """A reader of the docs has no access to this project's tracker: "(issue 17)" says
    nothing to them. Another project's issue is cited by its repository (pytest-xdist#1386)."""
    hits = [
        f"{page.name}:{n}: {line.strip()}"
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if TRACKER.search(line)
    ]
    assert not hits, hits


def test_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def _runnable_blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for i, code in enumerate(_RUNNABLE.findall(page.read_text())):
            out.append((f"{page.relative_to(ROOT)}#{i + 1}", code))
    return out


def test_some_blocks_are_marked_runnable() -> None:
    assert len(_runnable_blocks()) >= 1


@pytest.mark.parametrize("name,code", _runnable_blocks(), ids=[n for n, _ in _runnable_blocks()])
def test_runnable_block_runs(name: str, code: str, tmp_path: Path) -> None:
    # A fresh interpreter: the simulated device must be installed before any backward, as a
    # reader's script would do it. CPU-only, as CI runs them: on a GPU box the blocks that use
    # the simulated device would meet its refusal of a process with CUDA, which says to hide
    # the GPUs as done here.
    r = subprocess.run(
        [sys.executable, "-"],
        input=code,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
    )
    assert r.returncode == 0, f"{name} failed:\n{r.stdout}\n{r.stderr}"


def _api_section_names() -> set[str]:
    """Top-level ``perf.NAME`` documented in api.md's "The public API" section."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("## The public API", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\.\. auto\w+:: perf\.(\w+)\s*$", section, re.M))


def test_api_page_documents_exactly_the_public_names() -> None:
    """``perf.__all__`` is the one list of public names; the reference page follows it."""
    import perf

    documented = _api_section_names()
    assert documented == set(perf.__all__), (
        f"in perf.__all__ but not in docs/api.md: {sorted(set(perf.__all__) - documented)}; "
        f"in docs/api.md but not public: {sorted(documented - set(perf.__all__))}"
    )


def test_every_public_name_resolves() -> None:
    """Every name docs/api.md documents works after a plain ``import perf``."""
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import perf, sys\n"
            "missing = [n for n in perf.__all__ if getattr(perf, n, None) is None]\n"
            "assert not missing, missing\n"
            "assert set(perf.__all__) <= set(dir(perf))\n",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


_WRONG_DIST = re.compile(r"""pip install\s+(?:-\w+\s+)*['"]?perf\b(?!-)""")


def test_install_hints_name_the_distribution() -> None:
    """``perf`` on the package index is another project's name: every ``pip install`` in a
    message or a page names ``pytest-torch-perf`` (or ``.`` from a checkout)."""
    files = [*PAGES, *sorted((ROOT / "perf").rglob("*.py"))]
    hits = [
        f"{f.relative_to(ROOT)}:{n}: {line.strip()}"
        for f in files
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if _WRONG_DIST.search(line)
    ]
    assert not hits, hits


#: characters of a code line the docs theme (furo: a 46em column, code at 81.25% in a
#: monospace font about 0.6em wide, 0.875rem padding each side) shows without scrolling
CODE_WIDTH = 88
_FENCE = re.compile(r"^(`{3,}|~{3,}|:{3,})([^\n]*)\n(.*?)^\1[ \t]*$", re.S | re.M)


def test_code_blocks_fit_the_page() -> None:
    """Code and commands fit the column, wrapped with ``\\`` where long; program output
    (``text`` blocks) keeps its real lines and wraps in the browser (docs/_static/perf.css)."""
    css = (ROOT / "docs" / "_static" / "perf.css").read_text()
    assert "div.highlight-text pre" in css and "pre-wrap" in css
    assert '"perf.css"' in (ROOT / "docs" / "conf.py").read_text()
    wide = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            lang = m.group(2).strip()
            if lang in ("text", "{eval-rst}", "{toctree}"):
                continue
            first = text[: m.start()].count("\n") + 2
            wide += [
                f"{page.name}:{first + i} ({len(line)} chars): {line}"
                for i, line in enumerate(m.group(3).splitlines())
                if len(line) > CODE_WIDTH
            ]
    assert not wide, "\n".join(wide)


def test_every_code_block_names_its_language() -> None:
    """An unlabelled block is highlighted as Python and never wraps: say ``text`` for
    output."""
    bare = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        bare += [
            f"{page.name}:{text[: m.start()].count(chr(10)) + 1}"
            for m in _FENCE.finditer(text)
            if not m.group(2).strip()
        ]
    assert not bare, bare


#: the pages a user reads to use perf (index.md's "Using perf" toctree)
GUIDES = [
    "getting-started.md",
    "writing-tests.md",
    "instruments.md",
    "sim.md",
    "memory.md",
    "compile.md",
    "gating.md",
    "ci.md",
    "gpu.md",
    "gpu-model.md",
]
_PAST = re.compile(
    r"earlier versions?|previous (?:release|version|design)|\(was[:, ]|\bno longer\b"
    r"|before this change|\bused to be\b|\bperf used to\b",
    re.I,
)


def test_guides_are_in_the_toctree_and_speak_of_the_present() -> None:
    """A guide says what perf does; what it used to do is in docs/changelog.md."""
    index = (ROOT / "docs" / "index.md").read_text()
    using = index.split(":caption: Using perf", 1)[1].split("```", 1)[0].split()
    assert using == [g.removesuffix(".md") for g in GUIDES]
    assert "\nchangelog\n" in index
    hits = [
        f"{g}:{n}: {line.strip()}"
        for g in GUIDES
        for n, line in enumerate((ROOT / "docs" / g).read_text().splitlines(), 1)
        if _PAST.search(line)
    ]
    assert not hits, "move past behaviour to docs/changelog.md:\n" + "\n".join(hits)
