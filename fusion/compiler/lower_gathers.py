"""Indexed reads in the kernel IR (``fusion.compiler.lowering``): ``embedding``, ``index``, ``index_select`` and
``gather`` as one :class:`~fusion.ir.kernel_ir.Load` whose index is partly a value the kernel computes.

An embedding's row, a relative-position bias gathered from its table, a position id: each output element is one
element of a tensor (the *table*) at a position that is partly the output's own index and partly a value read from
an index tensor. So the gather is not a kernel of its own: it is a load inside whatever kernel reads it (BERT's three
embeddings summed and normalized in one kernel; OPT's learned positions added to its tokens), as Inductor lowers
``index`` to an indirect load.

How a position is built: each dim of the table gets either an affine index of the loops (a dim the output walks) or
a *placeholder variable* standing for the value read from the index tensor. The table may be a view of a kernel input
(BERT's ``token_type_ids`` buffer expanded); the views map the index back to the input as for any load
(``index_algebra.view_index``), and what multiplies each placeholder in the input's offset is its stride. The load is
``table[affine + sum(value * stride)]`` (``Load.indirect``), each value checked to lie in ``[0, size)`` by the
renderer (eager's ``IndexError``; nothing outside the table is read).

The rules (where one does not hold: the region split in two kernels, or a refusal with its reason and the op an aten
call):

* the table is a kernel input or a view of one: a value computed in the region cannot be read at a position known
  only at run time, so the region is split there (a first kernel stores it, the gather's kernel reads it);
* a placeholder must reach the input's offset as a plain term (not under a reshape's ``//`` or ``%``);
* a gather of floats the kernel would read :data:`REREAD` times an element or more (broadcast, as a bias over every
  window) is stored once, with the copies after it that do not broadcast yet (a kernel of its own: Swin's bias
  gathered and laid out contiguous), and the region split there: two dependent loads an element cost more than one,
  and a C kernel's call or a replayed CUDA graph's launch costs little. On a GPU without CUDA graphs the backend's
  pass ``inline_gathers`` keeps it in the kernel, as Inductor does: there the launch a kernel of its own adds costs
  more CPU than its loads cost GPU time. Gathered ids (BERT's token types, read by the next embedding) stay in the
  kernel;
* ``index`` takes integer index tensors (a boolean mask's result has a size known only at run time), negative
  indices counted from the end as eager does; ``embedding``, ``index_select`` and ``gather`` take no negative index
  (eager raises, so does the kernel).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.aten.nodes import bind_args
from fusion.aten.nodes import is_view_node as is_view
from fusion.compiler.index_algebra import broadcast, offset, var, view_index
from fusion.compiler.passes import Pass, current, noted
from fusion.ir import kernel_ir as ir
from fusion.ir.plan import SplitRegion, Unsupported
from fusion.kernels.rows import is_gather

aten = torch.ops.aten
INDEX_DTYPES = (torch.int64, torch.int32)
# A gather whose values the kernel reads this many times each or more (Swin's relative-position bias, (heads, 49, 49),
# added to the scores of every window) is stored once instead: each read of a gathered element is two dependent
# loads (the index, then the table) where a stored one is one. On an H200 (bf16, CUDA graphs, 2026-11-27) Swin-T ran
# 3.29 ms a call without this rule and 3.23 ms with it (two hosts whose earlier tree ran 3.153 and 3.161 ms); with the
# stored bias a kernel of its own (gathered and laid out contiguous, no aten index) 3.110 -> 3.005 ms, MaxViT-T
# 6.778 -> 6.671 ms (docs/measurements.md); on 2026-11-28 MaxViT-T 6.373 ms stored against 6.579 gathered inside the
# softmax. On a CPU (the C renderer, the CPU suite's sizes) the gather inside Swin-T's softmax kernels made a call
# 1.56x slower (212.8 against 136.2 ms). On a GPU without CUDA graphs the kernel it adds is a launch (22 a MaxViT-T
# call) of a CPU-bound call: there pass inline_gathers keeps it in the softmax (MaxViT-T 1-2 %, Swin-T 4 % faster).
REREAD = 4
INLINE_GATHER = "inline_gather"  # node.meta key (pass inline_gathers): a load in its kernel however often it is read
ON_CPU = False  # the tests: pass inline_gathers marks CPU gathers too


def positions(node: fx.Node, index: list[ir.Affine]) -> tuple[fx.Node, list]:
    """(the table, per dim of the table: an affine index, or ``(index node, its index, wrap negatives)``) of the
    gather ``node``'s element at ``index``."""
    packet, bound = node.target.overloadpacket, bind_args(node)
    if packet is aten.embedding:
        weight, ids = bound["weight"], bound["indices"]
        n = ids.meta["val"].dim()
        return weight, [(ids, index[:n], False), *index[n:]]
    if packet is aten.index_select:
        x, ids = bound["self"], bound["index"]
        dim = bound["dim"] % max(1, x.meta["val"].dim())
        at = [index[dim]] if ids.meta["val"].dim() else []
        return x, [(ids, at, False) if d == dim else i for d, i in enumerate(index)]
    if packet is aten.gather:
        x, ids = bound["self"], bound["index"]
        dim = bound["dim"] % max(1, x.meta["val"].dim())
        return x, [(ids, index, False) if d == dim else i for d, i in enumerate(index)]
    # index.Tensor: the index tensors broadcast together; where they sit next to each other their dims replace the
    # indexed dims in place, else they come first (numpy's rule, as torch's)
    x, indices = bound["self"], list(bound["indices"])
    given = [d for d, t in enumerate(indices) if t is not None]
    if not given:
        raise Unsupported(f"{node.name}: index with no index tensor", node)
    vals = [indices[d].meta["val"] for d in given]
    if any(v.dtype not in INDEX_DTYPES for v in vals):
        raise Unsupported(f"{node.name}: index by a {vals[0].dtype} mask (its size is known only at run time)", node)
    nb = len(torch.broadcast_shapes(*(tuple(v.shape) for v in vals)))
    adjacent = given == list(range(given[0], given[-1] + 1))
    first = given[0] if adjacent else 0
    kept = iter(list(range(first)) + list(range(first + nb, len(index))) if adjacent else range(nb, len(index)))
    out = []
    for d in range(x.meta["val"].dim()):
        if d in given:
            out.append((indices[d], index[first : first + nb], True))
        else:
            out.append(index[next(kept)])
    return x, out


def _before_broadcast(low, node: fx.Node, size: int) -> fx.Node:
    """The last member of the chain from gather ``node`` (each its predecessor's only reader in the region) that still
    has the gather's ``size`` elements: Swin's bias gathered, viewed, permuted and copied contiguous. The first kernel
    of the split stores that (a gather and a copy: a kernel of its own), the second reads it as a plain input."""
    last = node
    while True:
        readers = [u for u in last.users if u in low.members]
        val = readers[0].meta.get("val") if len(readers) == 1 else None
        if not isinstance(val, torch.Tensor) or val.numel() != size:
            return last
        last = readers[0]


def gathered(low, node: fx.Node, index: list[ir.Affine]) -> tuple[str, torch.dtype]:
    """The value of gather ``node`` at ``index`` (held at its compute dtype): one load of the table (the module's
    docstring). ``low``: the :class:`~fusion.compiler.lowering.Lowering` building the kernel."""
    size, elements = node.meta["val"].numel(), math.prod(low.shape)
    floating = node.meta["val"].dtype.is_floating_point  # gathered ids (BERT's token types) index another table
    stored = floating and size and not node.meta.get(INLINE_GATHER, False)  # pass inline_gathers (GPU)
    if stored and elements >= REREAD * size:  # broadcast: the same few values gathered again and again
        raise SplitRegion(
            f"{node.name} is read {elements // size} times an element in this kernel (broadcast): gathered once and "
            "stored, the kernel reads it as a plain input",
            node,
            [_before_broadcast(low, node, size)],
        )
    table, where = positions(node, index)
    shape = tuple(table.meta["val"].shape)
    at, checks = [], []
    for d, w in enumerate(where):
        if isinstance(w, ir.Affine):
            at.append(w)
            continue
        ids, ids_index, wrap = w
        if ids.meta["val"].dtype not in INDEX_DTYPES:
            raise Unsupported(f"{node.name}: index tensor {ids.name} of {ids.meta['val'].dtype}", node)
        if shape[d] == 0:
            raise Unsupported(f"{node.name}: an index into an empty dim (eager raises)", node)
        value = low.operand(ids, broadcast(ids_index, ids.meta["val"].shape), torch.int64)
        if wrap:  # index: -1 is the last
            negative = low.op("lt", [value, low.const(0, torch.int64)], torch.bool)
            shifted = low.op("add", [value, low.const(shape[d], torch.int64)], torch.int64)
            value = low.op("where", [negative, shifted, value], torch.int64)
        name = f"g{low.new()}"  # a placeholder variable standing for the value, over [0, size)
        low.sizes[name] = shape[d]
        at.append(var(name))
        checks.append((name, value, shape[d]))
    src = table
    while src in low.members:  # a view of a kernel input: mapped back as any load's index
        if not is_view(src):  # two kernels: the first stores it, the second gathers from it
            raise SplitRegion(
                f"{node.name} reads {src.name} at a position known only at run time: a kernel stores {src.name}, "
                "the next gathers from it",
                node,
                [src],
            )
        at = view_index(src, at, low.sizes)
        src = src.args[0]
    val = src.meta["val"]
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"input {src.name} is not a tensor ({type(val).__name__})", node)
    flat = low.real(offset(broadcast(at, val.shape), val.stride()))
    coef = {name: 0 for name, _, _ in checks}
    rest = []
    for k, atom in flat.terms:
        if isinstance(atom, ir.Var) and atom.name in coef:
            coef[atom.name] += k
            continue
        if not isinstance(atom, ir.Var) and atom.of.variables() & coef.keys():
            raise Unsupported(f"{node.name}: an index read through a reshape of {src.name} (under // or %)", node)
        rest.append((k, atom))
    indirect = tuple((value, bound, coef[name]) for name, value, bound in checks)
    return low.load(src, ir.Affine(tuple(rest), flat.const), indirect)


def mark_inline_gathers(gm: fx.GraphModule, note: Callable[..., None]) -> None:
    """Pass ``inline_gathers``: on a GPU without CUDA graphs, mark every gather of floats to stay a load inside the
    kernel that reads it however often that kernel reads each value (:func:`gathered`): a kernel of its own would be
    a launch, and a launch costs more CPU than the gather's loads cost GPU time (the module's docstring). Under CUDA
    graphs (a replayed launch costs no CPU) and on a CPU (a C kernel's call costs little) it marks nothing unless
    ``options={"inline_gathers": True}`` asks (or ``ON_CPU``, the tests)."""
    gathers = [n for n in gm.graph.nodes if is_gather(n) and _floats(n)]
    if not gathers:
        return
    opts = current()
    asked = opts is not None and "inline_gathers" in opts.explicit
    where = gathers[0].meta["val"].device.type
    why = "CUDA graphs: a replayed launch costs no CPU" if opts is not None and opts.cudagraphs else (
        "a CPU: a C kernel's call costs little" if where == "cpu" and not ON_CPU else "")  # fmt: skip
    if why and not asked:
        note("inline gathers", [n.name for n in gathers[:4]], "skipped", f"{why}; stored where read {REREAD}+ times")
        return
    for n in gathers:
        n.meta[INLINE_GATHER] = True
    note("inline gathers", [n.name for n in gathers[:4]] + (["..."] if len(gathers) > 4 else []), "marked",
         f"{len(gathers)} gathers of floats stay loads in the kernels that read them: no launch of their own")  # fmt: skip


def _floats(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype.is_floating_point


INLINE_GATHERS = Pass("inline_gathers", noted(mark_inline_gathers), requires=("codegen",),
                      doc="a gather read many times an element (a relative-position bias) kept inside the kernel that "
                      "reads it, no launch of its own (a GPU without CUDA graphs)")  # fmt: skip
