"""Phase 7's demo models: siblings, layers that read one input and so can merge into one wider layer (horizontal
fusion). Re-exported by ``fusion.models``, where the lessons find them (``models.QKVAttention``).

* :class:`QKVAttention` — attention whose q, k, v Linears read one x (``attention_inputs``).
* :class:`InceptionBlock` — four branches on one input: three 1x1 convs merge, the 3x3 cannot (``inception_inputs``).
* :class:`InPlaceBetweenSiblings` — one node, two values: an in-place op between two readers of x.
* :class:`PointwiseSiblings` — two elementwise consumers of one value.
* :class:`QKVProjections` — just q, k, v: Phase 4's horizontal-fusion workload (``qkv_inputs``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusion.demo_models.seeding import SEED, private_rng, randn, seeded

# ----------------------------------------------------------------------------------------------------------------------
# Siblings that read one input


class QKVAttention(nn.Module):
    """Multi-head self-attention with separate Q, K, V projections: three sibling Linears that all read ``x``.

    ``v`` has no bias (as in some LLMs), so merging the three must handle a missing bias. ``out`` reads the
    attention result, not ``x``: it is no sibling of the three.
    """

    @private_rng
    def __init__(self, d_model: int = 32, n_head: int = 4, seed: int = SEED):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        self.n_head = n_head
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model, bias=False)
        self.out = nn.Linear(d_model, d_model)
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        q, k, v = self.q(x), self.k(x), self.v(x)  # 3 x (B, T, C): three GEMMs that read x three times
        q, k, v = (t.unflatten(-1, (self.n_head, -1)).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        h = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.out(h.transpose(1, 2).flatten(-2))  # (B, T, C)


def attention_inputs(batch: int = 2, seq: int = 8, d_model: int = 32, seed: int = 1) -> tuple[torch.Tensor]:
    return (randn(batch, seq, d_model, seed=seed),)


class InceptionBlock(nn.Module):
    """GoogLeNet-style Inception block: four branches concatenated on the channel dim.

    ``b1``, ``b2_reduce`` and ``b3_reduce`` are 1x1 convs that read ``x``: siblings with equal hyper-parameters.
    ``b5`` is a 3x3 conv that reads ``x`` too but has another kernel size, so it cannot join them. ``pool_proj``
    reads the max-pooled ``x``: a different value, no sibling of the others.
    """

    @private_rng
    def __init__(self, in_ch: int = 8, seed: int = SEED):
        super().__init__()
        self.b1 = nn.Conv2d(in_ch, 8, 1)
        self.b2_reduce = nn.Conv2d(in_ch, 6, 1)
        self.b2 = nn.Conv2d(6, 8, 3, padding=1)
        self.b3_reduce = nn.Conv2d(in_ch, 4, 1, bias=False)
        self.b3 = nn.Conv2d(4, 4, 3, padding=2, dilation=2)
        self.b5 = nn.Conv2d(in_ch, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=1, padding=1)
        self.pool_proj = nn.Conv2d(in_ch, 4, 1)
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, C, H, W)
        a = F.relu(self.b1(x))  # (B, 8, H, W)
        b = F.relu(self.b2(F.relu(self.b2_reduce(x))))  # (B, 8, H, W)
        c = F.relu(self.b3(F.relu(self.b3_reduce(x))))  # (B, 4, H, W)
        d = F.relu(self.b5(x))  # (B, 4, H, W)
        e = F.relu(self.pool_proj(self.pool(x)))  # (B, 4, H, W)
        return torch.cat([a, b, c, d, e], dim=1)  # (B, 28, H, W)


def inception_inputs(batch: int = 2, in_ch: int = 8, size: int = 8, seed: int = 1) -> tuple[torch.Tensor]:
    return (randn(batch, in_ch, size, size, seed=seed),)


# ----------------------------------------------------------------------------------------------------------------------
# What "the same value" means, elementwise siblings, and the projections alone


class InPlaceBetweenSiblings(nn.Module):
    """``a(x)``, then ``x.add_(1)``, then ``b(x)``: one node, two values, so ``a`` and ``b`` must not merge."""

    @private_rng
    def __init__(self, d: int = 4, seed: int = SEED):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, d)
        x = x.clone()
        h = self.a(x)  # reads x
        x.add_(1)  # the same node now holds another value
        return h + self.b(x)  # reads x + 1


class PointwiseSiblings(nn.Module):
    """``h = x * s``, then two pointwise consumers of ``h`` (relu, sigmoid): elementwise siblings."""

    @private_rng
    def __init__(self, d: int = 64, seed: int = SEED):
        super().__init__()
        self.s = nn.Parameter(torch.empty(d))
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # x: (..., d)
        h = x * self.s
        return torch.relu(h), torch.sigmoid(h)


class QKVProjections(nn.Module):
    """Just the Q, K and V projections of attention, returned as they are: Phase 4's horizontal-fusion workload
    (x (tokens, d) -> three (tokens, d) outputs; a launch-bound decode size and a compute-bound prefill size)."""

    @private_rng
    def __init__(self, d_model: int = 32, seed: int = SEED):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # x: (..., d)
        return self.q(x), self.k(x), self.v(x)  # 3 x (..., d)


def qkv_inputs(tokens: int = 32, d_model: int = 32, seed: int = 1) -> tuple[torch.Tensor]:
    return (randn(tokens, d_model, seed=seed),)
