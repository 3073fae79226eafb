"""Activation bytes: exact on hand-checked graphs; parameters excluded by storage."""

from __future__ import annotations

import pytest
import torch

import perf


def test_linear_relu_saves_input_and_output_once():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 16)
    x = torch.randn(4, 8, requires_grad=True)  # an input, not a parameter: params= says so
    with perf.saved_activations(lin) as a:
        torch.relu(lin(x)).sum()
    r = a.result()
    # addmm saves x (for the weight's grad) and weight.t() (for x's grad: a view of the
    # parameter, excluded by storage); relu saves its output.
    assert r.bytes == 4 * 8 * 4 + 4 * 16 * 4
    assert r.count == 2
    assert r.parameter_refs >= 1


def test_parameter_views_are_excluded_by_storage_even_without_params_argument():
    w = torch.nn.Parameter(torch.randn(16, 8))
    x = torch.randn(4, 8)
    with perf.saved_activations() as a:
        (x @ w.t()).sum()
    assert a.bytes == 4 * 8 * 4  # x only; w.t() is the parameter's storage


def test_shared_storage_counts_once():
    x = torch.randn(64, requires_grad=True)
    y = x * 2
    with perf.saved_activations([x]) as a:
        (y * y).sum()  # y saved twice (both operands)
        (y.sin()).sum()  # and again
    assert a.bytes == 64 * 4
    assert a.result().saved_refs == 3


def test_autocast_weight_copies_are_reported_apart():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(16, 32)
    with perf.saved_activations(model) as fp32:
        model(x).sum()
    with perf.saved_activations(model) as bf16, torch.autocast("cpu", dtype=torch.bfloat16):
        model(x).sum()
    assert fp32.param_copy_bytes == 0
    assert bf16.bytes * 2 == fp32.bytes  # every activation halves
    assert bf16.param_copy_bytes == 64 * 8 * 2  # the second layer's bf16 weight, saved
    assert bf16.by_dtype == {"bfloat16": bf16.bytes}


def test_no_grad_saves_nothing():
    model = torch.nn.Linear(8, 8)
    with perf.saved_activations(model) as a, torch.no_grad():
        model(torch.randn(2, 8)).relu()
    assert (a.bytes, a.count, a.result().saved_refs) == (0, 0, 0)


def test_peak_memory_on_cpu_is_none_not_an_error():
    with perf.peak_memory("cpu") as m:
        torch.randn(1000)
    r = m.result()
    assert r.peak_bytes is None and r.peak_delta_bytes is None and r.device == "cpu"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, None),
        ({"PYTORCH_CUDA_ALLOC_CONF": ""}, None),  # set but empty: the defaults
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "PYTORCH_CUDA_ALLOC_CONF"),
        ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}, "PYTORCH_ALLOC_CONF"),
        ({"PYTORCH_HIP_ALLOC_CONF": "roundup_power2_divisions:4"}, "PYTORCH_HIP_ALLOC_CONF"),
    ],
)
def test_alloc_conf_override_names_the_variable(env, named) -> None:
    """P14's exact CUDA byte checks skip, naming the setting, when the allocator is configured."""
    from perf.instruments.memory import alloc_conf_override

    why = alloc_conf_override(env)
    if named is None:
        assert why is None
    else:
        assert why is not None and f"{named}=" in why and "unset it" in why
