"""The house keeps its floors: each module imports only from its own floor or the floors below,
no two modules import each other (directly or around a circle), and no module grows past
~400 lines unless its docstring says why it must be one piece.

Imports inside functions count too: they are how the plugin stays light at start-up, but a
lazy import that goes upstairs is still a dependency going the wrong way.
"""

from __future__ import annotations

import ast
from pathlib import Path

PERF = Path(__file__).resolve().parents[2] / "perf"

#: sub-package -> floor (design.md, "Layers"); sim is a ground-floor peer of core: it needs
#: nothing of perf, and core.devices offers it as a device.
FLOORS = {
    "core": 1,
    "sim": 1,
    "instruments": 2,
    "workloads": 3,
    "store": 3,
    "gate": 4,
    "report": 4,
    "plugin": 5,
    "__main__": 5,
}
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PERF.rglob("*.py")):
        rel = path.relative_to(PERF.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """perf modules that ``name`` imports anywhere in its body."""
    found: set[str] = set()
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")
                base = ".".join(up[: len(up) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    # The top-level facade (perf/__init__.py) re-exports from every floor on first use; it is
    # the roof, not a floor, and nothing below may import it.
    return {n: _imports(n, p, known) for n, p in mods.items() if n != "perf"}


def _floor(module: str) -> int | None:
    parts = module.split(".")
    return FLOORS.get(parts[1]) if len(parts) > 1 else None


def test_every_subpackage_has_a_floor() -> None:
    subs = {p.name for p in PERF.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert subs - set(FLOORS) == set()


def test_imports_go_down_or_sideways_never_up() -> None:
    wrong = []
    for mod, deps in _graph().items():
        for dep in deps:
            if dep == "perf":
                wrong.append(f"{mod} imports the facade `perf`")
                continue
            a, b = _floor(mod), _floor(dep)
            if a is not None and b is not None and b > a:
                wrong.append(f"{mod} (floor {a}) imports {dep} (floor {b})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_circles() -> None:
    graph = _graph()
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                circles.append([*stack[stack.index(d) :], d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_no_module_over_400_lines_without_a_reason() -> None:
    big = []
    for path in _modules().values():
        lines = len(path.read_text().splitlines())
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > MAX_LINES and "one piece" not in doc.lower():
            big.append(f"{path.relative_to(PERF.parent)}: {lines} lines")
    assert not big, "\n".join(big)
