"""Errors inside ``sim``'s kernels name the simulated device, the operator and what to do
(perf/sim/errors.py), keep their type and chain the original."""

from __future__ import annotations

import pytest
import torch
from _sim import SIM, needs_sim

from perf.sim import errors

pytestmark = needs_sim


def test_a_kernel_error_names_sim_the_op_and_a_workaround() -> None:
    x = torch.randn(2, 3, 4, device=SIM).transpose(1, 2)
    with pytest.raises(RuntimeError, match="view size is not compatible") as info:
        x.view(-1)
    text = str(info.value)
    assert errors.MARK in text and "simulated device (sim)" in text
    assert "aten.view.default" in text
    assert "x.contiguous()" in text  # the known workaround
    assert "please report it" in text
    cause = info.value.__cause__
    assert type(cause) is RuntimeError and errors.MARK not in str(cause)


def test_the_type_is_kept_and_the_message_comes_first() -> None:
    a, b = torch.randn(2, 3, device=SIM), torch.randn(4, 5, device=SIM)
    with pytest.raises(RuntimeError) as info:
        a @ b
    assert str(info.value).startswith("mat1 and mat2 shapes cannot be multiplied")
    assert "aten.mm.default" in str(info.value)


def test_an_error_in_a_cuda_op_kernel_names_sim() -> None:
    gates = torch.randn(3, 32, device=SIM)
    with pytest.raises(RuntimeError, match=r"\[perf sim\]") as info:
        torch.ops.aten._thnn_fused_lstm_cell(gates, gates, torch.randn(3, 5, device=SIM))
    assert "aten._thnn_fused_lstm_cell.default" in str(info.value)


def test_the_mark_is_added_once_and_odd_types_get_a_note() -> None:
    class Odd(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(a, b)

    err = Odd(1, 2)
    out = errors.on_sim(torch.ops.aten.add.Tensor, err)
    assert out is err and errors.MARK in err.__notes__[0]
    assert errors.on_sim(torch.ops.aten.add.Tensor, err) is err
    once = errors.on_sim(torch.ops.aten.add.Tensor, ValueError("bad"))
    assert isinstance(once, ValueError)
    assert str(errors.on_sim(torch.ops.aten.add.Tensor, once)).count(errors.MARK) == 1


def test_half_kernels_missing_on_the_cpu_name_the_workaround() -> None:
    err = RuntimeError("\"foo\" not implemented for 'Half'")
    assert "float32" in str(errors.on_sim(torch.ops.aten.add.Tensor, err))


@needs_sim
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_nested_tensors_fail_naming_sim_and_the_fast_path_switch() -> None:
    """``nn.TransformerEncoder``'s inference fast path makes a nested tensor from a padding
    mask; ``sim`` does not simulate them and failed with "NestedTensorImpl doesn't support
    sizes. Please file an issue". It now says what and how to run on: without the fast path
    the encoder computes the CPU's values at every unpadded position."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    on_sim = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval().to(SIM)
    on_sim.load_state_dict(enc.state_dict())
    x = torch.randn(3, 10, 32)
    pad = torch.zeros(3, 10, dtype=torch.bool)
    pad[0, 6:] = pad[2, 3:] = True
    with torch.inference_mode():
        ref = enc(x, src_key_padding_mask=pad)
        with pytest.raises(NotImplementedError, match="does not simulate nested tensors") as e:
            on_sim(x.to(SIM), src_key_padding_mask=pad.to(SIM))
        assert "set_fastpath_enabled(False)" in str(e.value)
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            out = on_sim(x.to(SIM), src_key_padding_mask=pad.to(SIM))
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
    torch.testing.assert_close(out.cpu()[~pad], ref[~pad])
