"""Entry point of a base-side child: ``python -m perf._against_child MAP_JSON PYTEST_ARGS...``.

Puts a finder first in ``sys.meta_path`` that loads the project's top-level packages (the
names in the import map) from the base commit's worktree, checks that each one imports from
there, then runs pytest with the remaining arguments in this same process. A finder rather
than ``sys.path``: pytest inserts the rootdir and test directories at the front of
``sys.path`` while collecting, which would put the current tree's packages back in front.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from perf.against import EXIT_BASE_IMPORT, ImportMap


class BaseTreeFinder(importlib.abc.MetaPathFinder):
    """Finds the mapped top-level names in the base tree; submodules follow ``__path__``."""

    def __init__(self, roots: Mapping[str, str]) -> None:
        self.roots = dict(roots)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> Any:
        where = self.roots.get(fullname)
        if where is None:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [where])


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: python -m perf._against_child MAP_JSON [pytest args]", file=sys.stderr)
        return 4
    imap = ImportMap.from_json(argv[0])
    sys.meta_path.insert(0, BaseTreeFinder(imap.roots))
    for name, where in imap.roots.items():
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # anything the base tree's import raises
            print(
                f"perf: cannot import {name!r} from the base tree ({where}): "
                f"{type(e).__name__}: {e}",
                file=sys.stderr,
            )
            return EXIT_BASE_IMPORT
        file = getattr(mod, "__file__", None) or ""
        if not Path(file).resolve().is_relative_to(Path(where).resolve()):
            print(
                f"perf: {name!r} was loaded from {file}, not from the base tree ({where})",
                file=sys.stderr,
            )
            return EXIT_BASE_IMPORT
    import pytest

    return int(pytest.main(list(argv[1:])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
