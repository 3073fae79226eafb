"""A base-side child: ``python /path/to/against_child.py MAP_JSON PYTEST_ARGS...``.

Puts a finder first in ``sys.meta_path`` that loads the project's packages (the names in the
import map) from the base commit's worktree, then runs pytest in this same process; at session
start it checks that each mapped package really comes from there. A finder rather than
``sys.path``: pytest inserts the rootdir and test directories at the front of ``sys.path``
while collecting, which would put the current tree's packages back in front.

Run as a script file, not ``python -m perf...``: importing perf before pytest would keep
pytest from rewriting the asserts of perf's plugin modules (a warning, an error under
``-W error``). So nothing of perf is imported here.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

#: Exit status of a base child that could not import a mapped package from the base tree.
EXIT_BASE_IMPORT = 97


class BaseTreeFinder(importlib.abc.MetaPathFinder):
    """Finds the mapped names in the base tree; their submodules follow ``__path__``."""

    def __init__(self, roots: Mapping[str, str]) -> None:
        self.roots = dict(roots)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> Any:
        where = self.roots.get(fullname)
        if where is None:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [where])


class Preflight:
    """pytest plugin: before any test, import each mapped package and check where from."""

    def __init__(self, roots: Mapping[str, str]) -> None:
        self.roots = dict(roots)

    def pytest_sessionstart(self, session: Any) -> None:
        import pytest

        for name, where in sorted(self.roots.items()):
            try:
                mod = importlib.import_module(name)
            except Exception as e:  # whatever the base tree's import raises
                problem = f"cannot import {name!r} from the base tree ({where}): "
                problem += f"{type(e).__name__}: {e}"
            else:
                file = Path(getattr(mod, "__file__", None) or "").resolve()
                if file.is_relative_to(Path(where).resolve()):
                    continue
                problem = f"{name!r} was loaded from {file}, not from the base tree ({where})"
            print(f"perf: {problem}", file=sys.stderr, flush=True)
            pytest.exit(problem, returncode=EXIT_BASE_IMPORT)


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: against_child.py MAP_JSON [pytest args]", file=sys.stderr)
        return 4
    roots = json.loads(argv[0])
    if not isinstance(roots, dict):
        print("the import map must be a JSON object", file=sys.stderr)
        return 4
    sys.meta_path.insert(0, BaseTreeFinder(roots))
    import pytest

    return int(pytest.main(list(argv[1:]), plugins=[Preflight(roots)]))


if __name__ == "__main__":
    # Run as a script, Python put this file's folder (perf/gate/) first on sys.path: take it off,
    # or perf's modules would be importable as top-level names.
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    sys.exit(main(sys.argv[1:]))
