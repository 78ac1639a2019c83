"""How every demo model of ``fusion.models`` gets its parameters: deterministic (seeded), each from its own
generator, so building a model never disturbs (or depends on) the global RNG.

* :func:`seeded` re-draws every parameter of a module: multiplicative vectors near 1, biases small, matrices scaled
  by their fan-in.
* :func:`private_rng` decorates an ``__init__`` so the default initializers it runs leave the global RNG alone.
* :func:`randn` draws an input tensor from its own seed.
* :func:`randomize_batchnorm_` gives every BatchNorm non-trivial statistics, so that folding BN is a real test.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn

SEED = 0


def seeded(module: nn.Module, seed: int) -> nn.Module:
    """Re-draw every parameter of ``module`` from a private generator: deterministic, global RNG untouched."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1 and name.rsplit(".", 1)[-1] in ("weight", "scale", "a", "c"):  # multiplicative: near 1
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:  # additive (biases): small
                p.copy_(torch.rand(p.shape, generator=g) * 0.2 - 0.1)
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.numel()
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(max(fan_in, 1)))
    return module


def private_rng(init):
    """Decorate ``__init__`` so the default initializers it triggers never touch the caller's global RNG."""

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        with torch.random.fork_rng(devices=[]):
            init(self, *args, **kwargs)

    return wrapper


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def randomize_batchnorm_(model: nn.Module, seed: int = SEED) -> nn.Module:
    """Give every BatchNorm non-trivial running stats (and affine params): folding must be a real test."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                c = m.num_features
                if m.running_mean is not None:
                    m.running_mean.copy_(torch.randn(c, generator=g) * 0.5)
                    m.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.25)
                if m.affine:
                    m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(c, generator=g) * 0.2)
    return model
