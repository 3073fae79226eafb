"""cuDNN's RNN path on ``sim``: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` run as CUDA runs them.

Why: ``aten/src/ATen/native/RNN.cpp`` takes cuDNN (``use_cudnn``: ``cudnn_is_acceptable``,
which requires ``input.is_cuda()``) for every RNN call on CUDA while ``torch.backends.cudnn``
is enabled, the default; for ``PrivateUse1`` it runs the fused cells, about 20 ops per time
step forward and backward. So ``sim`` counted ops and launches CUDA never makes, modelled
them, and paid its per-op fallback for each (an LSTM language model ran 9-13x slower than on
the CPU). Here ``sim`` takes CUDA's branch, op for op as a dispatch mode sees it on CUDA:

- ``nn.RNNBase.flatten_parameters`` (run by ``module.to(device)``) takes its CUDA branch: one
  ``_cudnn_rnn_flatten_weight``, after which the weights are views of one buffer;
- each call is ``cudnn/RNN.cpp`` ``_cudnn_impl``: ``try_get_weight_buf`` (``empty``, ``set_``
  and, where the storage is larger, ``narrow``), ``get_dropout_state`` (with dropout, in
  training, the first time and after a reseed: a seed drawn on the device and read back, a
  sync, then ``_cudnn_init_dropout_state``), then one ``_cudnn_rnn``; its backward is one
  ``_cudnn_rnn_backward``.

The kernels compute on host views with the CPU's own RNN (``torch._VF.lstm`` and friends), so
results equal a CPU run; the backward recomputes the forward under autograd (with the
generator state the forward saw, kept in the reserve buffer). With cuDNN disabled
(``torch.backends.cudnn.flags(enabled=False)``) or a dtype cuDNN does not take, ``sim`` runs
the fused cells, as CUDA does.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch._prims_common import make_contiguous_strides_for

from perf.sim import kernel_syncs
from perf.sim.errors import named_kernel
from perf.sim.memory import cached_cast
from perf.sim.paths import AUTOGRAD_KERNELS, PLAIN_TYPES, eager_plain, run_composite
from perf.sim.tensors import aten, host_of, host_recompute, is_sim, storage_of, wrap

__all__ = [
    "CUDNN_OPS",
    "patch_flatten_parameters",
    "register_rnn",
    "reseeded",
    "reserve_bytes",
]

# cudnnRNNMode_t
_RELU, _TANH, _LSTM, _GRU = 0, 1, 2, 3
#: nn.RNNBase.mode -> cudnnRNNMode_t (torch.backends.cudnn.rnn.get_cudnn_mode, which needs cuDNN)
_MODES = {"RNN_RELU": _RELU, "RNN_TANH": _TANH, "LSTM": _LSTM, "GRU": _GRU}
_HOST_RNN = {_RELU: "rnn_relu", _TANH: "rnn_tanh", _LSTM: "lstm", _GRU: "gru"}

#: the CUDA-only operators this module gives a kernel on ``sim``
CUDNN_OPS = (
    "_cudnn_rnn",
    "_cudnn_rnn_backward",
    "_cudnn_rnn_flatten_weight",
    "_cudnn_init_dropout_state",
)

_DTYPES = frozenset([torch.float64, torch.float32, torch.float16])  # cudnn_is_acceptable's


def _use_cudnn(x: torch.Tensor) -> bool:
    """``RNN.cpp`` ``use_cudnn`` for a CUDA input: cuDNN enabled, a float dtype (bf16 where
    ``supportsBFloat16RNNWithCuDNN``: sm80 and newer, so on ``sim``, which stands for sm90),
    not empty. Not while ``torch.compile`` traces (its fake tensors keep torch's own path)."""
    if not torch._C._get_cudnn_enabled() or not eager_plain(x):
        return False
    if x.dtype not in _DTYPES and not (
        x.dtype == torch.bfloat16 and kernel_syncs.SIM_CAPABILITY >= (8, 0)
    ):
        return False
    return x.numel() > 0


# --------------------------------------------------------------------------------------------
# the composite side: cudnn/RNN.cpp _cudnn_impl, op for op


def _weight_buf(params: list[torch.Tensor]) -> torch.Tensor | None:
    """``try_get_weight_buf``: the weights' storage as one flat tensor where they lie in it
    back to back in cuDNN's order (as ``flatten_parameters`` leaves them), else None."""
    p0 = params[0]
    buf = torch.empty(0, dtype=p0.dtype, device=p0.device).set_(p0.untyped_storage())
    n = sum(p.numel() for p in params)
    if buf.size(0) < n:
        return None
    if buf.size(0) > n:
        buf = buf.narrow(0, 0, n)
    st, offset = storage_of(p0)._cdata, 0
    for p in params:
        if storage_of(p)._cdata != st or p.storage_offset() != offset:
            return None
        offset += p.numel()
    return buf if params[-1].is_contiguous() else None


#: device index -> cuDNN's dropout state there
_DROPOUT: dict[int, torch.Tensor] = {}
#: devices whose generator was reseeded since their state was made (CUDA's
#: ``CUDAGeneratorImpl::reset_rnn_state``, set by ``manual_seed``)
_STALE: set[int] = set()
#: the seed draw's own generator: CUDA draws it from the device's generator, which ``sim``
#: shares with the CPU; a generator of its own keeps a CPU run's random stream unchanged
_SEED_GEN = torch.Generator().manual_seed(0)


def reseeded(index: int | None = None) -> None:
    """A reseed: the next RNN call with dropout on the device makes its state anew. ``index``:
    that device only (``torch.sim.manual_seed`` seeds the current device's generator, as
    ``torch.cuda.manual_seed`` does); ``None``: every device (``manual_seed_all``, which
    ``torch.manual_seed`` calls)."""
    _STALE.update(_DROPOUT if index is None else [i for i in _DROPOUT if i == index])


def _dropout_state(dropout: float, train: bool, like: torch.Tensor) -> torch.Tensor | None:
    """``get_dropout_state``: with dropout in training, a state made once per device (and again
    after a reseed): a seed drawn on the device and read to the host (a sync), then
    ``_cudnn_init_dropout_state``; the cached state otherwise (or none)."""
    index = like.device.index or 0
    if train and dropout > 0 and (index not in _DROPOUT or index in _STALE):
        _STALE.discard(index)
        seed = torch.empty((), dtype=torch.long, device=like.device).random_(generator=_SEED_GEN)
        _DROPOUT[index] = torch._cudnn_init_dropout_state(
            dropout, train, int(seed.item()), dtype=torch.uint8, device=like.device
        )
    return _DROPOUT.get(index)


def _cudnn_impl(
    mode: int,
    input: torch.Tensor,
    batch_sizes: torch.Tensor | None,
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    params: list[torch.Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[torch.Tensor, ...]:
    hidden_size, proj_size = hx.size(2), 0
    if cx is not None and cx.size(2) != hx.size(2):
        hidden_size, proj_size = cx.size(2), hx.size(2)
    weight_buf = _weight_buf(params)
    sizes = batch_sizes.tolist() if batch_sizes is not None else []  # a host tensor: no op
    state = _dropout_state(dropout, train, input)
    num_params = (4 if has_biases else 2) + (1 if proj_size else 0)
    return aten._cudnn_rnn.default(
        input, params, num_params, weight_buf, hx, cx, mode, hidden_size, proj_size,
        num_layers, batch_first and batch_sizes is None, dropout, train, bidirectional, sizes,
        state,
    )  # fmt: skip


def _rnn_kernel(op: Any, mode: int, packed: bool) -> Any:
    """The kernel of ``lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu`` (``.input`` or ``.data``)
    on ``sim``: cuDNN's path where CUDA takes it, torch's composite otherwise."""
    lstm = mode == _LSTM

    def kernel(*args: Any) -> Any:
        if not _use_cudnn(args[0]):
            return run_composite(op, *args)  # RNN.cpp's own composite
        if packed:
            data, batch_sizes, hidden, params, has_biases, layers, p, train, bidir = args
            first = False
        else:
            data, hidden, params, has_biases, layers, p, train, bidir, first = args
            batch_sizes = None
        hx, cx = (hidden[0], hidden[1]) if lstm else (hidden, None)
        out = _cudnn_impl(
            mode, data, batch_sizes, hx, cx, list(params), has_biases, layers, p, train, bidir,
            first,
        )  # fmt: skip
        return (out[0], out[1], out[2]) if lstm else (out[0], out[1])

    kernel.__name__ = f"sim_cudnn_{op.__name__}"
    return kernel


# --------------------------------------------------------------------------------------------
# the kernels: the CPU's RNN on host views


def reserve_bytes(
    mode: int, seq: int, batch: int, hidden: int, layers: int, directions: int, itemsize: int
) -> int:
    """The training reserve ``sim`` allocates for ``_cudnn_rnn``: cuDNN's size
    (``cudnnGetRNNTrainingReserveSize``) is not published, so ``sim`` takes what CUDA's own
    non-cuDNN kernels keep for the backward of the same call: per layer, direction and time
    step the gate activations and the cell's outputs (LSTM 4 gates + c + h, GRU 5 + h as
    ``_thnn_fused_gru_cell``'s workspace, a plain RNN its pre-activation + h)."""
    per_step = {_LSTM: 6, _GRU: 6, _TANH: 2, _RELU: 2}[mode]
    return layers * directions * seq * batch * hidden * per_step * itemsize


def _host_rnn(
    mode: int,
    x: torch.Tensor,
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    weights: list[torch.Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
    batch_sizes: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    fn = getattr(torch._VF, _HOST_RNN[mode])
    hidden: Any = [hx, cx] if mode == _LSTM else hx
    if batch_sizes:
        bs = torch.tensor(batch_sizes, dtype=torch.int64)
        out = fn(x, bs, hidden, weights, has_biases, num_layers, dropout, train, bidirectional)
    else:
        out = fn(x, hidden, weights, has_biases, num_layers, dropout, train, bidirectional,
                 batch_first)  # fmt: skip
    return (out[0], out[1], out[2]) if mode == _LSTM else (out[0], out[1], None)


def _check_contiguous(hx: torch.Tensor, cx: torch.Tensor | None) -> None:
    if not hx.is_contiguous():
        raise RuntimeError("rnn: hx is not contiguous")
    if cx is not None and not cx.is_contiguous():
        raise RuntimeError("rnn: cx is not contiguous")


def _flat_host(weights: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([host_of(w).reshape(-1) for w in weights])


#: cudnn/RNN.cpp's TORCH_WARN when the weights are not one buffer (every such call)
_WEIGHT_FORMAT_WARN = (
    "RNN module weights are not part of single contiguous chunk of memory. This means they "
    "need to be compacted at every call, possibly greatly increasing memory usage. To compact "
    "weights again call flatten_parameters()."
)


def _cudnn_rnn(
    input: torch.Tensor,
    weight: list[torch.Tensor],
    weight_stride0: int,
    weight_buf: torch.Tensor | None,
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    mode: int,
    hidden_size: int,
    proj_size: int,
    num_layers: int,
    batch_first: bool,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_sizes: list[int],
    dropout_state: torch.Tensor | None,
) -> tuple[torch.Tensor, ...]:
    """``_cudnn_rnn``: (output, hy, cy, reserve, weight_buf). Without ``weight_buf`` cuDNN
    copies the weights into a buffer of its own (a new allocation), as here."""
    _check_contiguous(hx, cx)
    if weight_buf is None:
        warnings.warn(_WEIGHT_FORMAT_WARN, UserWarning, stacklevel=2)
    index = input.device.index or 0
    has_biases = weight_stride0 in (4, 5)
    rng = torch.get_rng_state() if train and dropout > 0 else None
    # in the caller's grad mode, not no_grad: the CPU's oneDNN LSTM computes otherwise
    # without it (4e-8 apart), and a CPU run of the same module is the reference; the host
    # views require no grad, so nothing is recorded
    out, hy, cy = _host_rnn(
        mode, host_of(input), host_of(hx), host_of(cx) if cx is not None else None,
        [host_of(w) for w in weight], has_biases, num_layers, dropout, train, bidirectional,
        batch_first, list(batch_sizes),
    )  # fmt: skip
    reserve = torch.empty(0, dtype=torch.uint8)
    if train:
        packed = bool(batch_sizes)
        seq = len(batch_sizes) if packed else input.size(1 if batch_first else 0)
        batch = batch_sizes[0] if packed else input.size(0 if batch_first else 1)
        size = reserve_bytes(
            mode, seq, batch, hidden_size, num_layers, 2 if bidirectional else 1,
            input.element_size(),
        )  # fmt: skip
        if rng is not None:
            size = max(size, rng.numel())
        reserve = torch.zeros(size, dtype=torch.uint8)
        if rng is not None:
            reserve[: rng.numel()] = rng  # the backward's recompute draws the same masks
    if cy is None:
        cy = torch.empty(0, dtype=hy.dtype)  # "Not allowed to return undefined tensors"
    buf = weight_buf if weight_buf is not None else wrap(_flat_host(weight), index)
    return wrap(out, index), wrap(hy, index), wrap(cy, index), wrap(reserve, index), buf


def _cudnn_rnn_backward(
    input: torch.Tensor,
    weight: list[torch.Tensor],
    weight_stride0: int,
    weight_buf: torch.Tensor,
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    output: torch.Tensor,
    grad_output: torch.Tensor | None,
    grad_hy: torch.Tensor | None,
    grad_cy: torch.Tensor | None,
    mode: int,
    hidden_size: int,
    proj_size: int,
    num_layers: int,
    batch_first: bool,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_sizes: list[int],
    dropout_state: torch.Tensor | None,
    reserve: torch.Tensor,
    output_mask: list[bool],
) -> tuple[Any, ...]:
    """``_cudnn_rnn_backward``: (grad input, grad hx, grad cx, grad weights). cuDNN writes the
    weights' gradients into one zeroed buffer of ``weight_buf``'s size; they are views of it."""
    if not train:
        raise RuntimeError("cudnn RNN backward can only be called in training mode")
    _check_contiguous(hx, cx)
    index = input.device.index or 0
    has_biases = weight_stride0 in (4, 5)
    x = host_of(input).detach().requires_grad_(output_mask[0])
    h0 = host_of(hx).detach().requires_grad_(output_mask[1])
    c0 = host_of(cx).detach().requires_grad_(output_mask[2]) if cx is not None else None
    ws = [host_of(w).detach().requires_grad_(output_mask[3]) for w in weight]
    rng = None
    if dropout > 0:  # the forward kept the generator state in the reserve
        rng = host_of(reserve)[: torch.get_rng_state().numel()].clone()
    with host_recompute(rng):
        out, hy, cy = _host_rnn(
            mode, x, h0, c0, ws, has_biases, num_layers, dropout, train, bidirectional,
            batch_first, list(batch_sizes),
        )  # fmt: skip
        outs = [out, hy] + ([cy] if cy is not None else [])
        grads_in = [grad_output, grad_hy] + ([grad_cy] if cy is not None else [])
        pairs = [
            (o, host_of(g) if g is not None else torch.zeros_like(o))
            for o, g in zip(outs, grads_in, strict=True)
        ]
        wanted = [t for t, m in ((x, output_mask[0]), (h0, output_mask[1])) if m]
        if c0 is not None and output_mask[2]:
            wanted.append(c0)
        if output_mask[3]:
            wanted.extend(ws)
        got = (
            torch.autograd.grad(
                [o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True
            )
            if wanted
            else ()
        )
    it = iter(got)

    def take(t: torch.Tensor | None, want: bool) -> torch.Tensor | None:
        if t is None or not want:
            return None
        g = next(it)
        return wrap(g if g is not None else torch.zeros_like(t), index)

    dx = take(x, output_mask[0])
    dhx = take(h0, output_mask[1])
    dcx = take(c0, output_mask[2])
    dw: list[torch.Tensor] = []
    if output_mask[3]:
        flat = torch.zeros(sum(w.numel() for w in ws), dtype=ws[0].dtype)
        offset = 0
        for w in ws:
            g = next(it)
            if g is not None:
                flat[offset : offset + w.numel()] = g.reshape(-1)
            offset += w.numel()
        flat_sim = wrap(flat, index)
        offset = 0
        for w in ws:
            dw.append(flat_sim.narrow(0, offset, w.numel()).view(w.shape))
            offset += w.numel()
    return dx, dhx, dcx, dw


def _flatten_weight(
    weight_arr: list[torch.Tensor],
    weight_stride0: int,
    input_size: int,
    mode: int,
    hidden_size: int,
    proj_size: int,
    num_layers: int,
    batch_first: bool,
    bidirectional: bool,
) -> torch.Tensor:
    """``_cudnn_rnn_flatten_weight``: one buffer holding every weight, back to back in order,
    and each weight made a view of it (``copy_weights_to_flat_buf_views``)."""
    index = weight_arr[0].device.index or 0
    flat = wrap(_flat_host(weight_arr), index)
    offset = 0
    for w in weight_arr:
        w.set_(flat.untyped_storage(), offset, w.size(), make_contiguous_strides_for(w.shape))
        offset += w.numel()
    return flat


def _init_dropout_state(
    dropout: float,
    train: bool,
    dropout_seed: int,
    *,
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: bool | None = False,
) -> torch.Tensor:
    """``_cudnn_init_dropout_state``: cuDNN's random states for its dropout. Their size
    (``cudnnDropoutGetStatesSize``) is cuDNN's and not modelled: an empty buffer; ``sim``'s
    dropout draws from the CPU's generator, as its other random ops do."""
    index = torch.device(device).index or 0 if device is not None else 0
    return wrap(torch.empty(0, dtype=torch.uint8), index)


# --------------------------------------------------------------------------------------------
# autocast: cudnn/AutocastRNN.cpp _cudnn_rnn_cast_reflatten


_AUTOCAST = torch._C.DispatchKey.AutocastPrivateUse1  # type: ignore[attr-defined]
_AFTER_AUTOCAST = torch._C._dispatch_keyset_full_after(_AUTOCAST)
_NO_AUTOCAST = torch._C.DispatchKeySet(_AUTOCAST)


def _autocast_eligible(x: Any) -> bool:
    return x is not None and is_sim(x) and x.is_floating_point() and x.dtype != torch.float64


def _autocast_cudnn_rnn(keyset: Any, *args: Any) -> Any:
    """``_cudnn_rnn`` under autocast, as CUDA's ``Autocast`` kernel of it: float16 whatever the
    autocast dtype (bf16 too: cuDNN's RNN path hard-codes ``kHalf``); eligible weights are cast
    into a new float16 buffer (``copy_weights_to_flat_buf_views``: ``zeros`` of the weights'
    size, then per weight a view of it and a ``copy_``, autograd-exposed) and the input and
    hidden states cast (``cached_cast``), then ``_cudnn_rnn`` below autocast."""
    input, weight, weight_stride0, weight_buf, hx, cx, *rest = args
    with torch._C._ExcludeDispatchKeyGuard(_NO_AUTOCAST):
        for w in weight:
            if w.dtype != weight[0].dtype:
                raise RuntimeError("Weight scalar types do not match.")
        ref = weight_buf if weight_buf is not None else weight[0]
        if _autocast_eligible(ref) and ref.dtype != torch.float16:
            total = sum(w.numel() for w in weight)
            buf = torch.zeros(total, dtype=torch.float16, device=weight[0].device)
            cast: list[torch.Tensor] = []
            offset = 0
            for w in weight:
                v = torch.empty(0, dtype=torch.float16, device=w.device).set_(
                    buf.untyped_storage(), offset, w.size(), make_contiguous_strides_for(w.shape)
                )
                v.copy_(w.view_as(v))
                cast.append(v)
                offset += w.numel()
            weight, weight_buf = cast, buf
        input, hx = (cached_cast(t, torch.float16) if _autocast_eligible(t) and
                     t.dtype != torch.float16 else t for t in (input, hx))  # fmt: skip
        if _autocast_eligible(cx) and cx.dtype != torch.float16:
            cx = cached_cast(cx, torch.float16)
        return aten._cudnn_rnn.default.redispatch(
            keyset & _AFTER_AUTOCAST, input, weight, weight_stride0, weight_buf, hx, cx, *rest
        )


# --------------------------------------------------------------------------------------------
# nn.RNNBase.flatten_parameters: its CUDA branch


def patch_flatten_parameters() -> None:
    """``flatten_parameters`` takes its CUDA branch for sim weights (``fw.is_cuda`` and
    ``cudnn.is_acceptable`` there; ``torch._use_cudnn_rnn_flatten_weight()``, true on CUDA
    builds), so the weights lie in one buffer as on ``cuda:0``; other tensors keep torch's."""
    original = torch.nn.RNNBase.flatten_parameters
    if getattr(original, "_perf_sim", False):
        return

    @functools.wraps(original)
    def flatten_parameters(self: torch.nn.RNNBase) -> None:
        ws = [w for w in self._flat_weights if isinstance(w, torch.Tensor) and is_sim(w)]
        if not ws or len(ws) != len(self._flat_weights) or len(ws) != len(self._flat_weights_names):
            return original(self)
        dtype = ws[0].dtype
        if not torch._C._get_cudnn_enabled() or any(
            w.dtype != dtype or w.dtype not in _DTYPES or type(w) not in PLAIN_TYPES for w in ws
        ):
            return None
        if len({(storage_of(w).data_ptr(), w.storage_offset()) for w in ws}) != len(ws):
            return None  # aliasing weights: the slower, copying path, as on CUDA
        num_weights = (4 if self.bias else 2) + (1 if self.proj_size > 0 else 0)
        with torch.no_grad():
            torch._cudnn_rnn_flatten_weight(
                ws, num_weights, self.input_size, _MODES[self.mode],
                self.hidden_size, self.proj_size, self.num_layers, self.batch_first,
                bool(self.bidirectional),
            )  # fmt: skip
        return None

    flatten_parameters._perf_sim = True  # type: ignore[attr-defined]
    torch.nn.RNNBase.flatten_parameters = flatten_parameters  # type: ignore[method-assign]


def register_rnn(lib: Any) -> None:
    """The RNN ops' CUDA branch (autograd and backend keys: ``inference_mode`` skips the
    first) and the cuDNN kernels."""
    for packet, mode in (("lstm", _LSTM), ("gru", _GRU), ("rnn_tanh", _TANH), ("rnn_relu", _RELU)):
        for overload in ("input", "data"):
            op = getattr(getattr(aten, packet), overload)
            k = _rnn_kernel(op, mode, overload == "data")
            lib.impl(f"{packet}.{overload}", k, "AutogradPrivateUse1")
            lib.impl(f"{packet}.{overload}", k, "PrivateUse1")
            AUTOGRAD_KERNELS[op] = k
    for name, fn in (
        ("_cudnn_rnn", _cudnn_rnn),
        ("_cudnn_rnn_backward", _cudnn_rnn_backward),
        ("_cudnn_rnn_flatten_weight", _flatten_weight),
        ("_cudnn_init_dropout_state", _init_dropout_state),
    ):
        lib.impl(name, named_kernel(getattr(aten, name).default, fn), "PrivateUse1")
    lib.impl("_cudnn_rnn", _autocast_cudnn_rnn, "AutocastPrivateUse1", with_keyset=True)
