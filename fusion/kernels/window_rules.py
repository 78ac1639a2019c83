"""Where a window (a max-pool's values, a depthwise convolution renamed by pass ``depthwise``) is generated inside a
fusion region: the rules the kernel IR's lowering (``fusion.compiler.lower_windows``) applies, each refusal with its
reason.

* :func:`window_here` — not inside a reduction kernel (a row walk would compute the window in each pass over the
  rows, its loads scattered): :class:`Unsupported`, the window is an aten call and the reduction keeps its kernel.
  Not over another window's values in the same kernel (9 x 9 loads for two 3x3 windows in a row):
  :class:`SplitRegion` there, ``x`` stored by a first kernel and read by the second.
* :func:`cheap_per_tap` — what a tap computes again (the region's ops between the input and the window) is a few
  cheap ops: at most :data:`MAX_OPS_PER_TAP`, none of :data:`COSTLY_PER_TAP`; else :class:`Unsupported`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
import torch.fx as fx

from fusion.ir.plan import SplitRegion, Unsupported
from fusion.kernels.rows import is_depthwise, pooled_values

aten = torch.ops.aten

# What a window may compute again at each of its taps: a few cheap ops (MobileNet's BatchNorm and ReLU6 before its
# depthwise convolution, 7 lines a tap; MobileNetV3's hardswish), not a transcendental function or a long chain
# (EfficientNet's SiLU, an exp at every tap, made its GPU time 3.7x: scripts/results/h200-2026-11-25-as-suite.json;
# storing the chain for the window's kernel instead measured slower than leaving the convolution to cuDNN, part au).
COSTLY_PER_TAP = frozenset({aten.exp, aten.exp2, aten.expm1, aten.log, aten.log1p, aten.log2, aten.sigmoid, aten.tanh,
                            aten.erf, aten.erfc, aten.pow, aten.sin, aten.cos, aten.atan, aten.gelu, aten.silu})  # fmt: skip
MAX_OPS_PER_TAP = 12


def is_window(node: fx.Node) -> bool:
    """Is ``node`` a window a kernel computes: a max-pool's values (getitem 0) or a depthwise convolution?"""
    return pooled_values(node) or is_depthwise(node)


def window_here(in_reduction: bool, members: Collection[fx.Node], node: fx.Node, x: fx.Node) -> None:
    """Raise where window op ``node`` over ``x`` may not be computed in this kernel (the module's docstring)."""
    if in_reduction:
        raise Unsupported(f"{node.name} is read by a reduction in this kernel: its window runs as an aten call", node)
    stack, seen = [x], set()
    while stack:
        n = stack.pop()
        if n in seen or n not in members:
            continue
        seen.add(n)
        if is_window(n):
            raise SplitRegion(f"{node.name} reads {x.name}, computed from the window of {n.name}: each tap would "
                              "compute that window again", node, [x])  # fmt: skip
        stack += n.all_input_nodes


def cheap_per_tap(node: fx.Node, x: fx.Node, again: Sequence[fx.Node]) -> None:
    """Raise :class:`Unsupported` (the window is left to its library call, the chains around it keep their kernels)
    unless ``again``, the region's ops a tap computed again, is cheap (the module's docstring)."""
    costly = [n.name for n in again if getattr(n.target, "overloadpacket", None) in COSTLY_PER_TAP]
    if costly or len(again) > MAX_OPS_PER_TAP:
        why = f"{', '.join(costly)} at every tap" if costly else f"{len(again)} ops at every tap"
        raise Unsupported(f"{node.name} reads {x.name}, computed in this kernel: {why}; runs as an aten call", node)
