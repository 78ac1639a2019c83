"""The demo models every phase and every test shares. Small, deterministic (seeded), and each with an inputs function.

    >>> from fusion import models
    >>> m = models.MLP()
    >>> (x,) = models.mlp_inputs(batch=4)
    >>> m(x).shape
    torch.Size([4, 10])

| model             | what it is for                                                              | inputs function        |
|-------------------|-----------------------------------------------------------------------------|------------------------|
| `TinyNet`         | exercises all six FX opcodes (Phase 1)                                      | `tiny_inputs`          |
| `MLP`             | Linear+ReLU in nested Sequentials + one multi-user Linear (Phase 2)         | `mlp_inputs`           |
| `FunctionalMLP`   | every functional spelling of ReLU, one in-place (Phase 2)                   | `mlp_inputs`           |
| `MatmulAddReLU`   | `relu(x @ w + b)` with raw parameters, stacked (Phase 3)                    | `matmul_inputs`        |
| `ConvBNNet`       | ResNet-style Conv+BN+ReLU, residual, bias-less and depthwise convs (Phase 5)| `conv_inputs`          |
| `TransformerMLP`  | LayerNorm → Linear → GELU → Linear → residual add (Phase 6)                 | `transformer_inputs`   |
| `ElementwiseChain`| `relu(x*a + b)*c + x`: pure memory traffic, where fusion matters most (4)   | `elementwise_inputs`   |
| `SharedConvNet`   | one conv called at two sites, each with its own BatchNorm (Phase 5)          | `conv_inputs(in_ch=4)` |
| `resnet18_block`, `mobilenet_v2_block` | real torchvision blocks, BN statistics randomised (Phase 6) | `conv_inputs`    |
| `QKVAttention`    | attention whose q, k, v Linears read one x (Phase 7)                        | `attention_inputs`     |
| `InceptionBlock`  | four branches on one input: three 1x1 convs merge, the 3x3 cannot (Phase 7) | `inception_inputs`     |
| `InPlaceBetweenSiblings`, `PointwiseSiblings` | same node vs same value; elementwise siblings (Phase 7) | any (B, d) |
| `QKVProjections`  | just q, k, v: Phase 4's horizontal-fusion workload                          | `qkv_inputs`           |
| `NormGELUResidual`| `x + gelu(layer_norm(x))`: one row reduction, one generated kernel (8)      | `norm_inputs`          |
| `ScaledSoftmax`   | `softmax(x * scale)`: amax, exp, sum, div in one kernel (Phase 8)           | `norm_inputs`          |
| `DataDependentBlock` | branches on a tensor's value: a graph break for torch.compile (Phase 9)  | `data_dependent_inputs`|

Every constructor takes ``seed=`` and draws its parameters from its own generator, so building a model never
disturbs (or depends on) the global RNG. ``ConvBNNet`` gets random, non-trivial BatchNorm statistics so that
folding BN is a real test, not the identity. The seeding helpers live in ``fusion/demo_models/seeding.py``, the
Phase 7 models (``QKVAttention`` … ``qkv_inputs``) in ``fusion/demo_models/siblings.py``; both are imported here,
so every model of the table is ``models.<name>``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusion.demo_models.seeding import SEED, private_rng, randn, randomize_batchnorm_, seeded
from fusion.demo_models.siblings import (  # noqa: F401 - Phase 7's models, re-exported: models.QKVAttention etc.
    InceptionBlock,
    InPlaceBetweenSiblings,
    PointwiseSiblings,
    QKVAttention,
    QKVProjections,
    attention_inputs,
    inception_inputs,
    qkv_inputs,
)

# ----------------------------------------------------------------------------------------------------------------------
# Phase 1: one model, all six opcodes


class TinyNet(nn.Module):
    """All six FX opcodes in four lines of forward():

    placeholder (x), get_attr (self.scale), call_module (self.linear), call_function (torch.add),
    call_method (.relu()), output (return).
    """

    @private_rng
    def __init__(self, d: int = 8, seed: int = SEED):
        super().__init__()
        self.linear = nn.Linear(d, d)
        self.scale = nn.Parameter(torch.ones(d))
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, d)
        h = self.linear(x)  # call_module
        h = torch.add(h, self.scale)  # get_attr + call_function
        return h.relu()  # call_method, then output


def tiny_inputs(batch: int = 4, d: int = 8, seed: int = 1) -> tuple[torch.Tensor]:
    return (randn(batch, d, seed=seed),)


# ----------------------------------------------------------------------------------------------------------------------
# Phase 2: Linear + ReLU


class MLP(nn.Module):
    """Linear+ReLU pairs inside nested Sequentials, and one Linear (``skip``) whose output has two users.

    ``skip``'s output feeds a ReLU *and* the residual add, so fusing it with the ReLU would lose the pre-ReLU value
    the add needs: a correct pass leaves it alone.
    """

    @private_rng
    def __init__(self, d_in: int = 32, hidden: int = 64, d_out: int = 10, seed: int = SEED):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU()),
            nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(inplace=True)),
        )
        self.skip = nn.Linear(hidden, hidden)
        self.act = nn.ReLU()
        self.head = nn.Linear(hidden, d_out)
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., d_in)
        h = self.encoder(x)  # (..., hidden)
        s = self.skip(h)  # two users: act and the add below
        h = self.act(s) + s
        return self.head(h)  # (..., d_out)


class FunctionalMLP(nn.Module):
    """ReLU spelled four ways: ``F.relu``, ``torch.relu``, ``Tensor.relu`` and in-place ``F.relu(..., inplace=True)``."""

    @private_rng
    def __init__(self, d_in: int = 32, hidden: int = 64, d_out: int = 10, seed: int = SEED):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, hidden)
        self.fc4 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, d_out)
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., d_in)
        x = F.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        x = self.fc3(x).relu()
        x = F.relu(self.fc4(x), inplace=True)
        return self.out(x)


def mlp_inputs(batch: int = 8, d_in: int = 32, seed: int = 1) -> tuple[torch.Tensor]:
    return (randn(batch, d_in, seed=seed),)


# ----------------------------------------------------------------------------------------------------------------------
# Phase 3: relu(x @ w + b) with raw parameters


class MatmulAddReLU(nn.Module):
    """``relu(x @ w + b)`` with raw ``nn.Parameter``s, one layer per pair of ``dims``.

    ``MatmulAddReLU(32, 64)`` is one layer; ``MatmulAddReLU(32, 64, 16)`` is the back-to-back chain
    ``relu(relu(x @ w0 + b0) @ w1 + b1)``.
    """

    @private_rng
    def __init__(self, *dims: int, seed: int = SEED):
        super().__init__()
        dims = dims or (32, 64)
        if len(dims) < 2:
            raise ValueError(f"MatmulAddReLU needs at least two sizes (in, out), got {dims}")
        self.dims = dims
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(a, b)) for a, b in zip(dims, dims[1:], strict=False))
        self.biases = nn.ParameterList(nn.Parameter(torch.empty(b)) for b in dims[1:])
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., dims[0])
        for w, b in zip(self.weights, self.biases, strict=True):
            x = torch.relu(x @ w + b)  # (..., out)
        return x


def matmul_inputs(batch: int = 8, d_in: int = 32, seed: int = 1) -> tuple[torch.Tensor]:
    return (randn(batch, d_in, seed=seed),)


# ----------------------------------------------------------------------------------------------------------------------
# Phase 5: a small ResNet-style conv net


class ConvBNNet(nn.Module):
    """Conv+BN+ReLU blocks with a residual: a bias-less stem conv, a conv with bias, a depthwise conv.

    stem:  conv(bias=False) → BN → ReLU
    block: conv → BN → ReLU → depthwise conv (groups=width) → BN → + stem output → ReLU
    head:  global average pool → Linear
    """

    @private_rng
    def __init__(self, in_ch: int = 3, width: int = 16, num_classes: int = 10, seed: int = SEED):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_ch, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        )
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=True)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, groups=width, bias=False)  # depthwise
        self.bn2 = nn.BatchNorm2d(width)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)
        seeded(self, seed)
        randomize_batchnorm_(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, C, H, W)
        s = self.stem(x)  # (B, width, H, W)
        h = F.relu(self.bn1(self.conv1(s)))
        h = self.bn2(self.conv2(h))
        h = F.relu(h + s)  # residual
        return self.fc(torch.flatten(self.pool(h), 1))  # (B, num_classes)


def conv_inputs(batch: int = 2, in_ch: int = 3, size: int = 16, seed: int = 1) -> tuple[torch.Tensor]:
    return (randn(batch, in_ch, size, size, seed=seed),)


# ----------------------------------------------------------------------------------------------------------------------
# Phase 6: a transformer MLP block


class TransformerMLP(nn.Module):
    """``x + fc2(gelu(fc1(layer_norm(x))))``: the feed-forward half of a transformer block."""

    @private_rng
    def __init__(self, d_model: int = 64, expansion: int = 4, seed: int = SEED):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, expansion * d_model)
        self.fc2 = nn.Linear(expansion * d_model, d_model)
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        h = self.fc1(self.norm(x))  # (B, T, 4C)
        h = F.gelu(h)
        return x + self.fc2(h)  # (B, T, C)


def transformer_inputs(batch: int = 2, seq: int = 8, d_model: int = 64, seed: int = 1) -> tuple[torch.Tensor]:
    return (randn(batch, seq, d_model, seed=seed),)


# ----------------------------------------------------------------------------------------------------------------------
# Phase 4: an elementwise chain, pure memory traffic


class ElementwiseChain(nn.Module):
    """``relu(x * a + b) * c + x`` with per-feature ``a, b, c``: five elementwise ops, zero matmuls."""

    @private_rng
    def __init__(self, d: int = 64, seed: int = SEED):
        super().__init__()
        self.a = nn.Parameter(torch.empty(d))
        self.b = nn.Parameter(torch.empty(d))
        self.c = nn.Parameter(torch.empty(d))
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., d)
        return torch.relu(x * self.a + self.b) * self.c + x


def elementwise_inputs(batch: int = 8, d: int = 64, seed: int = 1) -> tuple[torch.Tensor]:
    return (randn(batch, d, seed=seed),)


# ----------------------------------------------------------------------------------------------------------------------
# Phase 7: siblings that read one input (horizontal fusion): fusion/demo_models/siblings.py, imported above


# ----------------------------------------------------------------------------------------------------------------------
# Phase 8: blocks whose regions hold a reduction over the last dimension (one generated kernel each)


class NormGELUResidual(nn.Module):
    """``x + gelu(layer_norm(x))``: after decomposition a var_mean, its pointwise tail and GELU — one region."""

    @private_rng
    def __init__(self, d_model: int = 64, seed: int = SEED):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        return x + F.gelu(self.norm(x))  # (B, T, C)


class ScaledSoftmax(nn.Module):
    """``softmax(x * scale, dim=-1)``: amax, sub, exp, sum, div — one region, one kernel per row."""

    def __init__(self, scale: float = 0.125):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., N)
        return torch.softmax(x * self.scale, dim=-1)


def norm_inputs(batch: int = 2, seq: int = 8, d_model: int = 64, seed: int = 1) -> tuple[torch.Tensor]:
    return (randn(batch, seq, d_model, seed=seed),)


# ----------------------------------------------------------------------------------------------------------------------
# Phase 9: data-dependent control flow (a graph break for torch.compile, an error for symbolic_trace)


class DataDependentBlock(nn.Module):
    """``h = tanh(fc(x)·a + b)``, then a branch on the *value* of ``h.mean()``: Dynamo captures two graphs.

    graph 1: addmm → mul → add → tanh → mean → gt      (then Python decides the branch: a graph break)
    graph 2: relu(h·c − 0.5) + x  or  sigmoid(h)·h + x  (whichever branch runs; each is compiled on first use)
    """

    @private_rng
    def __init__(self, d: int = 32, seed: int = SEED):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.a = nn.Parameter(torch.empty(d))
        self.b = nn.Parameter(torch.empty(d))
        self.c = nn.Parameter(torch.empty(d))
        seeded(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, d)
        h = torch.tanh(self.fc(x) * self.a + self.b)  # (B, d)
        if h.mean() > 0:  # data-dependent: Python needs the number
            return torch.relu(h * self.c - 0.5) + x
        return torch.sigmoid(h) * h + x


def data_dependent_inputs(batch: int = 4, d: int = 32, seed: int = 1) -> tuple[torch.Tensor]:
    return (randn(batch, d, seed=seed),)


# ----------------------------------------------------------------------------------------------------------------------
# Phase 6: real torchvision blocks (random init, BatchNorm stats randomized, eval mode)


def resnet18_block(seed: int = SEED) -> nn.Module:
    """ResNet-18's stem and first block as torchvision builds them: conv → BN → ReLU → max-pool → BasicBlock."""
    from torchvision.models.resnet import BasicBlock

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        stem = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        block = nn.Sequential(*stem, BasicBlock(64, 64))
    return randomize_batchnorm_(block, seed).eval()


def mobilenet_v2_block(channels: int = 32, seed: int = SEED) -> nn.Module:
    """A MobileNetV2 inverted residual (torchvision): 1×1 expand ×6 → ReLU6 → 3×3 depthwise → ReLU6 → 1×1, + x."""
    from torchvision.models.mobilenetv2 import InvertedResidual

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = InvertedResidual(channels, channels, 1, 6)
    return randomize_batchnorm_(block, seed).eval()


# ----------------------------------------------------------------------------------------------------------------------
# Phase 5: a conv shared between two call sites


class SharedConvNet(nn.Module):
    """One conv called at two sites, each followed by its own BatchNorm: ``bn1(conv(x)) + bn2(conv(x))``.
    ``torch.fx.experimental.optimization.fuse`` edits the shared conv in place (pytorch issue 104593)."""

    @private_rng
    def __init__(self, ch: int = 4, seed: int = SEED):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)
        self.bn1, self.bn2 = nn.BatchNorm2d(ch), nn.BatchNorm2d(ch)
        seeded(self, seed)
        randomize_batchnorm_(self, seed)  # bn1 and bn2 get different statistics

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, ch, H, W)
        return self.bn1(self.conv(x)) + self.bn2(self.conv(x))
