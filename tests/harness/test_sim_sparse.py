"""Sparse COO tensors on ``sim`` (``SparsePrivateUse1``): they compute as on the CPU, and count
syncs, transfers and modelled copies as on CUDA (docs/sim.md, "Sparse tensors").

Why: graph networks keep the adjacency matrix sparse on the GPU; pytorch/examples' GCN failed
on ``sim`` in its first ``.to(device)`` of a sparse tensor.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _sim import SIM, counted_as_on_cuda, needs_sim

import perf

pytestmark = [
    needs_sim,
    pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning"),
]


def _sparse(n: int = 6, coalesced: bool = True, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(n, n, generator=g) * (torch.rand(n, n, generator=g) < 0.4)
    s = dense.to_sparse()
    if coalesced:
        return s
    # the same entries, each split in two halves: uncoalesced, the same dense value
    i, v = s._indices(), s._values()
    return torch.sparse_coo_tensor(torch.cat([i, i], 1), torch.cat([v / 2, v / 2]), s.size())


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    a, b = a.cpu(), b.cpu()
    if a.is_sparse:
        a, b = a.to_dense(), b.to_dense()
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_sparse_tensors_live_on_sim_and_compute_as_on_the_cpu() -> None:
    s = _sparse(coalesced=False)
    d = torch.randn(6, 3)
    ss, ds = s.to(SIM), d.to(SIM)
    assert ss.is_sparse and ss.device == SIM and ss._indices().device == SIM
    assert (ss._nnz(), ss.is_coalesced()) == (s._nnz(), False)
    _close(torch.mm(ss, ds), torch.mm(s, d))
    _close(torch.sparse.mm(ss, ds), torch.sparse.mm(s, d))
    _close(torch.addmm(ds[:, :3], ss, ds), torch.addmm(d[:, :3], s, d))
    c = ss.coalesce()
    assert c.is_coalesced() and c._nnz() == s.coalesce()._nnz()
    _close(c, s)
    _close(ss * 2, s * 2)
    _close(ss + ss, s + s)
    _close(ss.t(), s.t())
    _close(torch.sparse.sum(ss), torch.sparse.sum(s))
    _close(ss.to_dense(), s.to_dense())
    x = d @ d.t() * (torch.rand(6, 6) < 0.5)
    xs = x.to(SIM).to_sparse()  # a dense sim tensor made sparse on the device
    assert xs.is_sparse and xs.device == SIM
    _close(xs, x.to_sparse())
    made = torch.sparse_coo_tensor(s._indices().to(SIM), s._values().to(SIM), s.size())
    assert made.device == SIM
    _close(made, s)
    empty = torch.empty(3, 4, layout=torch.sparse_coo, device=SIM)
    assert empty.device == SIM and empty._nnz() == 0 and empty.shape == (3, 4)


def test_in_place_ops_on_a_sparse_sim_tensor_keep_its_identity() -> None:
    s = _sparse()
    z = s.to(SIM)
    before = id(z)
    z.add_(z)  # new indices and values for the host tensor: copied back in
    _close(z, s + s)
    z.mul_(0.5)  # values in place
    _close(z, s)
    z.transpose_(0, 1)  # sizes and flag change on the sim tensor itself
    _close(z, s.t())
    z.zero_()
    assert id(z) == before and z._nnz() == 0 and z.is_sparse


def test_sparse_training_step_matches_the_cpu() -> None:
    """A graph convolution (pytorch/examples' GCN: sparse features and adjacency, dense
    weights): the same loss and gradients on ``sim`` as on the CPU."""
    adj, feats = _sparse(8, seed=1), _sparse(8, seed=2)
    w = torch.randn(8, 4)
    grads = []
    for dev in (torch.device("cpu"), SIM):
        wd = w.clone().to(dev).requires_grad_()
        a, f = adj.to(dev), feats.to(dev)
        loss = torch.spmm(a, torch.mm(f, wd)).relu().sum()
        loss.backward()
        grads.append((loss.detach().cpu(), wd.grad.cpu()))
    _close(grads[0][0], grads[1][0])
    _close(grads[0][1], grads[1][1])


Setup = Callable[[torch.device], Callable[[], Any]]

#: case -> (setup, syncs by op, the CUDA source of the count)
CASES: dict[str, tuple[Setup, dict[str, int], str]] = {
    "mm_coalesced": (
        lambda d: (lambda s, x: lambda: torch.mm(s, x))(_sparse().to(d), torch.randn(6, 2).to(d)),
        {},
        "s_addmm_out_sparse_dense_cuda: coalesce() returns early, cuSPARSE reads nothing back",
    ),
    "mm_uncoalesced": (
        lambda d: (lambda s, x: lambda: torch.mm(s, x))(
            _sparse(coalesced=False).to(d), torch.randn(6, 2).to(d)
        ),
        {"sparse_mm": 1},
        "s_addmm_out_sparse_dense_cuda: sparse_.coalesce() -> _coalesce_sparse_cuda reads nnz",
    ),
    "mm_backward": (
        lambda d: (lambda s, w: lambda: torch.mm(s, w).sum().backward())(
            _sparse().to(d), torch.randn(6, 2).to(d).requires_grad_()
        ),
        {"sparse_mm": 1},
        "mm_mat2_backward: mat1.t().mm(grad); sparse_transpose_ marks the transpose uncoalesced",
    ),
    "coalesce": (
        lambda d: (lambda s: lambda: s.coalesce())(_sparse(coalesced=False).to(d)),
        {"coalesce": 1},
        "_coalesce_sparse_cuda: thrust::unique_by_key, then the new nnz read on the host",
    ),
    "coalesce_one_entry": (
        lambda d: (lambda s: lambda: s.coalesce())(
            torch.sparse_coo_tensor([[0], [1]], [2.0], (2, 2)).to(d)
        ),
        {},
        "_coalesce_sparse_cuda: nnz < 2 is cloned and marked coalesced",
    ),
    "to_sparse": (
        lambda d: (lambda x: lambda: x.to_sparse())(torch.eye(4).to(d)),
        {"to_sparse": 1},
        "dense_to_sparse: self.nonzero()",
    ),
    "index_select_sparse_dim": (
        lambda d: (lambda s, i: lambda: s.index_select(0, i))(
            _sparse().to(d), torch.tensor([0, 2]).to(d)
        ),
        {"sparse_index_select": 1},
        "index_select_sparse_cuda: intrsc_counts_nneg_index.sum().item() ('Unavoidable sync')",
    ),
    "to_device": (
        lambda d: (lambda s: lambda: s.to(d))(_sparse()),
        {"h2d_copy": 2},
        "_to_copy of a sparse tensor: its indices and its values, each a blocking copy",
    ),
    "add_and_sum": (
        lambda d: (lambda s: lambda: (s + s, s * 3, s.sum(), s.to_dense()))(_sparse().to(d)),
        {},
        "add_out_sparse_cuda concatenates (no nnz read), sum_coo sums the values, "
        "sparse_to_dense adds into zeros",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sparse_syncs_count_as_on_cuda(name: str) -> None:
    """The same count from sim's device and from the code that counts on ``cuda:0``."""
    setup, expected, source = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = setup(SIM)
        with perf.count_syncs(SIM) as s:
            run()
        run = setup(SIM)
        with counted_as_on_cuda(SIM) as c:
            run()
    assert s.by_op == expected, (name, source, s.by_op)
    assert dict(c.by_op) == expected, (name, source, c.by_op)


def test_a_sparse_copy_is_its_indices_and_values_in_every_counter() -> None:
    x = torch.zeros(100, 100)
    x[torch.arange(100), torch.arange(100)] = 1.0
    s = x.to_sparse()  # 100 entries: 2 x 100 int64 indices (1,600 B), 100 float values (400 B)
    with perf.count_transfers() as t, perf.model_gpu_time(SIM) as m:
        back = s.to(SIM).cpu()
    _close(back, s)
    assert (t.h2d_copies, t.h2d_bytes, t.d2h_copies, t.d2h_bytes) == (2, 2000, 2, 2000)
    copies = [(e.nbytes, e.direction) for e in m.events if e.kind == "copy"]
    assert copies == [(1600, "h2d"), (400, "h2d"), (1600, "d2h"), (400, "d2h")]


def test_a_host_sparse_tensor_beside_a_sim_tensor_fails_as_on_cuda() -> None:
    with pytest.raises(RuntimeError, match="same device"):
        torch.mm(_sparse(), torch.randn(6, 2).to(SIM))


def test_compressed_sparse_layouts_fail_naming_sim_and_the_way_out() -> None:
    """CSR and the other compressed layouts are not simulated: say so, and what to do."""
    x = torch.eye(3)
    with pytest.raises(NotImplementedError, match=r"does not simulate.*COO layout"):
        x.to(SIM).to_sparse_csr()
    with pytest.raises(NotImplementedError, match=r"sparse compressed tensor.*COO layout"):
        x.to_sparse_csr().to(SIM) @ torch.ones(3, 2, device=SIM)


def test_every_instrument_runs_around_a_sparse_step() -> None:
    """The counters and the GPU time model together around a sparse training step; a sparse
    operand's bytes in the model are its indices' and values', not the dense size's."""
    adj = torch.eye(64).to_sparse().to(SIM)  # 64 entries: 1,024 B of indices, 256 B of values
    w = torch.randn(64, 8, device=SIM, requires_grad=True)
    with (
        perf.count_syncs(SIM) as s,
        perf.count_transfers(),
        perf.count_ops(SIM) as o,
        perf.count_flops(),
        perf.model_gpu_time(SIM) as m,
    ):
        torch.spmm(adj, w).relu().sum().backward()
    assert s.by_op == {"sparse_mm": 1} and o.count > 0
    mm = next(e for e in m.events if e.kind == "kernel" and e.name == "mm")
    assert mm.nbytes == 1024 + 256 + 64 * 8 * 4 * 2  # the sparse operand, w, the output


@pytest.mark.parametrize(
    "opt_cls, syncs",
    [
        (torch.optim.SGD, {}),  # add_out_dense_sparse_cuda: index_add_, no read
        (torch.optim.SparseAdam, {"coalesce": 3}),  # grad.coalesce() each step
        (torch.optim.Adagrad, {"coalesce": 3}),
    ],
)
def test_sparse_embedding_gradients_train_as_on_the_cpu(opt_cls: Any, syncs: dict) -> None:
    """``nn.Embedding(sparse=True)``: its gradient is an uncoalesced sparse tensor, which
    SparseAdam and Adagrad coalesce every step (one read of the new nnz on CUDA)."""
    weights = []
    for dev in (torch.device("cpu"), SIM):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(50, 8, sparse=True).to(dev)
        opt = opt_cls(emb.parameters(), lr=0.1)
        idx = torch.tensor([[1, 2, 3], [3, 4, 1]]).to(dev)
        with perf.count_syncs(SIM) as s:
            for _ in range(3):
                opt.zero_grad()
                emb(idx).pow(2).sum().backward()
                opt.step()
        assert emb.weight.grad is not None and emb.weight.grad.is_sparse
        weights.append(emb.weight.detach().cpu())
    _close(weights[0], weights[1])
    assert s.by_op == syncs
