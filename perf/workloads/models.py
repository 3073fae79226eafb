"""Reference models: MLPs of configurable width and depth, and a small CNN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def mlp(
    in_features: int = 4,
    hidden: int = 16,
    depth: int = 2,
    out_features: int = 3,
    *,
    activation: type[nn.Module] = nn.ReLU,
    seed: int | None = 0,
) -> nn.Sequential:
    """``depth`` hidden Linear+activation blocks of width ``hidden``, then a Linear head.

    Defaults give the seeds' Iris classifier (4 -> 16 -> 16 -> 3). ``seed`` makes the initial
    weights reproducible, so two models built alike compare gradient-for-gradient (P10, P12).
    """
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    if seed is not None:
        torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), activation()]
        width = hidden
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)


class SmallCNN(nn.Module):
    """Two conv blocks and a linear head: a conv workload with real activations to save."""

    def __init__(
        self, in_channels: int = 3, classes: int = 10, width: int = 16, image_size: int = 32
    ) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(2 * width * (image_size // 4) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def small_cnn(
    in_channels: int = 3, classes: int = 10, width: int = 16, image_size: int = 32, *, seed: int = 0
) -> SmallCNN:
    torch.manual_seed(seed)
    return SmallCNN(in_channels, classes, width, image_size)


def param_bytes(model: nn.Module) -> int:
    """Bytes of all parameters: what one DDP all-reduce round moves per step (P12)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


class FeedForward(nn.Module):
    """Residual transformer-style block: ``x + W2 GELU(W1 x)`` with an ``expansion``-wide middle.

    Autograd saves three tensors here (the input, the wide pre-activation, the wide activation);
    a checkpoint keeps only the input, which is where checkpointing pays (P9).
    """

    def __init__(self, width: int, expansion: int = 4) -> None:
        super().__init__()
        self.up = nn.Linear(width, expansion * width)
        self.act = nn.GELU()
        self.down = nn.Linear(expansion * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(x)))


class BlockMLP(nn.Module):
    """Stem, ``depth`` residual feed-forward blocks, head; blocks optionally checkpointed.

    Checkpointing (P9) keeps only each block's input and recomputes the block in backward.
    The stem stays outside the checkpoints, so every checkpointed block sees an input that
    requires grad: with ``use_reentrant=True`` an input without grad would silently leave the
    block's parameters without gradients.
    """

    def __init__(
        self,
        in_features: int = 64,
        hidden: int = 128,
        depth: int = 4,
        out_features: int = 10,
        *,
        expansion: int = 4,
        checkpoint: bool = False,
        use_reentrant: bool = True,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        if seed is not None:
            torch.manual_seed(seed)
        self.stem = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU())
        self.blocks = nn.ModuleList(FeedForward(hidden, expansion) for _ in range(depth))
        self.head = nn.Linear(hidden, out_features)
        self.checkpoint = checkpoint
        self.use_reentrant = use_reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = self.stem(x)
        for block in self.blocks:
            if self.checkpoint and torch.is_grad_enabled():
                h = checkpoint(block, h, use_reentrant=self.use_reentrant)
            else:
                h = block(h)
        return self.head(h)


class TransformerBlock(nn.Module):
    """A pre-norm transformer block (causal self-attention, GELU MLP), nanoGPT-shaped: the
    compiled-code tests and the sim compile overhead script measure the same block.

    ``qkv_bias=False`` for exact comparisons of training runs: the key bias's gradient is zero
    in exact arithmetic, so its float gradient is rounding noise that AdamW turns into lr-sized
    steps of either sign."""

    def __init__(self, d: int = 16, heads: int = 2, *, qkv_bias: bool = True) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=qkv_bias)
        self.proj = nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))
