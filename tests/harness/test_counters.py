"""The counters on deterministic inputs: exact counts, nothing counted twice, hooks cleaned up."""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

import pytest
import torch
from _sim import SIM, needs_sim
from torch.nn import functional as F

import perf
from perf.instruments.flops import FlopCount
from perf.instruments.ops import OpCount
from perf.instruments.syncs import SyncCount
from perf.instruments.transfers import TransferCount


def _adam_loop(steps: int, log_every: int, device: torch.device = SIM, **adam: bool) -> SyncCount:
    torch.manual_seed(0)
    X, y = torch.randn(120, 4, device=device), torch.randint(0, 3, (120,), device=device)
    model = torch.nn.Linear(4, 3).to(device)
    opt = torch.optim.Adam(model.parameters(), **adam)
    with perf.count_syncs() as s:
        for i in range(1, steps + 1):
            opt.zero_grad()
            loss = F.cross_entropy(model(X), y)
            loss.backward()
            opt.step()
            if i % log_every == 0:
                loss.item()
    return s.result()


@needs_sim
@pytest.mark.parametrize("adam", [{"foreach": False}, {"foreach": True}, {"fused": True}])
@pytest.mark.parametrize("k", [1, 4, 9, 50])
def test_item_every_kth_step_counts_floor_n_over_k(adam, k):
    s = _adam_loop(50, k, **adam)
    assert s.count == 50 // k
    assert s.by_op == ({"item": 50 // k} if 50 // k else {})


@needs_sim
def test_adam_step_tensors_live_on_the_host_and_never_count():
    """Adam's for-loop/foreach implementations keep ``step`` on the host (as on CUDA) and read
    it with .item(): host reads, not syncs."""
    s = _adam_loop(5, 1000, foreach=False)
    assert s.count == 0 and s.ignored_optimizer_steps == 0


def test_stand_in_mode_counts_cpu_tensors_and_ignores_adam_step_reads():
    """The old opt-in mode: CPU tensors stand in for device tensors (overcounts real code)."""
    s = _adam_loop(5, 1000, device=torch.device("cpu"), foreach=False)
    assert s.count == 0  # default mode: host tensors never count
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), foreach=False)
    with perf.count_syncs(host_as_device=True) as s:
        for _ in range(5):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).sum()
            loss.backward()
            opt.step()
        loss.item()
    assert s.by_op == {"item": 1}
    assert s.result().ignored_optimizer_steps == 5 * 2  # weight and bias, every step


def test_count_syncs_on_the_cpu_is_refused_with_the_way_out():
    with (
        pytest.raises(ValueError, match=r"the CPU is the host.*simulated_device"),
        perf.count_syncs("cpu"),
    ):
        pass


@needs_sim
def test_real_sync_inside_optimizer_step_still_counts():
    class Clipping(torch.optim.SGD):
        def step(self, closure=None):  # type: ignore[override]
            norm = torch.stack([p.grad.norm() for p in self.param_groups[0]["params"]]).max()
            if norm.item() > 1e6:  # a real device read inside step()
                raise RuntimeError
            return super().step(closure)

    p = torch.nn.Parameter(torch.ones(3, device=SIM))
    opt = Clipping([p], lr=0.1)
    p.grad = torch.ones(3, device=SIM)
    with perf.count_syncs() as s:
        opt.step()
    assert s.by_op == {"item": 1}


@needs_sim
def test_each_device_read_counts_as_cuda_flags_it():
    """CUDA's sync debug mode flags every device read, also those inside one Python call:
    ``f"{loss:.2f}"`` reads once, printing a tensor reads many times (``_tensor_str`` computes
    min/max/integer-ness and formats each value; it runs with Python dispatch modes off, so
    the simulated device itself reports these). Pinned down on torch 2.13."""
    t = torch.tensor([0.5, 1.5, 2.5], device=SIM)
    with perf.count_syncs() as s:
        f"{t.sum():.2f}"
    assert s.by_op == {"format": 1}
    with perf.count_syncs() as s:
        repr(t)
    assert set(s.by_op) == {"format"} and s.count > 3, s.by_op


def test_host_tensors_never_count():
    t = torch.randn(4)
    with perf.count_syncs() as s:
        t.sum().item()
        t.tolist()
        t.nonzero()
        f"{t.mean():.3f}"
        if t.mean() < 10:
            pass
    assert s.count == 0


@needs_sim
def test_count_syncs_device_filter():
    t = torch.randn(4, device=SIM)
    with perf.count_syncs("cuda") as s:
        t.sum().item()
    assert s.count == 0
    with perf.count_syncs(SIM) as s:
        t.sum().item()
    assert s.count == 1


def test_sync_counter_cleans_up_after_an_exception():
    from perf.sim.kernels import sync_listeners

    before = len(sync_listeners)
    with pytest.raises(ZeroDivisionError), perf.count_syncs():
        _ = 1 / 0
    assert len(sync_listeners) == before
    with perf.count_syncs() as s:
        pass
    assert s.count == 0


@needs_sim
def test_results_are_frozen_and_live_reads_work():
    t = torch.randn(4, device=SIM)
    with perf.count_syncs() as s:
        t.sum().item()
        assert s.count == 1  # live inside the block
    r = s.result()
    assert isinstance(r, SyncCount)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.count = 0  # type: ignore[misc]


def _log_loss(loss: torch.Tensor) -> float:
    return loss.item()


@needs_sim
def test_by_site_names_the_first_user_frame_and_its_code():
    t = torch.randn(4, device=SIM)
    with perf.count_syncs() as s:
        for _ in range(3):
            _log_loss(t.sum())
        bool(t.sum() > 0)
    r = s.result()
    key = f"{os.path.relpath(__file__)}:{_log_loss.__code__.co_firstlineno + 1}"
    assert r.count == 4 and sum(r.by_site.values()) == 4
    assert r.by_site[key] == 3, r.by_site
    assert r.site_code[key] == "return loss.item()" and r.site_function[key] == "_log_loss"
    assert r.sites[key] == {"n": 3, "function": "_log_loss", "code": "return loss.item()"}
    assert r.by_site.keys() == r.site_code.keys()


def _adam_step_ops(**adam: bool) -> OpCount:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(4)))
    opt = torch.optim.Adam(model.parameters(), **adam)
    model(torch.randn(8, 32)).sum().backward()
    opt.step()
    with perf.count_ops(kernels=False) as o:
        opt.step()
    return o.result()


def test_ops_fused_lt_foreach_lt_for_loop():
    fused = _adam_step_ops(fused=True)
    foreach = _adam_step_ops(foreach=True)
    loop = _adam_step_ops(foreach=False)
    assert fused.count < foreach.count < loop.count
    assert fused.by_op.get("_fused_adam_") == 1
    assert _adam_step_ops(foreach=True).count == foreach.count  # deterministic
    assert fused.kernels is None and fused.host_launches is None


def test_ops_counts_each_aten_call():
    a = torch.randn(4, 4)
    with perf.count_ops(kernels=False) as o:
        torch.mm(a, a).relu().sum()
    assert o.by_op == {"mm": 1, "relu": 1, "sum": 1}
    assert o.count == 3


@needs_sim
def test_transfers_count_each_crossing_once_with_bytes():
    x = torch.randn(256, 4)  # 4 KiB
    with perf.count_transfers() as t:
        for _ in range(3):
            x.to(SIM)
        x.to("cpu")  # same device: no transfer
    r = t.result()
    assert isinstance(r, TransferCount)
    assert (r.h2d_copies, r.h2d_bytes, r.d2h_copies) == (3, 3 * 4096, 0)
    assert r.pageable_h2d_copies == 3 and r.pinned_h2d_copies == 0


@needs_sim
def test_transfers_and_syncs_of_each_copy_kind():
    """Copies on the simulated device: which are transfers, which are syncs (CUDA's rules:
    a copy with non_blocking=False waits; a non-blocking one does not, pinned or not)."""
    x, d = torch.randn(16), torch.randn(16, device=SIM)
    cases = {
        # name: (fn, h2d copies, d2h copies, syncs)
        "to_pageable_blocking": (lambda: x.to(SIM), 1, 0, {"h2d_copy": 1}),
        "to_pinned_non_blocking": (lambda: x.pin_memory().to(SIM, non_blocking=True), 1, 0, {}),
        "to_pinned_blocking": (lambda: x.pin_memory().to(SIM), 1, 0, {"h2d_copy": 1}),
        "torch_tensor": (lambda: torch.tensor([1.0, 2.0], device=SIM), 1, 0, {"torch.tensor": 1}),
        "cpu": (lambda: d.cpu(), 0, 1, {"cpu": 1}),
        "to_cpu_non_blocking": (lambda: d.to("cpu", non_blocking=True), 0, 1, {}),
        "copy_into_pinned_non_blocking": (
            lambda: torch.empty(16).pin_memory().copy_(d, non_blocking=True),
            0,
            1,
            {},
        ),
        "copy_into_pageable": (lambda: torch.empty(16).copy_(d), 0, 1, {"d2h_copy": 1}),
        "same_device": (lambda: d.to(SIM), 0, 0, {}),
        "device_to_device": (lambda: d.clone(), 0, 0, {}),
    }
    for name, (fn, h2d, d2h, syncs) in cases.items():
        with perf.count_syncs() as s, perf.count_transfers() as t:
            fn()
        assert (t.h2d_copies, t.d2h_copies) == (h2d, d2h), (name, t.result())
        assert s.by_op == syncs, (name, s.by_op)


def test_flops_of_a_matmul_are_2mnk():
    a, b = torch.randn(8, 16), torch.randn(16, 32)
    with perf.count_flops() as f:
        a @ b
    r = f.result()
    assert isinstance(r, FlopCount)
    assert r.total == 2 * 8 * 16 * 32
    assert r.by_op == {"mm": 2 * 8 * 16 * 32}


def test_count_flops_takes_no_device_by_position():
    """``count_flops(dev)``, written like ``count_ops(dev)``, took the device for
    ``decompose`` and ran torch's full ``FlopCounterMode`` instead (which cannot count eager
    FlexAttention: torchtitan's trainer failed under it). It is keyword-only now."""
    with pytest.raises(TypeError, match="positional"), perf.count_flops(torch.device("cpu")):  # type: ignore[misc]
        pass
    with perf.count_flops(decompose=True) as f:
        torch.randn(2, 3) @ torch.randn(3, 4)
    assert f.result().total == 2 * 2 * 3 * 4


#: _grouped_mm's layouts: (a, b, offs, the groups as (a's slice, b's operand, out's slice))
_GROUPED = {
    "2d-3d": ((12, 16), (3, 16, 8), [4, 9, 12]),
    "3d-2d": ((3, 4, 16), (16, 12), [4, 9, 12]),
    "2d-2d": ((4, 12), (12, 8), [4, 9, 12]),
    "3d-3d": ((3, 4, 16), (3, 16, 8), None),
}


def _grouped_by_hand(a: torch.Tensor, b: torch.Tensor, offs: list[int] | None) -> torch.Tensor:
    """The same product, one ``mm`` per group (GroupedMMUtils.h ``_grouped_mm_fallback``)."""
    if offs is None:
        return torch.stack([a[g] @ b[g] for g in range(a.shape[0])])
    bounds = list(zip([0, *offs[:-1]], offs, strict=True))
    if a.dim() == 2 and b.dim() == 3:
        return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(bounds)])
    if a.dim() == 3:
        return torch.cat([a[g] @ b[:, s:e] for g, (s, e) in enumerate(bounds)], dim=1)
    return torch.stack([a[:, s:e] @ b[s:e] for s, e in bounds])


@pytest.mark.parametrize("layout", list(_GROUPED))
@pytest.mark.parametrize("decompose", [False, True], ids=["fast", "flop_counter_mode"])
def test_grouped_mm_flops_equal_one_mm_per_group(layout: str, decompose: bool) -> None:
    """torch's flop counter has no formula for ``_grouped_mm`` (mixture-of-experts layers): it
    counted 0 FLOPs. perf's formula gives what the groups' own matmuls give, forward and
    backward (its backward is ``_grouped_mm`` again)."""
    a_shape, b_shape, offs = _GROUPED[layout]
    g = torch.Generator().manual_seed(0)
    a = torch.randn(a_shape, generator=g, requires_grad=True)
    b = torch.randn(b_shape, generator=g, requires_grad=True)
    o = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    with perf.count_flops(decompose=decompose) as grouped:
        out = torch._grouped_mm(a, b, offs=o)
        out.backward(torch.ones_like(out))
    with perf.count_flops(decompose=decompose) as by_hand:
        ref = _grouped_by_hand(a, b, offs)
        ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(out, ref)
    assert grouped.total == by_hand.total > 0, (grouped.by_op, by_hand.by_op)
    assert set(grouped.by_op) == {"_grouped_mm"}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("decompose", [False, True], ids=["fast", "flop_counter_mode"])
def test_chunked_linear_cross_entropy_flops_equal_the_reference_paths(
    reduction: str, decompose: bool
) -> None:
    """``F.linear_cross_entropy`` with ``options`` runs torch's Python custom op, which torch's
    flop counter has no formula for (0 FLOPs for an LLM head's three matmuls). Mean and sum
    precompute both gradients in the forward: 3 x 2NDV, as ``linear``, ``cross_entropy`` and
    their backward count. ``"none"`` recomputes the logits in its backward: 4 x 2NDV, the
    weight gradient an in-place ``addmm_`` (no formula in torch either)."""
    pytest.importorskip("torch.nn.modules.linear_cross_entropy", reason="F.linear_cross_entropy")
    n, d, v = 24, 16, 40
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g, requires_grad=True)
    w = torch.randn(v, d, generator=g, requires_grad=True)
    t = torch.randint(0, v, (n,), generator=g)
    counts = []
    for options in (None, torch.nn.LinearCrossEntropyOptions(batch_chunk_size=7)):
        with perf.count_flops(decompose=decompose) as f:
            loss = F.linear_cross_entropy(x, w, t, reduction=reduction, options=options)
            loss.sum().backward()
        counts.append(f.total)
    once = 2 * n * d * v
    assert counts == [3 * once, (4 if reduction == "none" else 3) * once]


@needs_sim
@pytest.mark.parametrize("decompose", [False, True], ids=["fast", "flop_counter_mode"])
def test_varlen_attention_flops_read_the_lengths_without_a_sync(decompose: bool) -> None:
    """Packed attention's FLOPs depend on the sequence lengths: torch's formulas read them
    through the dispatcher (``offsets.diff().tolist()``), so counting FLOPs or modelling GPU
    time added a sync to the program, which ``count_syncs`` counted (4 a step). perf reads
    them from the host data: the program's syncs only, torch's FLOPs (forward 4 * h * d per
    query-key pair, backward 10)."""
    varlen = pytest.importorskip("torch.nn.attention.varlen", reason="no varlen_attn")
    h, d, lens = 4, 8, [5, 9, 3]
    cu = torch.tensor([0, 5, 14, 17], dtype=torch.int32).to(SIM)
    q, k, v = (torch.randn(17, h, d, device=SIM, requires_grad=True) for _ in range(3))
    pairs = sum(n * n for n in lens)
    with (
        perf.count_syncs() as syncs,
        perf.count_flops(decompose=decompose) as flops,
        perf.model_gpu_time(SIM) as model,
    ):
        varlen.varlen_attn(q, k, v, cu, cu, 9, 9).sum().backward()
    assert syncs.count == 0, syncs
    assert flops.by_op == {
        "_varlen_attn": 4 * h * d * pairs,
        "_varlen_attn_backward": 10 * h * d * pairs,
    }
    assert "d2h_copy" not in model.result().by_op


def test_every_counter_takes_a_higher_order_operator_as_one_op() -> None:
    """FlexAttention is a higher-order operator, which a dispatch mode gets only where it
    says it takes them: every perf counter raised "There was no rule registered for
    HigherOrderOperator flex_attention" around it. Now it is one op (CUDA's one fused kernel
    when compiled), with torch's FLOPs for it."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention", reason="no FlexAttention")
    b, h, s, d = 1, 2, 16, 8
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    with (
        warnings.catch_warnings(),
        perf.count_ops() as ops,
        perf.count_flops() as flops,
        perf.count_syncs() as syncs,
        perf.count_transfers() as transfers,
    ):
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out = fa.flex_attention(q, k, v)
    assert out.shape == q.shape
    assert ops.by_op["flex_attention"] == 1  # beside the default block mask's ops
    assert flops.by_op == {"flex_attention": 4 * b * h * s * s * d}
    assert syncs.count == 0 and transfers.h2d_copies == 0


@needs_sim
def test_torch_cond_counts_the_branch_it_runs_and_its_predicate_read() -> None:
    """``torch.cond`` is a higher-order operator too: it raised under every counter. Eager, it
    reads its predicate (``cond_op_dense``: ``if pred:``, a sync on a device) and runs one
    branch; the counters now count that branch's ops and FLOPs, and the read."""
    x = torch.ones(4, device=SIM)
    w = torch.ones(4, 4, device=SIM)
    with perf.count_ops() as ops, perf.count_flops() as flops, perf.count_syncs() as syncs:
        out = torch.cond(x.sum() > 0, lambda t: t.sin() @ w, lambda t: t.cos() @ w, (x,))
    torch.testing.assert_close(out.cpu(), torch.ones(4).sin() @ torch.ones(4, 4))
    assert ops.by_op.get("sin") == 1 and "cos" not in ops.by_op and "cond" not in ops.by_op
    assert flops.total == 2 * 4 * 4
    assert syncs.count == 1 and syncs.by_op == {"item": 1}, syncs


_FLEX_ON_SIM = """
import warnings, torch, perf
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
warnings.simplefilter("ignore")
dev = perf.simulated_device()
q, k, v = (torch.randn(1, 2, 16, 8, device=dev, requires_grad=True) for _ in range(3))
mask = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 2, 16, 16, device=dev)
with perf.count_ops() as ops, perf.count_flops() as flops, perf.model_gpu_time(dev) as model:
    flex_attention(q, k, v, block_mask=mask).sum().backward()
r = model.result()
print(ops.by_op["flex_attention"], ops.by_op["flex_attention_backward"], flops.total,
      r.launches > 0, ops.by_op["device"] > 0 and "device" not in ops.launches_by_name)
"""


def test_flex_attention_trains_under_every_counter_on_sim() -> None:
    """With gradients, FlexAttention traces its backward graph with ``make_fx`` inside its
    autograd function, under the counters: an error there aborted the process
    ("terminate called after throwing an instance of 'python_error'"); tracing's
    ``prim::device``, which the dispatcher's table does not know, raised one (and launches no
    kernel). A child runs it."""
    pytest.importorskip("torch.nn.attention.flex_attention", reason="no FlexAttention")
    import subprocess
    import sys

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", _FLEX_ON_SIM], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    fwd, bwd = 4 * 2 * 16 * 16 * 8, 10 * 2 * 16 * 16 * 8
    assert proc.stdout.split() == ["1", "1", str(fwd + bwd), "True", "True"], proc.stdout


def test_in_place_addmm_and_baddbmm_count_as_their_functional_forms() -> None:
    a, b, c = torch.randn(4, 5), torch.randn(5, 6), torch.zeros(4, 6)
    ba, bb, bc = torch.randn(2, 4, 5), torch.randn(2, 5, 6), torch.zeros(2, 4, 6)
    with perf.count_flops() as inplace:
        c.addmm_(a, b)
        bc.baddbmm_(ba, bb)
    with perf.count_flops() as functional:
        torch.addmm(c, a, b)
        torch.baddbmm(bc, ba, bb)
    assert inplace.total == functional.total == 2 * 4 * 5 * 6 * 3  # 1 + 2 batches


def test_result_before_block_end_raises():
    with (
        perf.count_ops(kernels=False) as o,
        pytest.raises(RuntimeError, match="once the with-block has ended"),
    ):
        o.result()


@needs_sim
@pytest.mark.parametrize(
    ("habit", "expected"),
    [
        (lambda t: t.cpu().numpy(), {"cpu": 1}),
        (lambda t: t.tolist(), {"tolist": 1}),
        (lambda t: 1 if torch.isnan(t.sum()) else 0, {"bool": 1}),  # `if torch.isnan(loss):`
        (lambda t: [0, 1, 2][t.argmax() % 3], {"index": 1}),  # indexing a list by a tensor
        (lambda t: int(t.argmax()), {"int": 1}),
        (lambda t: torch.isfinite(t).all() or None, {"bool": 1}),  # `assert isfinite(x).all()`
        (lambda t: t.to("cpu"), {"to_cpu": 1}),
        (lambda t: t.to("cpu", non_blocking=True), {}),  # does not wait
        (lambda t: [float(v) for v in t[:3]], {"float": 3}),  # a per-element loop: 3 syncs
        (lambda t: max(t[:3]), {"bool": 2}),  # Python max() compares tensors pairwise
        (lambda t: torch.nonzero(t > 0, as_tuple=True), {"nonzero": 1}),
        (lambda t: t.unique_consecutive(), {"unique_consecutive": 1}),
    ],
)
def test_more_habits_are_caught(habit, expected):
    t = torch.randn(16, device=SIM)
    with perf.count_syncs() as s:
        habit(t)
    assert s.by_op == expected


def _flop_workloads():
    def cnn_amp() -> None:
        m = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(8 * 16 * 16, 10),
        )
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(torch.randn(4, 3, 16, 16)).sum()
        loss.backward()

    def attention() -> None:
        q = torch.randn(2, 4, 16, 8, requires_grad=True)
        F.scaled_dot_product_attention(q, q, q).sum().backward()
        a = torch.randn(3, 4, 5, requires_grad=True)
        torch.einsum("bij,bjk->bik", a, a.transpose(1, 2)).sum().backward()

    def mlp_step() -> None:
        m = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        opt = torch.optim.Adam(m.parameters())
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(m(torch.randn(120, 4)), torch.randint(0, 3, (120,))).backward()
            opt.step()

    return [cnn_amp, attention, mlp_step]


@pytest.mark.parametrize("work", _flop_workloads(), ids=lambda f: f.__name__)
def test_fast_flop_count_equals_flop_counter_mode(work):
    torch.manual_seed(0)
    with perf.count_flops(decompose=True) as full:
        work()
    torch.manual_seed(0)
    with perf.count_flops() as fast:
        work()
    assert fast.total == full.total > 0
    assert fast.by_op == full.by_op


def _eval_step(model: torch.nn.Module, x: torch.Tensor, host: torch.Tensor) -> float:
    """An evaluation step as real code writes it: a batch moved over, a forward, a read."""
    batch = host.to(x.device)
    target = torch.zeros(4, dtype=torch.long, device=x.device)
    return float(F.cross_entropy(model(x + batch), target).item())


def _counted(step: Any) -> tuple[Any, ...]:
    """What the device does in ``step``, each counter alone (stacked, the top mode would
    decompose for all): FLOPs, launches, copies, syncs, the modelled kernel, copy and sync
    events (not the op names: autograd under ``no_grad`` dispatches ``detach`` calls that
    launch nothing and that ``inference_mode`` skips)."""
    with perf.count_flops() as f:
        step()
    with perf.count_ops(SIM) as o:
        step()
    with perf.count_transfers() as t:
        step()
    with perf.count_syncs(SIM) as s:
        step()
    with perf.model_gpu_time(SIM) as g:
        step()
    events = [(e.kind, e.name, e.flops, e.nbytes) for e in g.events if e.kind != "host"]
    return f.result(), o.host_launches, o.launches_by_name, t.result(), s.by_op, events


@needs_sim
def test_inference_mode_counts_what_no_grad_counts():
    """Under ``torch.inference_mode()`` (and on inference tensors) a dispatch mode receives
    composite ops whole (``linear``, ``to``, ``item``) that autograd otherwise decomposes: every
    counter decomposes them, so FLOPs, launches, copies, syncs and the modelled events equal
    the same step's under ``no_grad``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model = model.to(SIM)
    x, host = torch.randn(4, 8, device=SIM), torch.randn(4, 8)
    with torch.no_grad():
        plain = _counted(lambda: _eval_step(model, x, host))
    with torch.inference_mode():
        inference = _counted(lambda: _eval_step(model, x, host))
        x_inf, host_inf = x.clone(), host.clone()  # inference tensors, used outside the mode
    outside = _counted(lambda: _eval_step(model, x_inf, host_inf))
    flops, launches, by_name, transfers, syncs, events = plain
    assert flops.total == 2 * 4 * (8 * 16 + 16 * 3) and by_name["addmm"] == 2
    assert launches == 7 and transfers.h2d_copies == 1
    assert syncs == {"h2d_copy": 1, "item": 1}
    assert [e[1] for e in events if e[0] == "kernel"][:4] == ["zeros", "add", "addmm", "relu"]
    assert inference == plain
    assert outside == plain


@needs_sim
def test_an_op_with_a_kernel_of_its_own_stays_whole_under_inference_mode():
    """Only ops that autograd would decompose are decomposed: an op with a backend kernel of
    its own (``silu_backward``'s fused CPU and CUDA kernels) runs it, so the program measured
    is the program run. ``sim``'s kernel for CUDA's ``group_norm`` path is CUDA's composite:
    a mode sees what it calls (``native_group_norm`` of a contiguous input), as on CUDA."""
    from perf.instruments.modes import autograd_decomposes

    a = torch.ops.aten
    assert autograd_decomposes(a.linear.default) and autograd_decomposes(a.to.dtype_layout)
    assert not autograd_decomposes(a.silu_backward.default)
    assert autograd_decomposes(a.group_norm.default)
    x = torch.randn(2, 4, 3, 3, device=SIM).to(memory_format=torch.channels_last)
    gn = torch.nn.GroupNorm(2, 4).to(SIM)
    with torch.inference_mode(), perf.count_ops(SIM) as o:
        y = gn(x)
    assert "group_norm" not in o.by_op and o.by_op["native_group_norm"] == 1, o.by_op
    assert y.is_contiguous()  # CUDA's path: input.contiguous()


def test_rnns_under_inference_mode_count_the_cpp_composite_not_a_python_decomposition():
    """An RNN under ``inference_mode`` reaches a mode whole; the mode runs the C++ composite
    the device runs (on the CPU: oneDNN's LSTM, one op per layer), not ``torch._decomp``'s
    Python decomposition, which ``OpOverload.decompose()`` prefers and which ran the LSTM as
    one ``addmm`` per time step and direction (changing the program it measured): the counts
    equal ``no_grad``'s, and so do the values."""
    torch.manual_seed(0)
    m = torch.nn.LSTM(8, 16, num_layers=2)
    x = torch.randn(12, 3, 8)
    with torch.no_grad(), perf.count_ops() as plain:
        want = m(x)[0]
    with torch.inference_mode(), perf.count_ops() as inference:
        got = m(x)[0]
    assert "addmm" not in inference.by_op, inference.by_op
    assert {k: v for k, v in inference.by_op.items() if k != "lstm"} == plain.by_op
    assert torch.equal(got, want)


@needs_sim
def test_rnns_on_sim_under_inference_mode_count_cudas_cudnn_call():
    """On ``sim`` under ``inference_mode`` a mode runs ``sim``'s kernel for CUDA's path: the
    ops CUDA's composite dispatches (``try_get_weight_buf``'s ``empty`` + ``set_``, one
    ``_cudnn_rnn``), as under ``no_grad``."""
    m = torch.nn.GRU(8, 16).to(SIM)
    x = torch.randn(5, 2, 8, device=SIM)
    with torch.no_grad(), perf.count_ops(SIM) as plain:
        m(x)
    with torch.inference_mode(), perf.count_ops(SIM) as inference:
        m(x)
    assert plain.by_op["_cudnn_rnn"] == 1
    assert {k: v for k, v in inference.by_op.items() if k != "gru"} == plain.by_op


def test_a_count_before_sim_is_installed_does_not_decide_for_sim(tmp_path):
    """Whether an op stays whole is read again once ``sim`` registers its kernels: a count
    under ``inference_mode`` on the CPU, then ``sim`` installed, then the same on ``sim``,
    which must take CUDA's ``group_norm`` path (a fresh process: this one has ``sim``)."""
    import subprocess
    import sys

    code = (
        "import torch, perf\n"
        "gn = torch.nn.GroupNorm(2, 4)\n"
        "x = torch.randn(2, 4, 3, 3).to(memory_format=torch.channels_last)\n"
        "with torch.inference_mode(), perf.count_ops() as o:\n"
        "    gn(x)\n"
        "cpu_whole = 'group_norm' in o.by_op\n"
        "dev = perf.simulated_device()\n"
        "gn, x = gn.to(dev), x.to(dev)\n"
        "with torch.inference_mode(), perf.count_ops(dev) as o:\n"
        "    y = gn(x)\n"
        "print(cpu_whole, 'group_norm' in o.by_op, o.by_op.get('native_group_norm'),\n"
        "      y.is_contiguous())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CUDA_"))}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    # on sim: decomposed by sim's kernel for CUDA's path (a contiguous output), not torch's
    # PrivateUse1 composite (channels-last)
    assert proc.stdout.split() == ["False", "False", "1", "True"], proc.stdout
