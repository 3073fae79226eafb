"""The counters on deterministic inputs: exact counts, nothing counted twice, hooks cleaned up."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn import functional as F

import perf
from perf.counters import FlopCount, OpCount, SyncCount, TransferCount


def _adam_loop(steps: int, log_every: int, **adam: bool) -> SyncCount:
    torch.manual_seed(0)
    X, y = torch.randn(120, 4), torch.randint(0, 3, (120,))
    model = torch.nn.Linear(4, 3)
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


@pytest.mark.parametrize("adam", [{"foreach": False}, {"foreach": True}, {"fused": True}])
@pytest.mark.parametrize("k", [1, 4, 9, 50])
def test_item_every_kth_step_counts_floor_n_over_k(adam, k):
    s = _adam_loop(50, k, **adam)
    assert s.count == 50 // k
    assert s.by_op == ({"item": 50 // k} if 50 // k else {})


def test_adam_step_tensor_reads_are_ignored_but_seen():
    s = _adam_loop(5, 1000, foreach=False)
    assert s.count == 0
    assert s.ignored_optimizer_steps == 5 * 2  # weight and bias, every step


def test_real_sync_inside_optimizer_step_still_counts():
    class Clipping(torch.optim.SGD):
        def step(self, closure=None):  # type: ignore[override]
            norm = torch.stack([p.grad.norm() for p in self.param_groups[0]["params"]]).max()
            if norm.item() > 1e6:  # a real device read inside step()
                raise RuntimeError
            return super().step(closure)

    p = torch.nn.Parameter(torch.ones(3))
    opt = Clipping([p], lr=0.1)
    p.grad = torch.ones(3)
    with perf.count_syncs() as s:
        opt.step()
    assert s.by_op == {"item": 1}


def test_nested_sync_calls_count_once():
    t = torch.randn(4)
    with perf.count_syncs() as s:
        f"{t.sum():.2f}"  # __format__ calls .item() inside
        repr(t)  # many reads inside, one user-visible sync
    assert s.by_op == {"format": 2}


def test_cuda_mode_ignores_host_tensors():
    t = torch.randn(4)
    with perf.count_syncs("cuda") as s:
        t.sum().item()
        t.tolist()
        t.nonzero()
    assert s.count == 0


def test_sync_counter_cleans_up_after_an_exception():
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    before = len(_global_optimizer_pre_hooks)
    with pytest.raises(ZeroDivisionError), perf.count_syncs():
        _ = 1 / 0
    assert len(_global_optimizer_pre_hooks) == before
    with perf.count_syncs() as s:
        pass
    assert s.count == 0


def test_results_are_frozen_and_live_reads_work():
    t = torch.randn(4)
    with perf.count_syncs() as s:
        t.sum().item()
        assert s.count == 1  # live inside the block
    r = s.result()
    assert isinstance(r, SyncCount)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.count = 0  # type: ignore[misc]


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
    assert fused.kernel_launches is None


def test_ops_counts_each_aten_call():
    a = torch.randn(4, 4)
    with perf.count_ops(kernels=False) as o:
        torch.mm(a, a).relu().sum()
    assert o.by_op == {"mm": 1, "relu": 1, "sum": 1}
    assert o.count == 3


def test_transfers_count_each_crossing_once_with_bytes():
    x = torch.randn(256, 4)  # 4 KiB
    with perf.count_transfers() as t:
        for _ in range(3):
            x.to("meta")
        x.to("cpu")  # same device: no transfer
    r = t.result()
    assert isinstance(r, TransferCount)
    assert (r.h2d_copies, r.h2d_bytes, r.d2h_copies) == (3, 3 * 4096, 0)
    assert r.pageable_h2d_copies == 3 and r.pinned_h2d_copies == 0


def test_flops_of_a_matmul_are_2mnk():
    a, b = torch.randn(8, 16), torch.randn(16, 32)
    with perf.count_flops() as f:
        a @ b
    r = f.result()
    assert isinstance(r, FlopCount)
    assert r.total == 2 * 8 * 16 * 32
    assert r.by_op == {"mm": 2 * 8 * 16 * 32}


def test_result_before_block_end_raises():
    with (
        perf.count_ops(kernels=False) as o,
        pytest.raises(RuntimeError, match="once the with-block has ended"),
    ):
        o.result()


@pytest.mark.parametrize(
    ("habit", "expected"),
    [
        (lambda t: print(t.sum()), {"format": 1}),  # print(loss) formats the tensor
        (lambda t: __import__("numpy").asarray(t), {"numpy": 1}),
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
def test_more_habits_are_caught(habit, expected, capsys):
    t = torch.randn(16)
    with perf.count_syncs() as s:
        habit(t)
    assert s.by_op == expected


def _flop_workloads():
    def cnn_amp() -> None:
        m = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
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
