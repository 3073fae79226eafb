"""cuDNN's RNN path on ``sim`` (``perf/sim/rnn.py``): ``nn.LSTM`` / ``GRU`` / ``RNN`` run op for op
as on ``cuda:0`` with cuDNN enabled (the default), with the CPU's values.

The CUDA truth, derived from the sources (``RNN.cpp`` ``use_cudnn``, ``cudnn/RNN.cpp``
``_cudnn_impl`` / ``try_get_weight_buf`` / ``get_dropout_state``, ``nn/modules/rnn.py``
``flatten_parameters``), as each test says.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from _sim import needs_sim
from torch.nn.utils.rnn import pack_padded_sequence

import perf
from perf.sim import rnn

pytestmark = needs_sim

CELLS = {
    "lstm": lambda **kw: torch.nn.LSTM(8, 16, **kw),
    "gru": lambda **kw: torch.nn.GRU(8, 16, **kw),
    "rnn_tanh": lambda **kw: torch.nn.RNN(8, 16, **kw),
    "rnn_relu": lambda **kw: torch.nn.RNN(8, 16, nonlinearity="relu", **kw),
}


@pytest.mark.parametrize("kind", list(CELLS))
def test_an_rnn_is_one_cudnn_call_forward_and_backward(kind: str) -> None:
    """``.to(dev)`` flattens the weights into one buffer (``_cudnn_rnn_flatten_weight``); a
    call is ``try_get_weight_buf``'s ``empty`` + ``set_`` and one ``_cudnn_rnn``, its backward
    one ``_cudnn_rnn_backward``: no per-time-step cell ops, and no sync."""
    dev = perf.simulated_device()
    m = CELLS[kind](num_layers=2)
    with perf.count_ops() as moved:
        m.to(dev)
    assert moved.by_op.get("_cudnn_rnn_flatten_weight") == 1, moved.by_op
    ws = list(m._flat_weights)
    st = ws[0].untyped_storage()._cdata
    offsets = [w.storage_offset() for w in ws]
    assert all(w.untyped_storage()._cdata == st for w in ws)
    assert offsets == [sum(w.numel() for w in ws[:i]) for i in range(len(ws))]
    x = torch.randn(7, 3, 8, device=dev)
    with perf.count_ops() as o, perf.count_syncs() as s, warnings.catch_warnings():
        warnings.simplefilter("error")  # cuDNN warns when it must copy unflattened weights
        out = m(x)[0]
        out.sum().backward()
    by = o.by_op
    assert by["_cudnn_rnn"] == 1 and by["_cudnn_rnn_backward"] == 1, by
    assert by["empty"] == 1 and by["set_"] == 1, by
    assert not any("cell" in k for k in by), by
    assert s.count == 0


def test_weights_outside_one_buffer_are_copied_by_the_call() -> None:
    """``try_get_weight_buf`` gives none where the weights are not one buffer in order (a
    functional call with separate tensors): ``_cudnn_rnn`` copies them into a buffer of its own,
    a new allocation the size of the weights, with cuDNN's warning; gradients still reach each
    tensor."""
    dev = perf.simulated_device()
    g = torch.Generator().manual_seed(0)
    shapes = [(64, 8), (64, 16), (64,), (64,)]
    cpu = [torch.randn(s, generator=g).requires_grad_() for s in shapes]
    sim = [w.detach().to(dev).requires_grad_() for w in cpu]
    x = torch.randn(5, 2, 8, generator=g)
    h = torch.zeros(1, 2, 16)

    def run(xx, hh, ws):
        return torch._VF.lstm(xx, (hh, hh), ws, True, 1, 0.0, True, False, False)[0]

    xs, hs = x.to(dev), h.to(dev)
    with perf.count_ops() as o, pytest.warns(UserWarning, match="single contiguous chunk"):
        ys = run(xs, hs, sim)
    y = run(x, h, cpu)
    assert o.by_op["_cudnn_rnn"] == 1 and o.by_op["set_"] == 1, o.by_op
    assert torch.equal(ys.cpu(), y)
    ys.sum().backward()
    y.sum().backward()
    for a, b in zip(cpu, sim, strict=True):
        assert b.grad is not None and a.grad is not None and torch.equal(b.grad.cpu(), a.grad)


def test_dropout_state_is_made_once_with_a_sync_and_again_after_a_reseed() -> None:
    """``get_dropout_state``: in training with dropout, the first call draws a seed on the
    device and reads it (``.item()``: a sync), then ``_cudnn_init_dropout_state``; later calls
    reuse the state; ``manual_seed``, with any seed, resets it (``reset_rnn_state``). In eval,
    nothing. The seed draw leaves the program's random stream alone: values and gradients
    equal a CPU run's."""
    dev = perf.simulated_device()
    torch.manual_seed(0)
    m = torch.nn.LSTM(8, 16, num_layers=3, dropout=0.5)
    ms = copy.deepcopy(m).to(dev)
    x = torch.randn(6, 2, 8)
    rnn._DROPOUT.clear()
    rnn._STALE.clear()

    def step(module, xx):
        out = module(xx)[0]
        out.pow(2).sum().backward()
        return out

    syncs = []
    xs = x.to(dev)
    for reseed in (True, False, True, False):
        if reseed:
            torch.manual_seed(0)  # the same seed again resets too, as on CUDA
        state = torch.get_rng_state()
        with perf.count_syncs() as s, perf.count_ops() as o:
            ys = step(ms, xs)
        syncs.append((s.count, o.by_op.get("_cudnn_init_dropout_state", 0)))
        after_sim = torch.get_rng_state()
        torch.set_rng_state(state)
        y = step(m, x)
        assert torch.equal(ys.cpu(), y)
        assert torch.equal(torch.get_rng_state(), after_sim)  # the same draws, no more
    assert syncs == [(1, 1), (0, 0), (1, 1), (0, 0)]
    for p, q in zip(m.parameters(), ms.parameters(), strict=True):
        assert torch.equal(q.grad.cpu(), p.grad)
    ms.eval()
    torch.manual_seed(9)
    with perf.count_syncs() as s, perf.count_ops() as o, torch.no_grad():
        ms(xs)
    assert s.count == 0 and "_cudnn_init_dropout_state" not in o.by_op


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_packed_sequences_take_the_packed_cudnn_call(kind: str) -> None:
    """``lstm.data`` / ``gru.data`` (a ``PackedSequence``): one ``_cudnn_rnn`` with the batch
    sizes (a host tensor: read without a sync), values and gradients as on the CPU."""
    dev = perf.simulated_device()
    torch.manual_seed(0)
    m = CELLS[kind](bidirectional=True)
    ms = copy.deepcopy(m).to(dev)
    x = torch.randn(6, 3, 8)
    lengths = torch.tensor([6, 4, 2])
    xs = x.to(dev).requires_grad_()
    x.requires_grad_()
    with perf.count_ops() as o, perf.count_syncs() as s:
        out_s = ms(pack_padded_sequence(xs, lengths))[0].data
    out = m(pack_padded_sequence(x, lengths))[0].data
    assert o.by_op["_cudnn_rnn"] == 1 and s.count == 0, o.by_op
    assert torch.equal(out_s.cpu(), out)
    out_s.sum().backward()
    out.sum().backward()
    assert xs.grad is not None and x.grad is not None and torch.equal(xs.grad.cpu(), x.grad)


def test_without_cudnn_or_under_inference_mode() -> None:
    """cuDNN off: CUDA runs the fused cells, and so does ``sim`` (with separate weights, since
    ``flatten_parameters`` is CUDA's no-op then). Under ``inference_mode`` (no autograd keys)
    the call is cuDNN's too."""
    dev = perf.simulated_device()
    with torch.backends.cudnn.flags(enabled=False):
        m = torch.nn.LSTM(8, 16).to(dev)
        ws = list(m._flat_weights)
        assert len({w.untyped_storage()._cdata for w in ws}) == len(ws)
        with perf.count_ops() as o:
            m(torch.randn(4, 2, 8, device=dev))
    assert "_cudnn_rnn" not in o.by_op and o.by_op["_thnn_fused_lstm_cell"] == 4, o.by_op
    torch.manual_seed(0)
    m = torch.nn.GRU(8, 16)
    ms = copy.deepcopy(m).to(dev)
    x = torch.randn(4, 2, 8)
    with torch.inference_mode(), perf.count_ops() as o:
        ys = ms(x.to(dev))[0]
    # no autograd key: a dispatch mode gets the composite op itself, and perf's counters run
    # it as the device would (test_counters.py): sim's kernel, cuDNN's call
    assert o.by_op == {"_cudnn_rnn": 1, "empty": 1, "set_": 1, "zeros": 1, "_to_copy": 1}
    with torch.inference_mode():
        assert torch.equal(ys.cpu(), m(x)[0])


def test_flops_of_cudnns_rnn_are_its_matmuls() -> None:
    """``torch.utils.flop_counter`` has no formula for ``_cudnn_rnn``; perf's counts each weight
    matrix once per token, 2 per multiply-add, and the backward twice that (data and weight
    gradients). LSTM(8, 16), 2 layers, 5 x 3 tokens: layer 0 64x8 + 64x16, layer 1 64x16 +
    64x16 -> 2 * 15 * 3584 = 107,520 forward, 215,040 backward."""
    dev = perf.simulated_device()
    m = torch.nn.LSTM(8, 16, num_layers=2).to(dev)
    x = torch.randn(5, 3, 8, device=dev)
    with perf.count_flops() as f:
        m(x)[0].sum().backward()
    assert f.by_op == {"_cudnn_rnn": 107_520, "_cudnn_rnn_backward": 215_040}, f.by_op


def test_compiled_module_with_an_lstm_runs_as_eager() -> None:
    """Dynamo does not trace RNN modules (``allow_rnn`` is off by default): the LSTM runs
    eagerly inside a compiled model, on cuDNN's path, with the CPU's values."""
    dev = perf.simulated_device()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LSTM(8, 16))
    ns = copy.deepcopy(net).to(dev)
    x = torch.randn(5, 2, 8)
    compiled = torch.compile(ns)
    with perf.count_ops() as o:
        out = compiled(x.to(dev))[0]
    assert torch.equal(out.cpu(), net(x)[0])
    assert o.by_op.get("_cudnn_rnn") == 1, o.by_op


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_runs_cudnns_rnn_in_float16_whatever_the_dtype(dtype: torch.dtype) -> None:
    """``cudnn/AutocastRNN.cpp``: under autocast ``_cudnn_rnn`` casts to float16 (``kHalf``
    hard-coded, so bf16 autocast gives float16 RNN outputs on CUDA): the weights into a new
    float16 buffer (``zeros``, then a view and a ``copy_`` each), input and states cast. The
    float32 weights get float32 gradients through the copies; the output equals the CPU's RNN
    run on the float16-cast tensors."""
    dev = perf.simulated_device()
    torch.manual_seed(0)
    m = torch.nn.LSTM(8, 16, num_layers=2)
    ms = copy.deepcopy(m).to(dev)
    x = torch.randn(5, 3, 8)
    xs = x.to(dev)
    with perf.count_ops() as o:
        with torch.autocast("sim", dtype=dtype):
            ys, (hy, cy) = ms(xs)
        ys.float().sum().backward()
    assert ys.dtype == hy.dtype == cy.dtype == torch.float16
    n = len(m._flat_weights)
    assert o.by_op["_cudnn_rnn"] == 1 and o.by_op["copy_"] == n and o.by_op["set_"] == n + 1
    h0 = torch.zeros(2, 3, 16, dtype=torch.float16)
    half = [w.detach().half() for w in m._flat_weights]
    ref = torch._VF.lstm(x.half(), (h0, h0), half, True, 2, 0.0, True, False, False)[0]
    assert torch.equal(ys.cpu(), ref)
    for p in ms.parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32 and p.grad.abs().sum() > 0


def test_an_optimizer_made_before_the_move_trains_a_model_with_an_rnn() -> None:
    """``module.to(dev)`` keeps Parameter objects on CUDA; ``sim`` swaps them to the same
    effect, but fell back to PyTorch's path for ``PrivateUse1`` (new Parameters) where a tensor
    was weakly referenced, as an RNN module's weights always are (``_flat_weight_refs``, which
    it drops itself before the swap): an optimizer made before the move (stable-baselines3 and
    sb3-contrib make theirs so) held the old host tensors, and training on ``sim`` changed
    nothing. Found on sb3-contrib's RecurrentPPO."""
    dev = perf.simulated_device()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LSTM(8, 16))
    ref = copy.deepcopy(m)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.1)
    before = list(m.parameters())
    m.to(dev)
    assert all(a is b for a, b in zip(before, m.parameters(), strict=True))
    assert all(p.device == dev for p in opt.param_groups[0]["params"])
    x = torch.randn(5, 3, 8)
    for model, o, xx in ((m, opt, x.to(dev)), (ref, ref_opt, x)):
        model(xx)[0].pow(2).mean().backward()
        o.step()
    for a, b in zip(ref.parameters(), m.parameters(), strict=True):
        assert torch.equal(b.detach().cpu(), a.detach())
