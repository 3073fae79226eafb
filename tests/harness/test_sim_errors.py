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
