"""The house keeps its floors: each module imports only from its own floor or the floors below,
no two modules import each other (directly or around a circle), no module imports another
module's ``_private`` names or a ``_private`` module, and no module re-exports names it does
not define through its ``__all__`` (``perf/__init__.py``, the one public surface, is the only
facade).

Module length is not capped: a line cap (with "one piece" in a docstring as the excuse) made
people split cohesive modules, and the split left facades and private imports between the
pieces. The two rules on names forbid what the splitting left behind instead.

Imports inside functions count too: they are how the plugin stays light at start-up, but a
lazy import that goes upstairs is still a dependency going the wrong way.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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


def _resolve(name: str, path: Path, node: ast.ImportFrom) -> str:
    base = node.module or ""
    if node.level:
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        up = pkg.split(".")
        base = ".".join(up[: len(up) - node.level + 1] + ([base] if base else []))
    return base


def _private(alias: str) -> bool:
    return alias.startswith("_") and not alias.startswith("__")


def private_imports() -> list[str]:
    """``from perf.x import _name``, ``from perf.x._y import name`` or ``import perf.x._y`` in
    any module other than the private one itself."""
    wrong = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(name, path, node)
                found = [f"{source}.{a.name}" for a in node.names]
            else:
                continue
            for target in found:
                parts = target.split(".")
                private = [i for i, part in enumerate(parts) if _private(part)]
                if parts[0] != "perf" or not private:
                    continue
                owner, itself = ".".join(parts[: private[0]]), ".".join(parts[: private[0] + 1])
                if name not in (owner, itself) and not name.startswith(f"{itself}."):
                    wrong.append(f"{name} imports {target}")
    return wrong


def _defined(tree: ast.Module) -> set[str]:
    """Names a module binds itself at top level (imports do not count)."""
    names: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If):
                walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                for h in node.handlers:
                    walk(h.body)
                walk(node.orelse)
                walk(node.finalbody)

    walk(tree.body)
    return names


def _all(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            return list(value)
    return []


def facades() -> list[str]:
    """Names in a module's ``__all__`` that the module does not define (re-exports)."""
    wrong = []
    for name, path in _modules().items():
        if name == "perf":
            continue
        tree = ast.parse(path.read_text())
        for n in sorted(set(_all(tree)) - _defined(tree)):
            wrong.append(f"{name}.__all__ re-exports {n}")
    return wrong


def test_no_module_imports_another_modules_private_names() -> None:
    """A ``_name`` is its module's business: make it public where it is defined, or move the
    code that needs it into that module."""
    wrong = private_imports()
    assert not wrong, "private names imported across modules:\n" + "\n".join(wrong)


def test_no_reexport_facades() -> None:
    """Import a name from the module that defines it; only :mod:`perf` gathers names."""
    wrong = facades()
    assert not wrong, "names re-exported through __all__:\n" + "\n".join(wrong)


def test_the_public_surface_is_one_list() -> None:
    """``perf._EXPORTS`` is the list; ``__all__`` is made from it and the ``TYPE_CHECKING``
    imports (what type checkers see) name the same objects from the same modules."""
    import perf

    tree = ast.parse((PERF / "__init__.py").read_text())
    checked: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module
                for a in imp.names:
                    checked[a.asname or a.name] = imp.module
    assert checked == perf._EXPORTS
    assert perf.__all__ == list(perf._EXPORTS)
    for name, module in perf._EXPORTS.items():
        defined = _defined(ast.parse(_modules()[module].read_text()))
        assert name in defined, f"{module} does not define {name}: import it from its own module"


def test_no_module_aliases_on_perf() -> None:
    """Modules are reached by their path: ``perf.report`` is the package (never
    ``perf.report.text`` in disguise), and ``perf.stats`` is no shortcut to ``perf.core.stats``."""
    code = (
        "import perf\n"
        "assert not hasattr(perf, 'stats') and not hasattr(perf, 'timing')\n"
        "import perf.report\n"
        "assert perf.report.__name__ == 'perf.report', perf.report\n"
        "import perf.core.stats\n"
        "assert perf.core.stats.median([1.0, 3.0]) == 2.0\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def _perf_names_imported(path: Path) -> list[tuple[int, str, str]]:
    """Every ``from perf... import name`` in a file, function-level imports included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module == "perf" or (node.module or "").startswith("perf."))
        ):
            found += [(node.lineno, str(node.module), a.name) for a in node.names]
    return found


def test_every_perf_name_a_script_or_module_imports_exists() -> None:
    """Imports inside functions run only on the path that needs them: a GPU benchmark's,
    after its CUDA check, never runs on a CPU box. Moving a name (a facade removed) must not
    leave such an import behind: ``model_vs_gpu.py`` imported workloads from a package that
    no longer re-exported them, found only when the script was run by hand."""
    import importlib

    root = PERF.parent
    files = [
        *PERF.rglob("*.py"),
        *(root / "benchmarks").glob("*.py"),
        *(root / "tests").rglob("*.py"),
    ]
    missing = []
    for path in files:
        for line, module, name in _perf_names_imported(path):
            try:
                mod = importlib.import_module(module)
            except ImportError as e:
                missing.append(f"{path.relative_to(root)}:{line}: {module} ({e})")
                continue
            if name != "*" and not hasattr(mod, name):
                try:  # a submodule imported by name
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    missing.append(f"{path.relative_to(root)}:{line}: {module}.{name}")
    assert not missing, "imports of names that do not exist:\n" + "\n".join(missing)
