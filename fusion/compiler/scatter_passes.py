"""Phase 9's pass ``stack_scatters``: the gradient of a tensor that was split into pieces (``select``, ``unbind``,
slices), written as one ``cat`` instead of a scatter into zeros per piece and a sum of them.

``nn.MultiheadAttention``'s packed in-projection computes q, k and v as one GEMM of width 3·d and splits it with
``unflatten(-1, (3, d)).unsqueeze(0).transpose(0, -2).squeeze(-2)`` then ``[0]``, ``[1]``, ``[2]``. AOTAutograd's
backward of each ``select`` is a ``select_scatter`` of that piece's gradient into a fresh tensor of zeros of the
stacked shape, and the three are summed::

    g = select_scatter(zeros, dq, 0, 0) + select_scatter(zeros, dk, 0, 1) + select_scatter(zeros, dv, 0, 2)

Three library calls filling 3x the stacked tensor with zeros and copies, two more reading and writing it whole
(ViT-B/16's training step: 37 ``select_scatter`` calls, 73 device copies). Llama's ``rotate_half`` (``cat(-x2,
x1)`` of a head's halves) has the same backward with two ``slice_scatter``s of half a head each (32 calls a step,
and the ``neg`` of each half an aten call). Where the pieces tile the dim exactly (no gap, no overlap), the sum *is*
the pieces concatenated: ``cat([dq.unsqueeze(0), dk.unsqueeze(0), dv.unsqueeze(0)], 0)``, which Phase 8's generator
writes as one kernel of masked loads, with the ops around it. Values: the same, except a -0.0 of a piece, which
eager's ``-0.0 + 0.0`` turns into +0.0 and the ``cat`` keeps (equal under every comparison of values). Inductor's
pattern matcher rewrites scatter sums likewise.

Swin's patch merging reads the four 2x2 offsets of its map (``x[:, 0::2, 0::2]``, ...): each gradient is a step-2
``slice_scatter`` of a step-2 ``slice_scatter`` into zeros, and the four are summed. Where strided pieces cover every
offset of their steps once, they are woven back (:func:`_interleaved`): along each dim, a ``cat`` of the pieces
unsqueezed after it and a ``view`` merging the two dims.

What is left alone: a gap (an index no piece writes), an overlap, a base that is not all zeros, sums with ``alpha``,
strided slices that stop before the end, pieces of different dtypes, and any ``add`` inside the sum read elsewhere (its partial sum is
needed as it is). A sum of scatters and other terms rewrites its scatters' own sum where that is an ``add`` of them.

Pass ``index_put_sums`` (:func:`index_puts_as_sums`, CUDA): an accumulating ``index_put`` into a small table, the
gradient of a gather from it (Swin's relative-position bias), as one masked sum a generated kernel runs (below).
"""

from __future__ import annotations

import contextlib
import math
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


SCATTERS = (aten.select_scatter.default, aten.slice_scatter.default)


def _slice_args(leaf: fx.Node) -> tuple[int, int | None, int | None, int | None]:
    """(dim, start, end, step) of ``slice_scatter(base, src, dim=0, start=None, end=None, step=1)``, the dim made
    non-negative, the others as given (None where omitted)."""
    args = list(leaf.args) + [None] * (6 - len(leaf.args))
    return (args[2] or 0) % leaf.meta["val"].dim(), args[3], args[4], args[5]


def _piece(leaf: fx.Node, rank: int, shape) -> tuple[int, int, int, fx.Node] | None:
    """(dim, start, end, value to cat) of a scatter into ``shape``: a select writes ``[i, i + 1)`` (its source
    unsqueezed at the cat), a slice of step 1 ``[start, end)``; None for a slice with a step."""
    if leaf.target is aten.select_scatter.default:
        dim = leaf.args[2] % rank
        i = leaf.args[3] % shape[dim]
        return dim, i, i + 1, None
    dim, lo, hi, step = _slice_args(leaf)
    if step not in (None, 1):
        return None
    size = shape[dim]
    lo, hi = (0 if lo is None else lo), (size if hi is None else hi)
    lo, hi = (lo + size if lo < 0 else lo), (hi + size if hi < 0 else hi)
    return dim, max(0, min(lo, size)), max(0, min(hi, size)), leaf.args[1]


def stack_select_scatters(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """Rewrite each sum of scatters into zeros (``select_scatter``/``slice_scatter(zeros, piece_i, dim, ...)``)
    whose pieces tile ``dim`` exactly as ``cat`` of the pieces (a select's unsqueezed) in order along ``dim`` (see
    the module's docstring; Llama's ``rotate_half`` backward is two ``slice_scatter``s of half a head each). Returns
    how many sums were rewritten."""
    done = []
    for node in list(gm.graph.nodes):
        if node.target is not aten.add.Tensor or not node.users:
            continue
        leaves = _leaves(node)
        if not leaves or len(leaves) < 2 or any(leaf.target not in SCATTERS for leaf in leaves):
            continue
        woven = _interleaved(gm, node, leaves)
        if woven is not None:
            node.replace_all_uses_with(woven)
            done.append(node.name)
            continue
        val = node.meta.get("val")
        bases = [leaf.args[0] for leaf in leaves]
        if not isinstance(val, torch.Tensor) or not all(_zeros(b) and b.meta["val"].shape == val.shape for b in bases):
            continue
        pieces = [_piece(leaf, val.dim(), val.shape) for leaf in leaves]
        if any(p is None for p in pieces) or len({p[0] for p in pieces}) != 1:
            continue
        dim = pieces[0][0]
        spans = sorted((lo, hi, leaf) for (_, lo, hi, _), leaf in zip(pieces, leaves, strict=True) if hi > lo)
        if [lo for lo, _, _ in spans] != [0] + [hi for _, hi, _ in spans[:-1]] or spans[-1][1] != val.shape[dim]:
            continue  # a gap (zeros there) or an overlap (a sum there): not a stack
        if any(leaf.args[1].meta["val"].dtype != val.dtype or leaf.args[0].meta["val"].dtype != val.dtype
               for leaf in leaves):  # fmt: skip
            continue
        with gm.graph.inserting_before(node):
            parts = [leaf.args[1] if leaf.target is aten.slice_scatter.default
                     else call_with_meta(gm.graph, aten.unsqueeze.default, (leaf.args[1], dim))
                     for _, _, leaf in spans]  # fmt: skip
            cat = call_with_meta(gm.graph, aten.cat.default, (parts, dim))
        node.replace_all_uses_with(cat)
        done.append(node.name)
    if done:
        gm.graph.eliminate_dead_code()
        relint(gm)
        note("stack select_scatters", done, "rewritten", "a sum of scatters into zeros tiling a dim: one cat")
    return len(done)


def _strided(leaf: fx.Node, shape) -> tuple[dict[int, tuple[int, int]], fx.Node] | None:
    """``({dim: (start, step)}, source)`` of a ``slice_scatter`` into zeros of ``shape`` with a step, nested ones
    (Swin's patch merging reads ``x[:, 0::2, 1::2]``: its gradient is a step-2 scatter of a step-2 scatter) taken
    whole: every slice runs to the end of its dim, which its step divides; None for anything else."""
    at: dict[int, tuple[int, int]] = {}
    while leaf.op == "call_function" and leaf.target is aten.slice_scatter.default and _zeros(leaf.args[0]):
        dim, lo, hi, step = _slice_args(leaf)
        lo, step, size = lo or 0, step or 1, leaf.meta["val"].shape[dim]
        if dim in at or step < 2 or size % step or not 0 <= lo < step or (hi is not None and hi < size):
            return None
        if tuple(leaf.args[1].meta["val"].shape)[dim] != size // step:
            return None
        at[dim] = (lo, step)
        leaf = leaf.args[1]
        if len(leaf.users) != 1:
            break
    return (at, leaf) if at and len(shape) == len(leaf.meta["val"].shape) else None


def _interleaved(gm: fx.GraphModule, node: fx.Node, leaves: list[fx.Node]) -> fx.Node | None:
    """The sum ``node`` of strided scatters into zeros whose pieces interleave over their dims, every offset of every
    step once (the patch merging's four 2x2 offsets), as the pieces woven together: along each dim, from the last,
    ``cat`` of the pieces unsqueezed after it, then a ``view`` merging the two dims. None where it is not that."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or any(leaf.meta["val"].dtype != val.dtype for leaf in leaves):
        return None
    found = [_strided(leaf, tuple(val.shape)) for leaf in leaves]
    if any(f is None for f in found):
        return None
    dims = sorted(found[0][0])
    steps = {d: found[0][0][d][1] for d in dims}
    if any(sorted(at) != dims or any(at[d][1] != steps[d] for d in dims) for at, _ in found):
        return None
    pieces = {tuple(at[d][0] for d in dims): src for at, src in found}
    if len(pieces) != len(found) or len(pieces) != math.prod(steps.values()):
        return None  # an offset twice (a sum) or one missing (zeros there)
    piece_shape = [size // steps[d] if d in steps else size for d, size in enumerate(val.shape)]
    if any(src.meta["val"].dtype != val.dtype or list(src.meta["val"].shape) != piece_shape for src in pieces.values()):
        return None  # each piece is the sum's shape with every woven dim divided by its step
    with gm.graph.inserting_before(node):
        for k in range(len(dims) - 1, -1, -1):  # weave the last dim first: keys lose their last offset each round
            d, woven = dims[k], {}
            for key in sorted({key[:k] for key in pieces}):
                group = [pieces[key + (o,)] for o in range(steps[d])]
                parts = [call_with_meta(gm.graph, aten.unsqueeze.default, (p, d + 1)) for p in group]
                cat = call_with_meta(gm.graph, aten.cat.default, (parts, d + 1))
                shape = list(cat.meta["val"].shape)
                shape[d : d + 2] = [shape[d] * shape[d + 1]]
                woven[key] = call_with_meta(gm.graph, aten.view.default, (cat, shape))
            pieces = woven
    (out,) = pieces.values()
    return out


# Pass ``index_put_sums``: an accumulating ``index_put`` into a small table as one masked sum a generated kernel runs.
# AOTAutograd writes the gradient of a gather from a table (Swin's relative-position bias: a (169, heads) table read
# at 2,401 positions a window) as ``index_put(zeros, [index], grad, accumulate=True)``. On CUDA aten runs that as a
# bound check, a sort of the indices and the accumulation: ~8 launches, 12 calls a Swin-T step. Written as
#
#     out[r, ...] = base[r, ...] + sum over i of where(table_row(index[i]) == r, grad[i, ...], 0)
#
# with ``table_row = arange(R)[index]`` (a gather the kernel range-checks as eager's indexing does, and that maps a
# negative index to R + index as eager does), it is one reduction over the n positions per table entry: R * n *
# prod(rest) compares, so only for small tables (INDEX_PUT_MAX_*). Deterministic; eager's sorted accumulation adds
# the same values in another order (float rounding may differ). CUDA only (a CPU's aten loop adds each value once,
# where the masked sum reads every position R times); ON_CPU (the tests) rewrites CPU graphs too.
INDEX_PUT_MAX_ROWS = 4096
INDEX_PUT_MAX_WORK = 1 << 24  # R * n * prod(rest) compares and reads at most
ON_CPU = False


def index_put_refusal(node: fx.Node) -> str | None:
    """Why ``node`` (an ``index_put``) stays as it is, or None when :func:`index_puts_as_sums` rewrites it."""
    base, indices, values = node.args[:3]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    if not accumulate:
        return "not accumulating (a store, not a sum)"
    if len(indices) != 1 or not isinstance(indices[0], fx.Node) or not isinstance(values, fx.Node):
        return "indexes more than its first dim"
    b, i, v = base.meta["val"], indices[0].meta["val"], values.meta["val"]
    if b.device.type != "cuda" and not ON_CPU:
        return f"on {b.device.type}: aten's loop adds each value once, a masked sum reads each position per row"
    if i.dim() != 1 or i.dtype not in (torch.int64, torch.int32):
        return f"an index of {i.dtype} with {i.dim()} dims (a mask or a grid of indices)"
    rows, n, rest = b.shape[0] if b.dim() else 0, i.shape[0], tuple(b.shape[1:])
    if b.dtype not in (torch.float32, torch.float64) or v.dtype != b.dtype:
        return f"values of {v.dtype} into {b.dtype}: eager accumulates half types in the half type"
    if tuple(v.shape) != (n, *rest):
        return f"values of shape {tuple(v.shape)}, not ({n}, *{rest}) (broadcast values)"
    if rows == 0 or n == 0 or rows > INDEX_PUT_MAX_ROWS or rows * n * math.prod(rest) > INDEX_PUT_MAX_WORK:
        return f"a table of {rows} rows read at {n} positions: over the masked sum's size limits"
    if rest and math.prod(rest) > 1 and v.stride(0) != 1:
        return f"values at strides {tuple(v.stride())}: the sum would read the positions scattered"
    return None


def index_puts_as_sums(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """Pass ``index_put_sums`` (above). Returns how many ``index_put`` calls it rewrote."""
    graph, done = gm.graph, []
    for node in list(graph.find_nodes(op="call_function", target=aten.index_put.default)):
        if why := index_put_refusal(node):
            note("index_put_sums", [node.name], "skipped", why)
            continue
        with graph.inserting_before(node):
            out, new = _masked_sum(graph, node)
        if out.meta["val"].stride() != node.meta["val"].stride():  # what reads the result was traced on its layout
            for n in reversed(new):
                graph.erase_node(n)
            note("index_put_sums", [node.name], "skipped", "the table's layout differs from the sum's")
            continue
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        done.append(node.name)
    if done:
        graph.eliminate_dead_code()
        relint(gm)
        note("index_put_sums", done, "rewritten", "index_put(accumulate) into a small table: one masked sum")
    return len(done)


def _masked_sum(graph: fx.Graph, node: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """``base + sum(where(arange(R)[index] == r, values, 0))`` for the ``index_put`` ``node`` (the add left out for a
    base of zeros): the result and every node made, in order."""
    base, (index,), values = node.args[:3]
    b = base.meta["val"]
    rows, k, new = b.shape[0], b.dim() - 1, []

    def call(target, *args, **kwargs) -> fx.Node:
        new.append(call_with_meta(graph, target, args, kwargs))
        return new[-1]

    mode = getattr(index.meta["val"], "fake_mode", None) or contextlib.nullcontext()  # ops of no tensor: fake too
    with mode:
        table = call(aten.arange.default, rows, dtype=index.meta["val"].dtype, device=b.device, pin_memory=False)
        zero = call(aten.scalar_tensor.default, 0.0, dtype=b.dtype, device=b.device)
    row_of = call(aten.index.Tensor, table, [index])  # checked and wrapped as eager's indexing
    same = call(
        aten.eq.Tensor,
        call(aten.view.default, row_of, [1] * (k + 1) + [-1]),
        call(aten.view.default, table, [rows] + [1] * (k + 1)),
    )
    moved = call(aten.unsqueeze.default, call(aten.permute.default, values, [*range(1, k + 1), 0]), 0)
    total = call(aten.sum.dim_IntList, call(aten.where.self, same, moved, zero), [-1])
    return (total if _zeros(base) else call(aten.add.Tensor, base, total)), new
