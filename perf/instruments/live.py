"""The live result object every ``with perf.count_...() as x:`` block yields: live while
inside (attributes read the running tally), frozen after (``x.result()``)."""

from __future__ import annotations

from typing import Any


class Live:
    """Base of the objects a ``with`` block yields: live while inside, frozen after."""

    _final: Any = None

    def result(self) -> Any:
        """The frozen result (available after the block ends)."""
        if self._final is None:
            raise RuntimeError("the result is available once the with-block has ended")
        return self._final

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._snapshot(), name)

    def _snapshot(self) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return repr(self._snapshot())
