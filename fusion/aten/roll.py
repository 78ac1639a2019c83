"""``torch.roll`` as two slices and a cat (issue 39: Swin's shifted windows), the decomposition the course's table uses.

Torch's reference decomposition of ``roll`` builds an index, ``(arange(n) + n - s) % n`` (``iota``, ``add``,
``fmod``), and gathers with it (``index``): three ops no generated kernel takes plus a gather, in the forward and
again in the backward (a roll's gradient is the opposite roll), where training saves the index for it. Rolled by
``s`` along a dim of size ``n``, ``out[i] = x[(i - s) % n]``: the last ``s`` elements, then the first ``n - s``,
i.e. ``cat([x[n - s:], x[:n - s]])``: two views and a cat, each output element one load, which
the kernel IR's lowering takes. Inductor lowers ``roll`` the same way, as index arithmetic inside the kernel.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def roll_as_cat(x: torch.Tensor, shifts, dims=()) -> torch.Tensor:
    """``aten.roll(x, shifts, dims)`` with static sizes: one ``cat`` of two ``slice`` views per rolled dim (a copy,
    as roll returns, where every shift is a whole turn). Without ``dims`` (roll of the flattened tensor) or with a
    symbolic size: the reference decomposition."""
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    sizes = [x.shape[d] for d in dims]
    if not dims or len(dims) != len(shifts) or not all(isinstance(n, int) for n in (*sizes, *shifts)):
        from torch._refs import roll

        return roll(x, shifts, dims)
    out = x
    for s, d, n in zip(shifts, dims, sizes, strict=True):
        s = s % n if n else 0
        if s:
            out = aten.cat.default([aten.slice.Tensor(out, d, n - s, n), aten.slice.Tensor(out, d, 0, n - s)], d)
    return aten.clone.default(out) if out is x else out
