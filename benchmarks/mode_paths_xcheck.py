"""Which ops take another path while a dispatch mode is on, over PyTorch's operator samples.

``python benchmarks/mode_paths_xcheck.py [OP ...]`` (needs ``expecttest``, which
``torch.testing._internal`` imports)

Why: ATen's composites test ``isTensorSubclassLike`` / ``areAnyTensorSubclassLike`` to choose
a path that tensor subclasses can run (out of place instead of in place, a tensor argument
instead of its host copy), and that test is true for every tensor while any
``TorchDispatchMode`` is on (``TensorSubclassLikeUtils.h``: ``if
(c10::impl::dispatch_mode_enabled()) return true;``). perf's ``count_ops``,
``count_transfers``, ``count_flops`` and ``model_gpu_time`` are dispatch modes, as is
``count_syncs`` on ``cuda:N``, so where a composite branches so they measure the other path.
This runs the first two samples of every OpInfo on ``sim``, forward and backward, once alone
and once under a do-nothing dispatch mode, records the ops that reach ``sim``'s kernels each
time (one record per call, no mode involved), and prints the ops whose streams differ.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import perf
import perf.sim.kernels as kernels
import perf.sim.tensors


class _Nothing(TorchDispatchMode):
    """A dispatch mode that changes nothing but being on."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@contextmanager
def recorded_kernels() -> Iterator[list[str]]:
    """The ops whose kernels ``sim``'s fallback runs inside, one name per call, in order.

    Each call unwraps its arguments with one fresh ``seen`` map: a new map is a new call.
    Views (run by their Meta kernel) and copies (``sim``'s own kernels) are not recorded.
    ``sim``'s C++ path (``perf.sim.native``) is off meanwhile: every op takes the Python
    fallback, where the record is taken."""
    nat = perf.sim.tensors.native
    fast = nat.set_fast(False) if nat is not None else None
    calls: list[str] = []
    plain = kernels.unwrap
    last: list[Any] = [None]

    def unwrap(op: Any, x: Any, seen: Any) -> Any:
        if last[0] is not seen:
            last[0] = seen
            calls.append(str(op))
        return plain(op, x, seen)

    kernels.unwrap = unwrap
    try:
        yield calls
    finally:
        kernels.unwrap = plain
        if nat is not None:
            nat.set_fast(fast)


def _leaves(*trees: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(trees)[0] if isinstance(t, torch.Tensor) and t.requires_grad]


def kernels_of(fn: Callable[[], Any], inputs: Iterable[Any] = ()) -> Counter[str]:
    """The ops ``fn()`` runs on ``sim``, with the backward of its floating outputs' sum (the
    inputs' gradients cleared first: a second backward would accumulate instead)."""
    for t in _leaves(*inputs):
        t.grad = None
    torch.manual_seed(0)
    with recorded_kernels() as calls:
        out = fn()
        grads = [
            t
            for t in tree_flatten(out)[0]
            if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()
        ]
        if grads:
            sum(t.sum() for t in grads).backward()
    return Counter(calls)


def compare(ops: Iterable[Any], dev: torch.device, names: Iterable[str] = ()) -> tuple[int, list]:
    """(samples compared, differences) over OpInfo-like ``ops`` (``name``,
    ``variant_test_name``, ``supports_autograd``, ``sample_inputs(device, dtype,
    requires_grad=...)``, callable); a difference is ``(name, variant, ops alone only, ops
    under a mode only)``. Samples that raise are skipped; ``names`` narrows to those ops."""
    wanted = set(names)
    compared, diffs = 0, []
    for op in ops:
        if wanted and op.name not in wanted:
            continue
        try:
            grad = bool(getattr(op, "supports_autograd", False))
            samples = list(op.sample_inputs(dev, torch.float32, requires_grad=grad))[:2]
        except Exception:
            continue
        for s in samples:
            inputs = (s.input, s.args, s.kwargs)

            def call(op: Any = op, s: Any = s) -> Any:
                return op(s.input, *s.args, **s.kwargs)

            try:
                alone = kernels_of(call, inputs)
                with _Nothing():
                    moded = kernels_of(call, inputs)
            except Exception:
                continue
            compared += 1
            if alone != moded:
                diffs.append((op.name, op.variant_test_name, alone - moded, moded - alone))
    return compared, diffs


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ops", nargs="*", help="OpInfo names to run (default: all)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    compared, diffs = compare(op_db, perf.simulated_device(), args.ops)
    print(f"compared {compared} samples; {len(diffs)} differ (alone, under a dispatch mode):")
    shown: set[tuple[str, str]] = set()
    for name, variant, alone, moded in diffs:
        if (name, variant) in shown:
            continue
        shown.add((name, variant))
        print(
            f"  {name} {variant}".rstrip(), "| alone:", dict(alone), "| under a mode:", dict(moded)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
