"""The base of perf's counting dispatch modes: on while compiled code runs, off while it
compiles.

Why: a ``TorchDispatchMode`` on the stack makes TorchDynamo refuse to compile (it runs the
code eagerly instead), so a counter around ``torch.compile``'d code would count a different
program. With ``ignore_compile_internals`` the mode is off while torch.compile compiles and on
while the compiled code runs, where it sees the ops that code dispatches (the copies and
scalar reads Inductor's wrapper code issues on CUDA; every graph op on ``sim``).
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class CountingDispatchMode(TorchDispatchMode):
    """A dispatch mode that counts what compiled code does at run time, not while compiling."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True
