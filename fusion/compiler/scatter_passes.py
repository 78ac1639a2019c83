"""Phase 9's pass ``stack_scatters``: the gradient of a tensor that was split by ``select`` (or ``unbind``), written
as one ``cat`` instead of a ``select_scatter`` into zeros per piece and a sum of them.

``nn.MultiheadAttention``'s packed in-projection computes q, k and v as one GEMM of width 3·d and splits it with
``unflatten(-1, (3, d)).unsqueeze(0).transpose(0, -2).squeeze(-2)`` then ``[0]``, ``[1]``, ``[2]``. AOTAutograd's
backward of each ``select`` is a ``select_scatter`` of that piece's gradient into a fresh tensor of zeros of the
stacked shape, and the three are summed::

    g = select_scatter(zeros, dq, 0, 0) + select_scatter(zeros, dk, 0, 1) + select_scatter(zeros, dv, 0, 2)

Three library calls filling 3x the stacked tensor with zeros and copies, two more reading and writing it whole
(ViT-B/16's training step: 37 ``select_scatter`` calls, 73 device copies). Where the pieces cover every index of the
dim exactly once, the sum *is* the pieces stacked: ``cat([dq.unsqueeze(0), dk.unsqueeze(0), dv.unsqueeze(0)], 0)``,
which Phase 8's generator writes as one kernel of masked loads (with the copy that follows it). Values: the same,
except a -0.0 of a piece, which eager's ``-0.0 + 0.0`` turns into +0.0 and the ``cat`` keeps (equal under every
comparison of values). Inductor's pattern matcher rewrites ``select_scatter`` sums likewise.

What is left alone: a partial cover (an index no piece writes), a base that is not all zeros, sums with ``alpha``,
pieces of different dtypes, and any ``add`` of the tree read elsewhere (its partial sum is needed as it is).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.fxutils.finish import relint
from fusion.fxutils.meta import call_with_meta

aten = torch.ops.aten


def _zeros(node: object) -> bool:
    """Is ``node`` a fresh tensor of zeros (``full(size, 0)``, ``zeros``, ``new_zeros``)?"""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    if node.target in (aten.full.default, aten.new_full.default):
        return node.args[-1] == 0 and not isinstance(node.args[-1], bool)
    return node.target in (aten.zeros.default, aten.new_zeros.default)


def _leaves(root: fx.Node) -> list[fx.Node] | None:
    """The summands of the tree of ``add.Tensor`` under ``root`` (every inner add read only by its parent), or None
    when an add has an ``alpha`` or a non-node operand."""
    out, todo = [], [root]
    while todo:
        n = todo.pop()
        if n.target is aten.add.Tensor and (n is root or len(n.users) == 1):
            if n.kwargs or len(n.args) != 2 or not all(isinstance(a, fx.Node) for a in n.args):
                return None
            todo.extend(reversed(n.args))
        else:
            out.append(n)
    return out


def stack_select_scatters(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """Rewrite each sum of ``select_scatter(zeros, piece_i, dim, i)`` covering every index of ``dim`` once as
    ``cat([piece_i.unsqueeze(dim) ...], dim)`` (see the module's docstring). Returns how many sums were rewritten."""
    done = []
    for node in list(gm.graph.nodes):
        if node.target is not aten.add.Tensor or any(u.target is aten.add.Tensor and len(node.users) == 1
                                                     for u in node.users):  # fmt: skip
            continue  # only the root of a tree of adds
        leaves = _leaves(node)
        if not leaves or len(leaves) < 2 or any(leaf.target is not aten.select_scatter.default for leaf in leaves):
            continue
        val = node.meta.get("val")
        bases = [leaf.args[0] for leaf in leaves]
        if not isinstance(val, torch.Tensor) or not all(_zeros(b) and b.meta["val"].shape == val.shape for b in bases):
            continue
        rank = val.dim()
        dims = {leaf.args[2] % rank for leaf in leaves}
        if len(dims) != 1:
            continue
        dim = dims.pop()
        pieces = {leaf.args[3] % val.shape[dim]: leaf.args[1] for leaf in leaves}
        if len(pieces) != len(leaves) or sorted(pieces) != list(range(val.shape[dim])):
            continue  # an index written twice or by none: not a stack
        if any(p.meta["val"].dtype != val.dtype or any(b.meta["val"].dtype != val.dtype for b in bases)
               for p in pieces.values()):  # fmt: skip
            continue
        with gm.graph.inserting_before(node):
            parts = [call_with_meta(gm.graph, aten.unsqueeze.default, (pieces[i], dim)) for i in sorted(pieces)]
            cat = call_with_meta(gm.graph, aten.cat.default, (parts, dim))
        node.replace_all_uses_with(cat)
        done.append(node.name)
    if done:
        gm.graph.eliminate_dead_code()
        relint(gm)
        note("stack select_scatters", done, "rewritten", "a sum of select_scatters into zeros, one per index: one cat")
    return len(done)
