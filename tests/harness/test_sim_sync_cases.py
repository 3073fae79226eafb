"""Sync counts on ``sim`` equal CUDA's, case by case, each derived from the CUDA source.

Why: a count that is right for a loop can be wrong for two habits whose errors cancel. Each
case below states what ``torch.cuda.set_sync_debug_mode("warn")`` flags on ``cuda:0`` and where
in PyTorch that comes from (docs/sim.md, "Syncs, case by case", has the table); the same table
of in-kernel syncs (``perf.sim.kernel_syncs``) drives ``count_syncs`` on CUDA, which the
stand-in mode exercises here through the very dispatch-mode code that runs on ``cuda:0``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _sim import counted_as_on_cuda, needs_sim

import perf
from perf.sim import kernel_syncs
from perf.sim.device import unavailable_reason
from perf.sim.kernel_syncs import multinomial_asserts_async

Case = Callable[[torch.device], Callable[[], Any]]


@pytest.fixture(scope="module")
def sim() -> torch.device:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    return perf.simulated_device()


def _mask_backward(dev: torch.device) -> Callable[[], Any]:
    w = torch.randn(8, 3, device=dev, requires_grad=True)
    mask = torch.arange(8, device=dev) % 2 == 0
    return lambda: w[mask].sum().backward()


def _event_sync(dev: torch.device) -> Callable[[], Any]:
    mod = torch.get_device_module(dev)
    return lambda: (lambda e: (e.record(), e.synchronize()))(mod.Event())


def _grouped(dev: torch.device, dtype: torch.dtype, a_dims: int) -> Callable[[], Any]:
    w = torch.ones(3, 16, 16, device=dev, dtype=dtype)
    if a_dims == 3:
        a = torch.ones(3, 4, 16, device=dev, dtype=dtype)
        return lambda: torch._grouped_mm(a, w)
    a = torch.ones(12, 16, device=dev, dtype=dtype)
    offs = torch.tensor([4, 9, 12], device=dev, dtype=torch.int32)
    return lambda: torch._grouped_mm(a, w, offs=offs)


def _categorical(dev: torch.device, validate: bool) -> Callable[[], Any]:
    """A policy's distribution and the log-probability of an action (PPO's rollout step)."""
    logits = torch.randn(4, 3, device=dev)
    action = torch.zeros(4, dtype=torch.long, device=dev)
    dist = torch.distributions.Categorical
    return lambda: dist(logits=logits, validate_args=validate).log_prob(action)


def _ctc(dev: torch.device, lengths: str, reduction: str = "mean") -> Callable[[], Any]:
    """A CTC loss's forward and backward (speech and OCR models): 3 time-steps per target."""
    torch.manual_seed(0)
    lp = torch.randn(12, 3, 6, device=dev).log_softmax(2).requires_grad_()
    targets = torch.randint(1, 6, (3, 4), device=dev)
    il, tl = [12, 12, 10], [4, 3, 2]
    if lengths == "device":
        il_t, tl_t = torch.tensor(il, device=dev), torch.tensor(tl, device=dev)
        return lambda: F.ctc_loss(lp, targets, il_t, tl_t, reduction=reduction).backward()
    return lambda: F.ctc_loss(lp, targets, il, tl, reduction=reduction).backward()


#: name -> (setup(dev) -> run, by_op CUDA's sync debug mode gives, the source)
CASES: dict[str, tuple[Case, dict[str, int], str]] = {
    "equal_alias": (
        lambda d: (lambda t: lambda: torch.equal(t, t))(torch.ones(4, device=d)),
        {},
        "cuda/Equal.cpp cuda_equal: alias fast path returns true",
    ),
    "equal_view": (
        lambda d: (lambda t: lambda: torch.equal(t, t.view(2, 2).view(4)))(torch.ones(4, device=d)),
        {},
        "cuda/Equal.cpp: a view with the same storage, offset and strides is an alias",
    ),
    "equal_copy": (
        lambda d: (lambda t: lambda: torch.equal(t, t.clone()))(torch.ones(4, device=d)),
        {"equal": 1},
        "cuda/Equal.cpp: eq(self, src).all().item()",
    ),
    "equal_sizes_differ": (
        lambda d: (lambda t: lambda: torch.equal(t, t[:2]))(torch.ones(4, device=d)),
        {},
        "cuda/Equal.cpp: sizes differ -> false before any read",
    ),
    "repeat_interleave": (
        lambda d: (lambda r: lambda: torch.repeat_interleave(r))(torch.tensor([1, 2], device=d)),
        {"repeat_interleave": 2},
        "Repeat.h repeat_interleave_common: cumsum[-1].item(), (repeats >= 0).all().item()",
    ),
    "repeat_interleave_output_size": (
        lambda d: (lambda r: lambda: torch.repeat_interleave(r, output_size=3))(
            torch.tensor([1, 2], device=d)
        ),
        {},
        "Repeat.h: output_size given -> no read",
    ),
    "host_long_index": (
        lambda d: (lambda x: lambda: x[torch.tensor([0, 1])])(torch.randn(4, device=d)),
        {"bool_mask_index": 1},
        "expandTensors(ensure_same_device): index.to(self.device()), blocking",
    ),
    "host_mask_index": (
        lambda d: (lambda x: lambda: x[torch.tensor([True, False, True, False])])(
            torch.randn(4, device=d)
        ),
        {},
        "expandTensors: nonzero on the host, copied pinned and non_blocking",
    ),
    "linalg_solve_ex_check_errors": (
        lambda d: (lambda a: lambda: torch.linalg.solve_ex(a, a, check_errors=True))(
            torch.eye(3, device=d)
        ),
        {"linalg_check_errors": 1},
        "_linalg_solve_ex_out: if (check_errors) _linalg_check_errors",
    ),
    "mask_setitem_scalar": (
        lambda d: (lambda x: lambda: x.__setitem__(x > 0, 0.0))(torch.randn(8, device=d)),
        {},
        "THPVariable_setitem: a CPU value; _index_put_impl_ -> masked_fill_",
    ),
    "mask_setitem_tensor": (
        lambda d: (lambda x: lambda: x.__setitem__(x > 9, x[x > 9]))(torch.randn(8, device=d)),
        {"bool_mask_index": 1, "index_put": 1},
        "index: make_info -> nonzero; _index_put_impl_: make_info -> nonzero",
    ),
    "mask_setitem_device_scalar": (
        lambda d: (lambda x: lambda: x.__setitem__(x > 0, x.sum()))(torch.randn(8, device=d)),
        {"index_put": 1},
        "_index_put_impl_: the value is on the device -> no masked_fill_; make_info -> nonzero",
    ),
    "index_setitem_scalar": (
        lambda d: (lambda x, i: lambda: x.__setitem__(i, 0.0))(
            torch.randn(8, device=d), torch.tensor([0, 2], device=d)
        ),
        {"index_put": 1},
        "_index_put_impl_: value.to(self.device()) of the CPU scalar: a blocking copy",
    ),
    "mask_index_backward": (
        _mask_backward,
        {"bool_mask_index": 1, "index_put": 1},
        "index_backward -> _index_put_impl_(accumulate) -> index_put_with_sort -> nonzero",
    ),
    "index_put_accumulate_long": (
        lambda d: (lambda x, i: lambda: x.index_put_((i,), torch.ones(2, device=d), True))(
            torch.zeros(4, device=d), torch.tensor([0, 0], device=d)
        ),
        {},
        "cuda/Indexing.cu wrapIndexOnce: aminmax + _assert_async, no read",
    ),
    "bincount": (
        lambda d: (lambda x: lambda: torch.bincount(x))(torch.tensor([0, 1, 1], device=d)),
        {"bincount": 2},
        "cuda/SummaryOps.cu _bincount_cuda_template: self_min.cpu(), self_max.item()",
    ),
    "bincount_uint8": (
        lambda d: (lambda x: lambda: torch.bincount(x))(
            torch.tensor([0, 1], dtype=torch.uint8, device=d)
        ),
        {"bincount": 1},
        "cuda/SummaryOps.cu: uint8 skips the min check; self_max.item()",
    ),
    "bincount_empty": (
        lambda d: (lambda x: lambda: torch.bincount(x))(torch.zeros(0, dtype=torch.long, device=d)),
        {},
        "cuda/SummaryOps.cu: an empty 1-d input returns zeros",
    ),
    "histc_auto_range": (
        lambda d: (lambda x: lambda: torch.histc(x))(torch.randn(8, device=d)),
        {"histc": 2},
        "cuda/SummaryOps.cu _histc_cuda_template: min == max -> two .item()",
    ),
    "histc_range": (
        lambda d: (lambda x: lambda: torch.histc(x, min=-1, max=1))(torch.randn(8, device=d)),
        {},
        "cuda/SummaryOps.cu: an explicit range reads nothing",
    ),
    "histc_int_auto_range": (
        lambda d: (lambda x: lambda: torch.histc(x, bins=4))(torch.arange(8, device=d).int()),
        {"histc": 2},
        "cuda/SummaryOps.cu _histc_cuda: integer inputs too (the CPU kernel has floats only)",
    ),
    "histc_int_range": (
        lambda d: (lambda x: lambda: torch.histc(x, 4, 0, 3))(torch.arange(8, device=d).int()),
        {},
        "cuda/SummaryOps.cu: an explicit range reads nothing",
    ),
    "grouped_mm_2d_3d": (
        lambda d: _grouped(d, torch.float32, 2),
        {"grouped_mm": 1},
        "cuda/GroupedBlas.cpp _grouped_mm_cuda -> GroupedMMUtils.h _grouped_mm_fallback: "
        "offs.cpu() to loop over the groups",
    ),
    "grouped_mm_2d_3d_bf16": (
        lambda d: _grouped(d, torch.bfloat16, 2),
        {},
        "cuda/GroupedBlas.cpp: bf16 on sm90 (what sim stands for) is the CUTLASS kernel, "
        "'fast path, no d2h sync needed'",
    ),
    "grouped_mm_3d_3d": (
        lambda d: _grouped(d, torch.float32, 3),
        {},
        "GroupedMMUtils.h _grouped_mm_fallback: 3d x 3d without offsets is one bmm",
    ),
    "multinomial": (
        lambda d: (lambda p: lambda: torch.multinomial(p, 2))(torch.ones(4, device=d)),
        {} if multinomial_asserts_async() else {"multinomial": 2},
        "Distributions.cpp multinomial_out: _assert_async (before pytorch#134818: two .item())",
    ),
    "multinomial_replacement": (
        lambda d: (lambda p: lambda: torch.multinomial(p, 2, replacement=True))(
            torch.ones(4, device=d)
        ),
        {},
        "Distributions.cpp: with replacement and n > 1 the kernel asserts on the device",
    ),
    "linalg_cholesky": (
        lambda d: (lambda a: lambda: torch.linalg.cholesky(a))(torch.eye(3, device=d)),
        {"item": 1},
        "linalg_cholesky -> _linalg_check_errors: infos.any().item()",
    ),
    "linalg_cholesky_ex": (
        lambda d: (lambda a: lambda: torch.linalg.cholesky_ex(a))(torch.eye(3, device=d)),
        {},
        "linalg_cholesky_ex: check_errors=False, no read",
    ),
    "linalg_cholesky_ex_check_errors": (
        lambda d: (lambda a: lambda: torch.linalg.cholesky_ex(a, check_errors=True))(
            torch.eye(3, device=d)
        ),
        {"linalg_check_errors": 1},
        "linalg_cholesky_ex_out: if (check_errors) _linalg_check_errors",
    ),
    "linalg_inv": (
        lambda d: (lambda a: lambda: torch.linalg.inv(a))(torch.eye(3, device=d)),
        {"item": 1},
        "linalg_inv -> _linalg_check_errors: infos.any().item()",
    ),
    "allclose": (
        lambda d: (lambda t: lambda: torch.allclose(t, t + 1))(torch.ones(4, device=d)),
        {"item": 1},
        "TensorCompare.cpp allclose: isclose(...).all().item()",
    ),
    "is_nonzero": (
        lambda d: (lambda t: lambda: torch.is_nonzero(t))(torch.ones(1, device=d)),
        {"item": 1},
        "TensorCompare.cpp is_nonzero: self.item()",
    ),
    "linspace_tensor_ends": (
        lambda d: (lambda a, b: lambda: torch.linspace(a, b, 5, device=d))(
            torch.tensor(0.0, device=d), torch.tensor(1.0, device=d)
        ),
        {"item": 2},
        "TensorFactories.cpp linspace(Tensor, Tensor): start.item(), end.item()",
    ),
    "embedding_backward": (
        lambda d: (lambda e, i: lambda: e(i).sum().backward())(
            torch.nn.Embedding(50, 8).to(d), torch.randint(0, 50, (4000,)).to(d)
        ),
        {},
        "cuda/EmbeddingBackwardKernel.cu: the segment count stays on the device (max_segments)",
    ),
    "unique": (
        lambda d: (lambda x: lambda: x.unique(return_counts=True))(
            torch.tensor([1, 1, 2], device=d)
        ),
        {"unique": 1},
        "cuda/UniqueCub.cu compute_unique: length.item()",
    ),
    "unique_empty": (
        lambda d: (lambda x: lambda: x.unique())(torch.zeros(0, device=d)),
        {},
        "cuda/UniqueCub.cu unique_cuda_template: no elements -> early return",
    ),
    "unique_dim": (
        lambda d: (lambda x: lambda: x.unique(dim=0))(torch.tensor([[1, 2], [1, 2]], device=d)),
        {"unique": 1},
        "cuda/Unique.cu unique_dim_cuda_template: thrust::unique's count (not flagged)",
    ),
    "unique_consecutive_dim": (
        lambda d: (lambda x: lambda: torch.unique_consecutive(x, dim=0))(
            torch.tensor([[1, 2], [1, 2]], device=d)
        ),
        {"unique_consecutive": 1},
        "Unique.cu unique_consecutive_cuda -> unique_dim_consecutive_cuda: thrust::unique",
    ),
    "randperm": (
        lambda d: lambda: torch.randperm(10, device=d),
        {},
        "cuda/Randperm.cu randperm_out_cuda: keys and sort on the device",
    ),
    "stream_synchronize": (
        lambda d: lambda: torch.get_device_module(d).current_stream().synchronize(),
        {"stream_synchronize": 1},
        "CUDAStream::synchronize -> stream_synchronize -> warn_or_error_on_sync",
    ),
    "event_synchronize": (
        _event_sync,
        {},
        "CUDAEvent.h synchronize: cudaEventSynchronize, not flagged",
    ),
    "accelerator_synchronize": (
        lambda d: lambda: torch.accelerator.synchronize(),
        {},
        "CUDAFunctions.cpp device_synchronize: cudaDeviceSynchronize, not flagged",
    ),
    "distribution_validation": (
        lambda d: _categorical(d, validate=True),
        {"bool": 2},
        "distributions/distribution.py Distribution.__init__ and _validate_sample: "
        "`if not torch._is_all_true(valid)`, bool() of a device tensor, each",
    ),
    "distribution_without_validation": (
        lambda d: _categorical(d, validate=False),
        {},
        "validate_args=False (or Distribution.set_default_validate_args(False)): no check",
    ),
    "full_max_backward": (
        lambda d: (lambda x: lambda: x.max().backward())(
            torch.tensor([1.0, 5.0, 5.0], device=d, requires_grad=True)
        ),
        {},
        "FunctionsManual.cpp evenly_distribute_backward: input.is_cuda() -> the tied elements' "
        "mask, no read (other devices read value.isnan().item())",
    ),
    "ctc_loss_list_lengths_sum": (
        lambda d: _ctc(d, "list", "sum"),
        {"ctc_loss": 6},
        "cuda/LossCTC.cu ctc_loss_gpu_template and ctc_loss_backward_gpu_template: "
        "at::tensor(target_lengths), at::tensor(input_lengths), tg_batch_offsets.cuda(), "
        "three blocking copies each",
    ),
    "ctc_loss_list_lengths_mean": (
        lambda d: _ctc(d, "list"),
        {"ctc_loss": 6, "h2d_copy": 1},
        "as above; LossCTC.cpp ctc_loss_impl's mean: at::tensor(target_lengths, res.options()), "
        "a visible blocking copy",
    ),
    "ctc_loss_device_lengths": (
        lambda d: _ctc(d, "device"),
        {"ctc_loss": 6, "d2h_copy": 2, "h2d_copy": 1},
        "LossCTC.cpp ctc_loss (Tensor lengths): input_lengths / target_lengths "
        ".to(Device(at::kCPU)), two visible blocking copies, then the list-lengths path",
    ),
    "non_blocking_d2h_pageable": (
        lambda d: (lambda x: lambda: torch.empty(8).copy_(x, non_blocking=True))(
            torch.randn(8, device=d)
        ),
        {},
        "cuda/Copy.cu copy_kernel_cuda: non_blocking -> cudaMemcpyAsync, not flagged",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
@needs_sim
def test_sync_case_counts_as_cuda(sim: torch.device, name: str) -> None:
    setup, expected, source = CASES[name]
    run = setup(sim)
    with perf.count_syncs(sim) as s:
        run()
    assert s.by_op == expected, (name, source, s.by_op)


#: cases whose operands are all device tensors: the dispatch-mode side (what count_syncs runs
#: on cuda:0) can be exercised on CPU tensors in the stand-in mode
_MODE_CASES = [
    n
    for n in CASES
    if n not in ("stream_synchronize", "event_synchronize", "accelerator_synchronize")
    and n != "non_blocking_d2h_pageable"
    # stand-in mode has no host side: host operands' copies cannot be told apart there
    and n not in ("index_setitem_scalar", "host_long_index", "host_mask_index")
    and n not in ("ctc_loss_list_lengths_mean", "ctc_loss_device_lengths")
    # the CPU's histc has no integer kernel (CUDA's and sim's have)
    and not n.startswith("histc_int")
]


@needs_sim
def test_counting_a_multinomial_leaves_the_random_stream_alone(sim: torch.device) -> None:
    """The first ``multinomial`` counted asks torch (once) how its kernel checks the input, by
    running one; that probe drew from the default generator, so an RL program's sampled
    actions changed under ``count_syncs`` (stable-baselines3's A2C trained to other weights)."""
    probs = torch.tensor([[0.3, 0.7], [0.5, 0.5]], device=sim)

    def draws(counting: bool) -> list[float]:
        kernel_syncs._ASSERTS_ASYNC.clear()  # as in a fresh process: the probe runs again
        torch.manual_seed(0)
        with perf.count_syncs(sim) if counting else contextlib.nullcontext():
            picked = torch.multinomial(probs, 1, True).flatten().tolist()
            return picked + torch.rand(4).tolist()

    assert draws(counting=True) == draws(counting=False)


def test_the_transformer_fast_paths_mask_reads_are_rules() -> None:
    """``nn.TransformerEncoder``'s inference fast path with a padding mask reads it twice
    inside CUDA kernels (NestedTensorTransformerFunctions.cpp: the left-alignment check's
    ``equal``, the nested sizes' copy to the host; ``mask_check`` adds an ``equal``). ``sim``
    does not simulate nested tensors, and inside ``count_syncs`` the module takes its slow
    path (docs/sim.md), so the rules are checked as rules: what ``model_gpu_time`` and a
    dispatch mode on CUDA apply."""
    t, mask = torch.zeros(3, 10, 32), torch.ones(3, 10, dtype=torch.bool)
    from_mask = torch.ops.aten._nested_tensor_from_mask.default
    left_aligned = torch.ops.aten._nested_tensor_from_mask_left_aligned.default

    def syncs(op: Any, kwargs: dict[str, Any], on_device: bool) -> int:
        return kernel_syncs.kernel_syncs(op, (t, mask), kwargs, lambda x: on_device)

    assert syncs(left_aligned, {}, True) == 1
    assert syncs(from_mask, {"mask_check": False}, True) == 1  # TransformerEncoder's call
    assert syncs(from_mask, {}, True) == 2
    assert syncs(from_mask, {}, False) == syncs(left_aligned, {}, False) == 0  # host tensors


@pytest.mark.parametrize("name", _MODE_CASES)
def test_cuda_counter_uses_the_same_rules(name: str) -> None:
    """The dispatch mode that counts on ``cuda:0`` gives the same count, from the same table."""
    setup, expected, _ = CASES[name]
    run = setup(torch.device("cpu"))
    with perf.count_syncs("cpu", host_as_device=True) as s:
        run()
    assert s.count == sum(expected.values()), (name, s.by_op)


#: cases the dispatch-mode side cannot see on sim tensors: sim's streams and events report
#: to the device-level listener only (on CUDA, count_syncs wraps torch.cuda.Stream instead)
_DEVICE_ONLY_CASES = ("stream_synchronize", "event_synchronize")
#: cases whose composite takes another path under any dispatch mode (see the test below)
_PATH_UNDER_A_MODE = ("ctc_loss_device_lengths",)


@pytest.mark.parametrize(
    "name", [n for n in CASES if n not in (*_DEVICE_ONLY_CASES, *_PATH_UNDER_A_MODE)]
)
@needs_sim
def test_cuda_side_counts_the_same_on_sim_tensors(sim: torch.device, name: str) -> None:
    """The code that counts on ``cuda:0`` (a dispatch mode: it sees no copy made below it)
    gives each case's count, host operands included, on a device with a host side."""
    setup, expected, source = CASES[name]
    run = setup(sim)
    with counted_as_on_cuda(sim) as c:
        run()
    assert dict(c.by_op) == expected, (name, source, c.by_op)


@needs_sim
def test_ctc_loss_with_device_lengths_reads_them_inside_the_kernel_under_a_dispatch_mode(
    sim: torch.device,
) -> None:
    """Under any dispatch mode (``count_ops``, ``count_syncs`` on CUDA) ``ctc_loss``'s
    composite takes its tensor-subclass path (LossCTC.cpp ``ctc_loss``:
    ``areAnyTensorSubclassLike`` is true while a mode is on): ``_ctc_loss.Tensor`` and
    ``_ctc_loss_backward.Tensor`` copy both lengths to the host inside their kernels
    (``ctc_loss_tensor``) before the three copies of each, and the mean divides by
    ``target_lengths.clamp_min(1)`` without a copy: 10 where the program alone makes 9. The
    rules count what the kernels do on either path, on ``sim`` and on the CUDA side alike."""
    run = _ctc(sim, "device")
    with perf.count_ops(sim), perf.count_syncs(sim) as s:
        run()
    with counted_as_on_cuda(sim) as c:
        run()
    assert s.by_op == dict(c.by_op) == {"ctc_loss": 10}


@pytest.mark.parametrize(
    "make, nbytes",
    [
        (lambda d: torch.tensor([1.0, 2.0], device=d), 8),
        (lambda d: torch.tensor(np.ones(3), device=d), 24),  # numpy data: a visible _to_copy
        (lambda d: torch.zeros(2, device=d).new_tensor([1.0, 2.0, 3.0]), 12),
        (lambda d: torch.zeros(8, device=d)[[0, 1, 2]], 24),  # the index tensor, int64
        (lambda d: torch.zeros(8, device=d)[range(2)], 16),
        (lambda d: torch.tensor([], device=d), 0),
    ],
)
@needs_sim
def test_python_data_copied_to_the_device_is_one_sync_and_one_transfer(
    sim: torch.device, make: Any, nbytes: int
) -> None:
    """``tensor_new.cpp`` ``internal_new_from_data`` copies Python data below the dispatch
    modes: counted once, by sim's device and by the CUDA side alike, and as a transfer."""
    with perf.count_syncs(sim) as s, perf.count_transfers() as t:
        make(sim)
    with counted_as_on_cuda(sim) as c:
        make(sim)
    n = 1 if nbytes else 0
    assert s.count == sum(c.by_op.values()) == t.h2d_copies == n, (s.by_op, c.by_op, t)
    assert t.h2d_bytes == nbytes and t.pageable_h2d_copies == n


@needs_sim
def test_masked_training_loop_counts_one_sync_per_backward(sim: torch.device) -> None:
    """Field case: a graph network's loop with a boolean train mask made 210 syncs on CUDA
    where sim counted 200: the backward of ``out[train_mask]`` calls nonzero."""
    torch.manual_seed(0)
    x = torch.randn(20, 4, device=sim)
    y = torch.randint(0, 2, (20,), device=sim)
    train_mask = torch.arange(20, device=sim) < 12
    model = torch.nn.Linear(4, 2).to(sim)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 5
    with perf.count_syncs(sim) as s:
        for _ in range(steps):
            opt.zero_grad()
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out[train_mask], y[train_mask])
            loss.backward()
            opt.step()
            loss.item()
    # per step: out[mask] and y[mask] (2 nonzero), the backward's index_put (1), .item() (1)
    assert s.by_op == {"bool_mask_index": 2 * steps, "index_put": steps, "item": steps}
    # The backward's sync happens on autograd's device thread, which runs no user code: it is
    # sited at the line that waits for it, loss.backward().
    here = __file__.rsplit("/", 1)[-1]
    sites = {site.rsplit("/", 1)[-1]: n for site, n in s.by_site.items()}
    backward_line = next(
        site for site, code in s.site_code.items() if code == "loss.backward()"
    ).rsplit("/", 1)[-1]
    assert sites[backward_line] == steps and backward_line.startswith(here)
    assert "<unknown>" not in s.by_site


def _tagged_ops() -> set[str]:
    """aten ops this torch tags as data-dependent, or whose schema has ``check_errors``."""
    out = set()
    tags = {torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output}
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::"):
            continue
        packet, _, overload = full[len("aten::") :].partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default", None)
        if op is None:
            continue
        if tags & set(op.tags) or "check_errors" in str(op._schema):
            out.add(full[len("aten::") :])
    return out


def test_every_data_dependent_op_is_accounted_for() -> None:
    """A torch release that adds a data-dependent op (or a ``check_errors`` one) fails here
    until the op gets a rule from its CUDA source, or a reason why it needs none."""
    known = {
        *kernel_syncs.BY_NAME,
        *kernel_syncs.COMPOSITE,
        *kernel_syncs.NOT_MODELLED,
        *kernel_syncs.NO_KERNEL_SYNC,
    }
    missing = sorted(_tagged_ops() - known)
    assert not missing, f"ops with no sync rule and no reason: {missing}"


def test_every_rule_names_an_op_of_this_torch() -> None:
    names = {*kernel_syncs.BY_NAME, *kernel_syncs.COMPOSITE}
    resolved = {
        name
        for name in names
        if kernel_syncs._ops(name)  # an op renamed or removed would vanish silently
    }
    assert resolved == names, sorted(names - resolved)


def test_cuda_stream_synchronize_is_counted_and_restored(monkeypatch) -> None:
    """On CUDA, ``count_syncs`` wraps ``torch.cuda.Stream.synchronize`` for the block only
    (checked on a stand-in class: this box has no CUDA stream to wait on)."""
    waited: list[str] = []

    class FakeStream:
        def synchronize(self) -> None:
            waited.append("waited")

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    hits: list[str] = []
    plain = FakeStream.__dict__["synchronize"]
    with kernel_syncs.cuda_stream_syncs(hits.append):
        FakeStream().synchronize()
        FakeStream().synchronize()
    FakeStream().synchronize()  # outside the block: not counted
    assert hits == ["stream_synchronize"] * 2 and waited == ["waited"] * 3
    assert FakeStream.__dict__["synchronize"] is plain


def _linalg_probes() -> dict[str, Callable[[], Any]]:
    a = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    a = a @ a.T + 4 * torch.eye(4, dtype=torch.float64)
    b = torch.ones(4, 2, dtype=torch.float64)
    la = torch.linalg
    return {
        "cholesky": lambda: la.cholesky(a),
        "cholesky_ex": lambda: la.cholesky_ex(a, check_errors=True),
        "inv": lambda: la.inv(a),
        "solve": lambda: la.solve(a, b),
        "lu_factor": lambda: la.lu_factor(a),
        "ldl_factor": lambda: la.ldl_factor(a),
        "eigh": lambda: la.eigh(a),
        "eigvalsh": lambda: la.eigvalsh(a),
        "svd": lambda: la.svd(a),
        "svdvals": lambda: la.svdvals(a),
        "matrix_rank": lambda: la.matrix_rank(a),
        "pinv": lambda: la.pinv(a),
        "pinv_hermitian": lambda: la.pinv(a, hermitian=True),
        "qr": lambda: la.qr(a),
        "det": lambda: la.det(a),
        "slogdet": lambda: la.slogdet(a),
        "lu": lambda: la.lu(a),
        "solve_triangular": lambda: la.solve_triangular(a, b, upper=True),
        "householder_product": lambda: la.householder_product(a, torch.ones(2, dtype=a.dtype)),
        "matrix_exp": lambda: la.matrix_exp(a),
        "torch.cholesky": lambda: torch.cholesky(a),
        "cholesky_inverse": lambda: torch.cholesky_inverse(a),
    }


@pytest.mark.filterwarnings("ignore:torch.cholesky is deprecated")
def test_linalg_kernels_check_errors_as_the_table_says() -> None:
    """Which linalg kernels call ``_linalg_check_errors`` inside (where no mode sees it) is
    observed on CPU, whose kernel function these ops share with CUDA, by a kernel registered
    for ``_linalg_check_errors``: the table must give each op that count."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[str] = []
    top: list[Any] = []

    class Top(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            top.append((func, args, kwargs or {}))
            return func(*args, **(kwargs or {}))

    lib = torch.library.Library("aten", "IMPL")  # removed again by _destroy below
    try:
        lib.impl("_linalg_check_errors", lambda info, api, *, is_matrix: calls.append(api), "CPU")
        wrong = {}
        for name, probe in _linalg_probes().items():
            calls.clear()
            top.clear()
            with Top():
                probe()
            seen = [f for f, _, _ in top if f is torch.ops.aten._linalg_check_errors.default]
            inside = len(calls) - len(seen)
            rules = sum(
                kernel_syncs.kernel_syncs(f, a, k, lambda t: True)
                for f, a, k in top
                if f is not torch.ops.aten._linalg_check_errors.default
            )
            if inside != rules:
                wrong[name] = {"inside": inside, "table": rules, "ops": [str(f) for f, *_ in top]}
        assert not wrong, wrong
    finally:
        lib._destroy()


def test_multinomial_checks_its_input_without_a_sync_from_torch_2_11() -> None:
    """CUDA's debug mode saw no sync in ``torch.multinomial(p, 2)`` on an H200 with torch 2.11
    (the table said 2, from an older ``Distributions.cpp``); torch 2.13's CPU kernel calls
    ``_assert_async``, which the probe reads off the profiler. Inside a running profiler the
    probe cannot nest one: it answers by version and caches nothing."""
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 11):
        pytest.skip(f"torch {torch.__version__}: the sync-free check is measured from 2.11 on")
    kernel_syncs._ASSERTS_ASYNC.clear()
    with torch.autograd.profiler.profile(use_kineto=False):
        assert multinomial_asserts_async()
    assert kernel_syncs._ASSERTS_ASYNC == []
    assert multinomial_asserts_async() and kernel_syncs._ASSERTS_ASYNC == [True]


@needs_sim
def test_sim_events_time_the_work_between_their_records(sim: torch.device) -> None:
    """Device-agnostic step timing (``torch.get_device_module(dev).Event(enable_timing=True)``,
    ``record``, ``synchronize``, ``elapsed_time``) raised "Backend doesn't support elapsedTime"
    on ``sim``: a Python backend's device guard has no events. ``sim`` runs each op when it is
    called, so the host's time between the records is the work's; neither the records nor
    ``synchronize()`` are syncs (CUDA's sync debug mode does not flag ``cudaEventSynchronize``),
    and the stream's ``record_event()`` gives an event that can synchronize."""
    import time

    mod = torch.get_device_module(sim)
    start, end = mod.Event(enable_timing=True), mod.Event(enable_timing=True)
    with perf.count_syncs(sim) as s:
        start.record()
        time.sleep(0.02)
        end.record()
        end.synchronize()
        torch.accelerator.current_stream(sim).record_event().synchronize()
    assert s.count == 0
    assert 20.0 <= start.elapsed_time(end) < 20_000.0  # milliseconds, at least the sleep
    with pytest.raises(RuntimeError, match="created with argument 'enable_timing=True'"):
        mod.Event().elapsed_time(end)
    with pytest.raises(RuntimeError, match="must be recorded before calculating elapsed time"):
        start.elapsed_time(mod.Event(enable_timing=True))
