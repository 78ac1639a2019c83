"""At which precision eager reads a 0-d operand of a half-precision op: asked of eager itself, once per case.

``x * torch.tensor(65536.)`` with a float16 ``x`` is a float16 op, yet eager does not round the 0-d float32 operand
to float16 first (65536 would be inf): for some ops and argument positions TensorIterator hands the kernel the
0-d tensor's original value at the op's math precision (float32), for others it casts it to the op's dtype like any
other operand. Which is which depends on the op, the position, the device and the torch version (on CPU with torch
2.15, ``x * s`` and ``x / s`` read ``s`` at float32; ``s * x``, ``x + s`` and ``x - s`` round it). Rather than a
table that goes stale, the code generator asks: :func:`zero_dim_at_op_math` runs the op once on a few thousand
values and compares with both readings. Machinery for ``fusion.codegen``'s ``operand``.
"""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten
PROBED = (aten.add, aten.sub, aten.mul, aten.div)  # the ops whose CPU/CUDA kernels special-case a scalar operand


@functools.cache
def zero_dim_at_op_math(
    packet, position: int, nargs: int, dtype: torch.dtype, zero_dim: torch.dtype, device: str
) -> bool:
    """True if eager's ``packet`` (an op of ``nargs`` tensor arguments computing in ``dtype``, float16 or bfloat16,
    on ``device``) reads a 0-d ``zero_dim`` tensor at argument ``position`` at float32, False if it rounds it to
    ``dtype`` first. Ops outside :data:`PROBED` round, as TensorIterator's common-dtype cast does."""
    if packet not in PROBED or nargs != 2 or position not in (0, 1):
        return False
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # asked inside a compile (AOTAutograd's fake mode): eager must really run
        return _probe(packet, position, dtype, zero_dim, device)


def _probe(packet, position: int, dtype: torch.dtype, zero_dim: torch.dtype, device: str) -> bool:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4096, generator=g) * 100).to(dtype).to(device)
    s = torch.tensor(1 / 3 + 1e-5, dtype=zero_dim, device=device)  # far from any float16/bfloat16 value
    args = (x, s) if position == 1 else (s, x)
    with torch.no_grad():
        got = packet(*args).float()
        wide = [a.float() if a is x else a.to(torch.float32) for a in args]
        narrow = [a.float() if a is x else a.to(dtype).float() for a in args]
        at_float32, rounded = packet(*wide).to(dtype).float(), packet(*narrow).to(dtype).float()
    return bool((got != at_float32).sum() < (got != rounded).sum())
