"""Every operator of CUDA's autocast lists runs on ``sim`` under fp16 and bf16 autocast,
forward and backward, and comes out in the dtype CUDA's autocast gives it.

The CUDA truth needs no GPU: a CPU-only torch build still registers the ``AutocastCUDA``
kernels (the dispatcher lists them), and fake tensors that claim device ``cuda:0`` run them
(shapes and dtypes only). So each operator is called twice under autocast: on fake CUDA
tensors (CUDA's cast policy, the real kernels of ``autocast_mode.cpp``) and on ``sim`` (the
policy perf registers); the output dtypes must agree, and the ``sim`` call must also run
backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import perf
from perf.sim import autocast as sim_autocast
from perf.sim.device import unavailable_reason

aten = torch.ops.aten

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None,
    reason=f"simulated device unavailable: {unavailable_reason()}",
)

DTYPES = [torch.float16, torch.bfloat16]


def _cuda_autocast_ops() -> list[str]:
    return sorted(
        n[len("aten::") :]
        for n in torch._C._dispatch_get_all_op_names()
        if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCUDA")
    )


class Make:
    """Builds the arguments of one call, on ``sim`` (real data) or on fake CUDA tensors."""

    def __init__(self, device: str, low: torch.dtype) -> None:
        self.device, self.low = device, low
        self.leaves: list[torch.Tensor] = []
        if device == "fake":
            from torch._subclasses.fake_tensor import FakeTensorMode

            self.mode: Any = FakeTensorMode()

    def _new(self, data: torch.Tensor) -> torch.Tensor:
        if self.device == "fake":
            from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

            with unset_fake_temporarily():
                meta = torch.empty(data.shape, dtype=data.dtype, device="meta")
            return FakeTensor(self.mode, meta, torch.device("cuda", 0))
        return data.to(perf.simulated_device())

    def t(self, *shape: int) -> torch.Tensor:
        """A float32 leaf that requires grad (deterministic values in (0.1, 0.9))."""
        n = 1
        for s in shape:
            n *= s
        if self.device == "fake":
            data = torch.empty(shape, device="meta")
        else:
            data = (torch.arange(n, dtype=torch.float32).reshape(shape) * 0.37 % 0.8) + 0.1
        x = self._new(data)
        if self.device != "fake":  # autograd on fake CUDA tensors asks for a CUDA device guard
            x.requires_grad_()
        self.leaves.append(x)
        return x

    def lo(self, *shape: int) -> torch.Tensor:
        """A leaf in the autocast dtype (what a previous lower-precision op hands on)."""
        return self.t(*shape).to(self.low)

    def long(self, values: Any) -> torch.Tensor:
        return self._new(self._data(values, torch.long))

    def const(self, values: Any) -> torch.Tensor:
        return self._new(self._data(values, torch.float32))

    def _data(self, values: Any, dtype: torch.dtype) -> torch.Tensor:
        if self.device == "fake":
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():
                return torch.tensor(values, dtype=dtype, device="meta")
        return torch.tensor(values, dtype=dtype)


Sample = Callable[[Make], Any]
_UNARY_FP32 = [
    *("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p"),
    *("reciprocal", "rsqrt", "sinh", "tan"),
]

#: one call per operator of CUDA's autocast lists (fp32-policy ops get low-precision inputs so
#: the upcast shows; lower-policy ops get float32 inputs so the downcast shows)
SAMPLES: dict[str, Sample] = {
    "_convolution": lambda m: aten._convolution(
        m.t(1, 3, 5, 5),
        m.t(4, 3, 3, 3),
        m.t(4),
        [1, 1],
        [0, 0],
        [1, 1],
        False,
        [0, 0],
        1,
        False,
        False,
        True,
        True,
    ),
    "_convolution.deprecated": lambda m: aten._convolution.deprecated(
        m.t(1, 3, 5, 5),
        m.t(4, 3, 3, 3),
        m.t(4),
        [1, 1],
        [0, 0],
        [1, 1],
        False,
        [0, 0],
        1,
        False,
        False,
        True,
    ),
    "conv1d": lambda m: F.conv1d(m.t(1, 3, 8), m.t(4, 3, 3), m.t(4)),
    "conv2d": lambda m: F.conv2d(m.t(1, 3, 5, 5), m.t(4, 3, 3, 3), m.t(4)),
    "conv3d": lambda m: F.conv3d(m.t(1, 2, 4, 4, 4), m.t(3, 2, 2, 2, 2)),
    "conv_tbc": lambda m: torch.conv_tbc(m.t(8, 1, 3), m.t(3, 3, 4), m.t(4)),
    "conv_transpose1d": lambda m: F.conv_transpose1d(m.t(1, 3, 8), m.t(3, 4, 3)),
    "conv_transpose2d.input": lambda m: F.conv_transpose2d(m.t(1, 3, 5, 5), m.t(3, 4, 3, 3)),
    "conv_transpose3d.input": lambda m: F.conv_transpose3d(m.t(1, 2, 3, 3, 3), m.t(2, 3, 2, 2, 2)),
    "convolution": lambda m: aten.convolution(
        m.t(1, 3, 5, 5), m.t(4, 3, 3, 3), m.t(4), [1, 1], [0, 0], [1, 1], False, [0, 0], 1
    ),
    "prelu": lambda m: F.prelu(m.t(2, 3), m.t(1)),
    "addmm": lambda m: torch.addmm(m.t(2, 3), m.t(2, 4), m.t(4, 3)),
    "addmv": lambda m: torch.addmv(m.t(2), m.t(2, 3), m.t(3)),
    "addr": lambda m: torch.addr(m.t(2, 3), m.t(2), m.t(3)),
    "matmul": lambda m: torch.matmul(m.t(2, 4), m.t(4, 3)),
    "einsum": lambda m: torch.einsum("ij,jk->ik", m.t(2, 4), m.t(4, 3)),
    "mm": lambda m: torch.mm(m.t(2, 4), m.t(4, 3)),
    "mv": lambda m: torch.mv(m.t(2, 4), m.t(4)),
    "linalg_vecdot": lambda m: torch.linalg.vecdot(m.t(3, 4), m.t(3, 4)),
    "linear": lambda m: F.linear(m.t(2, 4), m.t(3, 4), m.t(3)),
    "addbmm": lambda m: torch.addbmm(m.t(2, 3), m.t(5, 2, 4), m.t(5, 4, 3)),
    "baddbmm": lambda m: torch.baddbmm(m.t(5, 2, 3), m.t(5, 2, 4), m.t(5, 4, 3)),
    "bmm": lambda m: torch.bmm(m.t(5, 2, 4), m.t(5, 4, 3)),
    "chain_matmul": lambda m: torch.chain_matmul(m.t(2, 3), m.t(3, 4), m.t(4, 2)),
    "linalg_multi_dot": lambda m: torch.linalg.multi_dot([m.t(2, 3), m.t(3, 4), m.t(4, 2)]),
    "_thnn_fused_lstm_cell": lambda m: aten._thnn_fused_lstm_cell(
        m.t(2, 16), m.t(2, 16), m.t(2, 4), m.t(16), m.t(16)
    )[:2],
    "_thnn_fused_gru_cell": lambda m: aten._thnn_fused_gru_cell(
        m.t(2, 12), m.t(2, 12), m.t(2, 4), m.t(12), m.t(12)
    )[0],
    "lstm_cell": lambda m: aten.lstm_cell(
        m.t(2, 3), [m.t(2, 4), m.t(2, 4)], m.t(16, 3), m.t(16, 4), m.t(16), m.t(16)
    ),
    "gru_cell": lambda m: aten.gru_cell(
        m.t(2, 3), m.t(2, 4), m.t(12, 3), m.t(12, 4), m.t(12), m.t(12)
    ),
    "rnn_tanh_cell": lambda m: aten.rnn_tanh_cell(
        m.t(2, 3), m.t(2, 4), m.t(4, 3), m.t(4, 4), m.t(4), m.t(4)
    ),
    "rnn_relu_cell": lambda m: aten.rnn_relu_cell(
        m.t(2, 3), m.t(2, 4), m.t(4, 3), m.t(4, 4), m.t(4), m.t(4)
    ),
    "_scaled_dot_product_flash_attention": lambda m: aten._scaled_dot_product_flash_attention(
        m.t(1, 2, 4, 8), m.t(1, 2, 4, 8), m.t(1, 2, 4, 8)
    )[0],
    "scaled_dot_product_attention": lambda m: F.scaled_dot_product_attention(
        m.t(1, 2, 4, 8), m.t(1, 2, 4, 8), m.t(1, 2, 4, 8), is_causal=True
    ),
    **{name: (lambda fn: lambda m: fn(m.lo(4)))(getattr(torch, name)) for name in _UNARY_FP32},
    "pow.Tensor_Scalar": lambda m: torch.pow(m.lo(4), 2),
    "pow.Tensor_Tensor": lambda m: torch.pow(m.lo(4), m.lo(4)),
    "pow.Scalar": lambda m: torch.pow(2, m.lo(4)),
    "softplus": lambda m: F.softplus(m.lo(4)),
    "layer_norm": lambda m: F.layer_norm(m.lo(2, 4), [4], m.lo(4), m.lo(4)),
    "native_layer_norm": lambda m: aten.native_layer_norm(m.lo(2, 4), [4], m.lo(4), m.lo(4), 1e-5)[
        0
    ],
    "group_norm": lambda m: F.group_norm(m.lo(2, 4, 3), 2, m.lo(4), m.lo(4)),
    "rms_norm": lambda m: F.rms_norm(m.lo(2, 4), [4], m.lo(4)),
    "frobenius_norm.dim": lambda m: aten.frobenius_norm.dim(m.lo(3, 4), [1]),
    "nuclear_norm": lambda m: aten.nuclear_norm(m.lo(3, 4)),
    "nuclear_norm.dim": lambda m: aten.nuclear_norm.dim(m.lo(3, 4), [0, 1]),
    "cosine_similarity": lambda m: F.cosine_similarity(m.lo(3, 4), m.lo(3, 4)),
    "poisson_nll_loss": lambda m: F.poisson_nll_loss(m.lo(3), m.const([1.0, 0.0, 2.0])),
    "cosine_embedding_loss": lambda m: F.cosine_embedding_loss(
        m.lo(3, 4), m.lo(3, 4), m.const([1.0, -1.0, 1.0])
    ),
    "nll_loss": lambda m: F.nll_loss(m.lo(3, 5), m.long([0, 4, 2])),
    "nll_loss2d": lambda m: F.nll_loss(m.lo(2, 5, 2, 2), m.long([[[0, 1], [2, 3]]] * 2)),
    "hinge_embedding_loss": lambda m: F.hinge_embedding_loss(m.lo(3), m.const([1.0, -1.0, 1.0])),
    "kl_div": lambda m: F.kl_div(m.lo(3), m.lo(3), reduction="batchmean"),
    "l1_loss": lambda m: F.l1_loss(m.lo(3), m.lo(3)),
    "smooth_l1_loss": lambda m: F.smooth_l1_loss(m.lo(3), m.lo(3)),
    "huber_loss": lambda m: F.huber_loss(m.lo(3), m.lo(3)),
    "mse_loss": lambda m: F.mse_loss(m.lo(3), m.lo(3)),
    "margin_ranking_loss": lambda m: F.margin_ranking_loss(
        m.lo(3), m.lo(3), m.const([1.0, -1.0, 1.0])
    ),
    "multilabel_margin_loss": lambda m: F.multilabel_margin_loss(
        m.lo(2, 4), m.long([[0, 1, -1, 0], [2, -1, 0, 0]])
    ),
    "soft_margin_loss": lambda m: F.soft_margin_loss(m.lo(3), m.const([1.0, -1.0, 1.0])),
    "triplet_margin_loss": lambda m: F.triplet_margin_loss(m.lo(3, 4), m.lo(3, 4), m.lo(3, 4)),
    "multi_margin_loss": lambda m: F.multi_margin_loss(m.lo(3, 5), m.long([0, 4, 2])),
    "binary_cross_entropy_with_logits": lambda m: F.binary_cross_entropy_with_logits(
        m.lo(3), m.const([1.0, 0.0, 1.0])
    ),
    "dist": lambda m: torch.dist(m.lo(3), m.lo(3)),
    "pdist": lambda m: F.pdist(m.lo(4, 3)),
    "cdist": lambda m: torch.cdist(m.lo(2, 3), m.lo(4, 3)),
    "renorm": lambda m: torch.renorm(m.lo(3, 4), 2, 0, 1.0),
    "logsumexp": lambda m: torch.logsumexp(m.lo(3, 4), 1),
    "upsample_nearest1d": lambda m: aten.upsample_nearest1d(m.lo(1, 2, 4), [8]),
    "_upsample_nearest_exact1d": lambda m: aten._upsample_nearest_exact1d(m.lo(1, 2, 4), [8]),
    "upsample_nearest2d": lambda m: aten.upsample_nearest2d(m.lo(1, 2, 4, 4), [8, 8]),
    "_upsample_nearest_exact2d": lambda m: aten._upsample_nearest_exact2d(m.lo(1, 2, 4, 4), [8, 8]),
    "upsample_nearest3d": lambda m: aten.upsample_nearest3d(m.lo(1, 2, 2, 2, 2), [4, 4, 4]),
    "_upsample_nearest_exact3d": lambda m: aten._upsample_nearest_exact3d(
        m.lo(1, 2, 2, 2, 2), [4, 4, 4]
    ),
    "upsample_linear1d": lambda m: aten.upsample_linear1d(m.lo(1, 2, 4), [8], False),
    "upsample_bilinear2d": lambda m: aten.upsample_bilinear2d(m.lo(1, 2, 4, 4), [8, 8], False),
    "_upsample_bilinear2d_aa": lambda m: aten._upsample_bilinear2d_aa(
        m.lo(1, 2, 4, 4), [8, 8], False
    ),
    "upsample_trilinear3d": lambda m: aten.upsample_trilinear3d(
        m.lo(1, 2, 2, 2, 2), [4, 4, 4], False
    ),
    "upsample_bicubic2d": lambda m: aten.upsample_bicubic2d(m.lo(1, 2, 4, 4), [8, 8], False),
    "_upsample_bicubic2d_aa": lambda m: aten._upsample_bicubic2d_aa(
        m.lo(1, 2, 4, 4), [8, 8], False
    ),
    "norm.Scalar": lambda m: aten.norm.Scalar(m.lo(3), 2),
    "norm.ScalarOpt_dim": lambda m: aten.norm.ScalarOpt_dim(m.lo(3, 4), 2, [1]),
    "prod": lambda m: torch.prod(m.lo(3)),
    "prod.dim_int": lambda m: torch.prod(m.lo(3, 4), 1),
    "softmax.int": lambda m: torch.softmax(m.lo(3, 4), 1),
    "log_softmax.int": lambda m: torch.log_softmax(m.lo(3, 4), 1),
    "cumprod": lambda m: torch.cumprod(m.lo(4), 0),
    "cumsum": lambda m: torch.cumsum(m.lo(4), 0),
    "linalg_vector_norm": lambda m: torch.linalg.vector_norm(m.lo(4)),
    # linalg.matrix_norm refuses low-precision inputs on every device
    "linalg_matrix_norm": lambda m: aten.linalg_matrix_norm(m.t(3, 4), 2),
    "linalg_matrix_norm.str_ord": lambda m: aten.linalg_matrix_norm.str_ord(m.t(3, 4)),
    "sum": lambda m: torch.sum(m.lo(4)),
    "sum.dim_IntList": lambda m: torch.sum(m.lo(3, 4), 1),
    "addcdiv": lambda m: torch.addcdiv(m.t(3), m.lo(3), m.lo(3)),
    "addcmul": lambda m: torch.addcmul(m.t(3), m.lo(3), m.lo(3)),
    "atan2": lambda m: torch.atan2(m.t(3), m.lo(3)),
    "bilinear": lambda m: F.bilinear(m.lo(2, 3), m.t(2, 4), m.lo(5, 3, 4), m.lo(5)),
    "cross": lambda m: torch.cross(m.t(2, 3), m.lo(2, 3), dim=1),
    "dot": lambda m: torch.dot(m.t(3), m.lo(3)),
    "vdot": lambda m: torch.vdot(m.t(3), m.lo(3)),
    "grid_sampler": lambda m: aten.grid_sampler(m.t(1, 2, 4, 4), m.lo(1, 3, 3, 2), 0, 0, False),
    "index_put": lambda m: aten.index_put(m.t(4), [m.long([0, 2])], m.lo(2)),
    "tensordot": lambda m: torch.tensordot(m.t(3, 4), m.lo(4, 5), dims=1),
    "scatter_add": lambda m: torch.scatter_add(
        m.t(3, 4), 1, m.long([[0, 1, 2, 3]] * 3), m.lo(3, 4)
    ),
    "binary_cross_entropy": lambda m: F.binary_cross_entropy(
        m.lo(3).sigmoid(), m.const([1.0, 0.0, 1.0])
    ),
}

#: ops whose fake-CUDA call needs the CUDA runtime (no meta kernel): their expected dtypes
#: follow from the policy in autocast_mode.cpp instead (gru_cell: lower; grid_sampler:
#: promote, with a float32 input; _thnn_fused_gru_cell: lower)
NO_FAKE_CUDA: dict[str, Callable[[torch.dtype], list[torch.dtype]]] = {
    "gru_cell": lambda low: [low],
    "_thnn_fused_gru_cell": lambda low: [low],
    "grid_sampler": lambda low: [torch.float32],
}

#: autocast operators sim has no kernel for (see perf.sim.cuda_only.NOT_ON_SIM)
NO_KERNEL_ON_SIM = {"cudnn_convolution", "cudnn_convolution_transpose"}


def _outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _outputs(o)]
    return []


@contextlib.contextmanager
def _fake_cuda_autocast(dtype: torch.dtype) -> Iterator[None]:
    was, was_dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", was)
        torch.set_autocast_dtype("cuda", was_dtype)
        torch.clear_autocast_cache()


def _cuda_dtypes(name: str, dtype: torch.dtype) -> list[torch.dtype] | None:
    """Output dtypes of the call on fake CUDA tensors under CUDA's autocast (None: raised)."""
    if name in NO_FAKE_CUDA:
        return NO_FAKE_CUDA[name](dtype)
    m = Make("fake", dtype)
    with _fake_cuda_autocast(dtype), m.mode:
        try:
            out = SAMPLES[name](m)
        except RuntimeError as e:
            if "unsafe to autocast" in str(e):
                return None
            raise
        return [t.dtype for t in _outputs(out)]


def test_the_sweep_covers_every_cuda_autocast_op() -> None:
    """Fails when a torch release adds an op to CUDA's autocast lists: give it a sample and
    (in perf/sim/autocast.py) a policy."""
    ops = set(_cuda_autocast_ops())
    assert ops, "the dispatcher lists no AutocastCUDA kernels: cannot check the lists"
    assert ops - set(SAMPLES) == NO_KERNEL_ON_SIM
    policy = set(
        sim_autocast._LOWER
        + sim_autocast._FP32
        + sim_autocast._FP32_SET_OPT_DTYPE
        + sim_autocast._PROMOTE
        + sim_autocast._BANNED
    )
    assert policy == ops, (sorted(ops - policy), sorted(policy - ops))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_autocast_op_forward_backward_on_sim_matches_cuda(name: str, dtype: torch.dtype) -> None:
    expected = _cuda_dtypes(name, dtype)
    dev = perf.simulated_device()
    m = Make("sim", dtype)
    if expected is None:  # CUDA's autocast refuses the op: so must sim
        with (
            pytest.raises(RuntimeError, match="unsafe to autocast"),
            torch.autocast(dev.type, dtype=dtype),
        ):
            SAMPLES[name](m)
        return
    with torch.autocast(dev.type, dtype=dtype):
        out = SAMPLES[name](m)
    outs = _outputs(out)
    assert [t.dtype for t in outs] == expected
    assert all(t.device == dev for t in outs)
    floats = [t for t in outs if t.is_floating_point() and t.requires_grad]
    assert floats, f"{name}: no differentiable output"
    sum(t.float().sum() for t in floats).backward()  # type: ignore[union-attr]
    grads = [leaf.grad for leaf in m.leaves if leaf.is_leaf]
    assert any(g is not None for g in grads), f"{name}: backward reached no input"
    for leaf in m.leaves:
        if leaf.grad is not None:
            assert leaf.grad.dtype == leaf.dtype and leaf.grad.device == dev
