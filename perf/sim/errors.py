"""Errors raised inside ``sim``'s kernels say so: the simulated device, the operator, what to do.

Why: ``sim`` runs every op with its CPU kernel (on host views; a view op on the sim tensor
itself), so an op that CUDA runs can fail on ``sim`` with the CPU kernel's message ("view size
is not compatible ... Use .reshape(...) instead", "not implemented for 'Half'"), which names
neither ``sim`` nor that the program is fine on CUDA. :func:`on_sim` gives the same exception
type with the original message first (code that catches ``RuntimeError`` or matches the
message still does), then where it happened, the workaround where one is known, and the
request to report it; the original is the ``__cause__``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = ["MARK", "WORKAROUNDS", "on_sim"]

#: starts the paragraph this module adds to a message (never added twice)
MARK = "[perf sim]"

#: (pattern of the CPU kernel's message, the workaround to name)
WORKAROUNDS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"view size is not compatible with input tensor's size and stride"),
        "the tensor's memory layout differs from the one this op gets on CUDA (channels-last "
        "input, or a kernel that chose another layout): make it contiguous first "
        "(x.contiguous()) if the code must run on sim now",
    ),
    (
        re.compile(r"not implemented for '(Half|BFloat16)'"),
        "the CPU kernel lacks this dtype where CUDA's has it: run this op in float32 under "
        "sim (torch.autocast(..., enabled=False) around it), or use bfloat16",
    ),
]


def on_sim(op: Any, err: BaseException) -> BaseException:
    """The exception to raise for ``err``, raised by ``op``'s kernel on ``sim``: same type,
    the message extended (or a note added where the type cannot be rebuilt from a message)."""
    text = str(err)
    if MARK in text or any(MARK in n for n in getattr(err, "__notes__", ())):
        return err
    name = str(op) if hasattr(op, "_schema") else getattr(op, "__name__", str(op))
    hint = next((why for pat, why in WORKAROUNDS if pat.search(text)), None)
    extra = (
        f"{MARK} This happened on perf's simulated device (sim), in {name}, which sim runs "
        "with its CPU kernel; "
        + (f"workaround: {hint}. " if hint else "")
        + "If this code runs on CUDA, sim fails where CUDA does not: please report it to "
        "perf with this operator and the traceback."
    )
    try:
        new = type(err)(f"{text}\n{extra}")
    except Exception:  # a type that is not built from one message
        err.add_note(extra)
        return err
    if str(new) != f"{text}\n{extra}":
        err.add_note(extra)
        return err
    new.__cause__ = err
    return new


def named_kernel(op: Any, fn: Any) -> Any:
    """``fn`` (a kernel of ``op`` on ``sim``) raising what it raises as :func:`on_sim` says."""

    @functools.wraps(fn)
    def kernel(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            new = on_sim(op, e)
            if new is e:
                raise
            raise new from e

    return kernel
