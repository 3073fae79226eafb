"""Cross-check what ``sim`` computes against the CPU over PyTorch's own operator samples.

``python benchmarks/sim_values_xcheck.py [--dtypes float32 complex64 ...] [--samples N] [--grad]``
(needs ``expecttest``, which ``torch.testing._internal`` imports)

Why: ``sim`` runs every op with its CPU kernel on host views, and a view that loses a property
of its tensor gives a wrong answer without an error (a conjugate bit dropped: ``a.mH @ b``
computed ``a.T @ b``). This runs the first samples of every OpInfo for each dtype on the CPU
and on ``sim`` (the same seed before each) and prints each op whose outputs differ in shape,
dtype or value (beyond the dtype's tolerance in ``torch.testing.assert_close``), and each that
fails on ``sim`` only. Random ops are skipped (their values depend on the order of draws, not
on the device), and so are samples that read memory outside their input view. ``--grad``
compares the input gradients instead (the same random output gradients on both devices);
``--instruments`` runs each sample on ``sim`` under every perf instrument at once and prints
those that raise only there.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

import perf

#: ops whose values are random draws (compared by nothing but their shapes elsewhere)
RANDOM = (
    "normal",
    "bernoulli",
    "multinomial",
    "randn",
    "rand",
    "randint",
    "uniform",
    "exponential",
    "geometric",
    "cauchy",
    "log_normal",
    "nn.functional.dropout",
    "nn.functional.feature_alpha_dropout",
    "nn.functional.alpha_dropout",
    "nn.functional.rrelu",
)


#: ops whose samples read memory outside the input view (``.to(device)`` copies only the
#: view's elements, on CUDA as on ``sim``, so the rest of the storage differs)
PARTIAL_VIEWS = ("as_strided.partial_views",)


def _differs(got: Any, want: Any) -> str | None:
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"a {type(got).__name__}, not a tensor"
        got = got.cpu()
        if got.shape != want.shape or got.dtype != want.dtype:
            return f"{tuple(got.shape)} {got.dtype}, the CPU {tuple(want.shape)} {want.dtype}"
        if want.is_sparse:
            got, want = got.to_dense(), want.to_dense()
        g, w = got.resolve_conj().resolve_neg(), want.resolve_conj().resolve_neg()
        try:
            torch.testing.assert_close(g, w, equal_nan=True)  # the dtype's own tolerances
        except AssertionError:
            return "values differ"
        return None
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return "another number of outputs"
        for g, w in zip(got, want, strict=True):
            why = _differs(g, w)
            if why:
                return why
    return None


def _cases(
    ops: Iterable[Any], dtypes: Iterable[torch.dtype], samples: int, grad: bool
) -> Iterator[tuple[str, str, Any, Any]]:
    """(name, dtype, op, sample) for each op that is not skipped, each dtype it supports (for
    the backward, with ``grad``) and its first ``samples`` CPU samples."""
    dtypes = list(dtypes)
    for op in ops:
        name = f"{op.name}.{op.variant_test_name}".rstrip(".")
        if grad and not getattr(op, "supports_autograd", False):
            continue
        if op.name.startswith(RANDOM) or "empty" in op.name or name in PARTIAL_VIEWS:
            continue
        for dtype in dtypes:
            supported = op.supported_backward_dtypes if grad else op.supported_dtypes
            if dtype not in supported("cpu"):
                continue
            try:
                kwargs = {"requires_grad": True} if grad else {}
                cases = list(op.sample_inputs("cpu", dtype, **kwargs))[:samples]
            except Exception:
                continue
            for s in cases:
                yield name, str(dtype), op, s


def _on(dev: torch.device, s: Any) -> tuple[Any, Any, Any]:
    """A sample's (input, args, kwargs), its tensors moved to ``dev``."""
    return tree_map(
        lambda x: x.to(dev) if isinstance(x, torch.Tensor) else x, (s.input, s.args, s.kwargs)
    )


def _run(op: Any, args: tuple[Any, Any, Any]) -> Any:
    torch.manual_seed(0)
    return op(args[0], *args[1], **args[2])


def _compare(
    cases: Iterable[tuple[str, str, Any, Any]],
    result: Callable[[Any, Any, torch.device], Any],
    dev: torch.device,
    prefix: str,
) -> tuple[int, list[tuple[str, str, str]]]:
    """``result(op, sample, device)`` on the CPU and on ``dev`` for each case: a sample that
    fails on the CPU (or has no result there: None) is skipped, one that fails on ``dev``
    only is reported, and so is one whose results differ (``prefix`` names what)."""
    compared, found = 0, []
    cpu = torch.device("cpu")
    for name, dtype, op, s in cases:
        try:
            want = result(op, s, cpu)
        except Exception:
            continue
        if want is None:
            continue
        try:
            got = result(op, s, dev)
        except Exception as e:
            found.append((name, dtype, f"fails on sim: {type(e).__name__}: {e}"[:200]))
            continue
        compared += 1
        why = _differs(got, want)
        if why:
            found.append((name, dtype, prefix + why))
    return compared, found


def compare(
    ops: Iterable[Any], dev: torch.device, dtypes: Iterable[torch.dtype], samples: int = 3
) -> tuple[int, list[tuple[str, str, str]]]:
    """(samples compared, [(op, dtype, what differs)]) over OpInfo-like ``ops`` (``name``,
    ``variant_test_name``, ``supported_dtypes``, ``sample_inputs``, callable). A sample that
    fails on the CPU is skipped; one that fails on ``sim`` only is reported."""
    cases = _cases(ops, dtypes, samples, grad=False)
    return _compare(cases, lambda op, s, d: _run(op, _on(d, s)), dev, "")


def compare_grads(
    ops: Iterable[Any], dev: torch.device, dtypes: Iterable[torch.dtype], samples: int = 2
) -> tuple[int, list[tuple[str, str, str]]]:
    """The same over gradients: each sample's outputs get the same random output gradients
    on the CPU and on ``sim`` (``torch.autograd.grad``), and the input gradients are compared.
    Ops without autograd support are skipped."""
    return _compare(_cases(ops, dtypes, samples, grad=True), _grads, dev, "gradients: ")


def check_instruments(
    ops: Iterable[Any], dev: torch.device, dtypes: Iterable[torch.dtype], samples: int = 2
) -> tuple[int, list[tuple[str, str, str]]]:
    """Every instrument at once (``count_syncs``, ``count_transfers``, ``count_ops``,
    ``count_flops``, ``model_gpu_time``) around each sample on ``sim``: (samples run,
    [(op, dtype, the error)]) for those that raise only under the instruments."""
    ran, found = 0, []
    for name, dtype, op, s in _cases(ops, dtypes, samples, grad=False):
        args = _on(dev, s)
        try:
            _run(op, args)
        except Exception:
            continue
        ran += 1
        try:
            with (
                perf.count_syncs(dev),
                perf.count_transfers(),
                perf.count_ops(dev),
                perf.count_flops(),
                perf.model_gpu_time(dev),
            ):
                _run(op, args)
        except Exception as e:
            found.append(
                (name, dtype, f"raises under the instruments: {type(e).__name__}: {e}"[:200])
            )
    return ran, found


def _grads(op: Any, s: Any, dev: torch.device) -> list[torch.Tensor] | None:
    """The input gradients of one sample on ``dev`` (zeros for an unused input); None where
    the sample has no differentiable output or input."""

    def move(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.detach().to(dev).requires_grad_(x.requires_grad)
        return x

    on_dev = tree_map(move, (s.input, s.args, s.kwargs))
    leaves = [x for x in tree_flatten(on_dev)[0] if isinstance(x, torch.Tensor) and x.requires_grad]
    torch.manual_seed(0)
    out = op(on_dev[0], *on_dev[1], **on_dev[2])
    outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    if not outs or not leaves:
        return None
    torch.manual_seed(1)
    seeds = [torch.randn(o.shape, dtype=o.dtype).to(o.device) for o in outs]
    grads = torch.autograd.grad(outs, leaves, seeds, allow_unused=True)
    return [
        torch.zeros_like(x).cpu() if g is None else g.cpu()
        for x, g in zip(leaves, grads, strict=True)
    ]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="*", default=["float32", "complex64"])
    ap.add_argument("--samples", type=int, default=3, help="samples per op and dtype")
    ap.add_argument("--grad", action="store_true", help="compare input gradients instead")
    ap.add_argument(
        "--instruments",
        action="store_true",
        help="run each sample under every perf instrument on sim instead, reporting errors",
    )
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    dtypes = [getattr(torch, d) for d in args.dtypes]
    check = check_instruments if args.instruments else compare_grads if args.grad else compare
    compared, found = check(op_db, perf.simulated_device(), dtypes, args.samples)
    what = "raise under the instruments" if args.instruments else "differ or fail on sim only"
    print(f"compared {compared} samples; {len(found)} {what}:")
    for f in found:
        print(" ", *f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
