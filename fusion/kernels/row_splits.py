"""Where a row region's store does not fit its walk: the region split so a second kernel writes it (issue 39)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.ir.plan import SplitRegion, Unsupported

CAT = torch.ops.aten.cat.default  # (kernels.rows.CAT: rows imports this module)


def misfit_store(
    misfits: Sequence[fx.Node], walked: tuple, stored: Sequence[fx.Node], members, reductions: Sequence[fx.Node] = ()
) -> Unsupported:
    """Stores the rows' walk cannot write (Swin's window partition: a permutation of a reshape of a LayerNorm's
    rows, then an add): :class:`SplitRegion` just before the first op of the misfit's own tail (its ancestors in the
    region of other shapes than the walk's ``walked``), where that tail holds two ops or more: a second, pointwise
    kernel copies the rows (the outputs outside the tail stay in the first). The tail takes in the cats before it
    (a shifted window's ``roll`` reads the rows at other rows: it cannot stay in the rows' kernel), and a tail of one
    op (an unshifted window's lone ``clone``) the ops before it that no reduction reads, nearest first, until it holds
    two (the LayerNorm's bias add): the copy is a generated kernel, not an aten copy of a 6-d permutation. Else a
    plain :class:`Unsupported` for the first misfit (it runs as an aten call, its reason in the report)."""
    shape = walked[0]

    def why(n: fx.Node) -> str:
        return (f"{n.name} {tuple(n.meta['val'].shape)} is neither the rows {shape}, a reshape or a permutation of "
                "them nor one element per row")  # fmt: skip

    def off_walk(m: fx.Node) -> bool:
        val = m.meta.get("val")
        return m in members and isinstance(val, torch.Tensor) and tuple(val.shape) not in walked

    position = {m: i for i, m in enumerate(misfits[0].graph.nodes)} if members is not None else {}
    for n in sorted(misfits, key=position.__getitem__) if members is not None else ():
        tail, stack = set(), [n]
        while stack:  # the misfit and its ancestors in the region that are not the walk's shapes
            m = stack.pop()
            if m not in tail and off_walk(m):
                tail.add(m)
                stack += m.all_input_nodes
        ops = sorted((m for m in tail if not is_view_node(m)), key=position.__getitem__)
        if reductions:
            feeding = upstream(reductions, members)  # what the reductions read stays in the rows' kernel
            tail = _with_cats(tail, members, feeding)
            if sum(not is_view_node(m) for m in tail) < 2:
                tail = _with_ops_before(tail, members, feeding, position, shape)
            ops = sorted((m for m in tail if not is_view_node(m)), key=position.__getitem__)
        # a cut with ops of the region on both sides (else the split would hand back the region itself)
        if len(ops) >= 2 and any(position[m] < position[ops[0]] and not is_view_node(m) for m in members):
            reach, stack = set(), [ops[0]]
            while stack:
                m = stack.pop()
                if m not in reach and m in members:
                    reach.add(m)
                    stack += list(m.users)
            first = [s for s in stored if s not in reach]
            return SplitRegion(f"{why(n)}: a second kernel copies the rows from {ops[0].name} on", ops[0], first)
    return Unsupported(f"{why(misfits[0])}: stored by another kernel", misfits[0])


def _with_cats(tail: set, members, feeding: set) -> set:
    """``tail`` with the cats before it (a shifted window's ``roll``: slices of the rows and a cat, per dim) and the
    views between: a cat reads the rows at other rows, so it can never stay in the rows' kernel."""
    tail, stack = set(tail), [i for m in tail for i in m.all_input_nodes]
    while stack:
        m = stack.pop()
        if m in tail or m not in members or m in feeding or not (is_view_node(m) or m.target is CAT):
            continue
        tail.add(m)
        stack += m.all_input_nodes
    return tail


def upstream(nodes: Sequence[fx.Node], members) -> set[fx.Node]:
    """``nodes`` and every member they read, directly or not: what a kernel computing them holds."""
    out, stack = set(), list(nodes)
    while stack:
        m = stack.pop()
        if m not in out and m in members:
            out.add(m)
            stack += m.all_input_nodes
    return out


def _with_ops_before(tail: set, members, feeding: set, position: dict, shape: tuple) -> set:
    """``tail`` with the members before it of the rows' whole ``shape`` that no reduction reads, latest first, until
    it holds two ops (a per-row value, the mean a LayerNorm subtracts, stays with its reduction)."""
    tail, frontier = set(tail), set()

    def before(m: fx.Node) -> set:
        return {i for i in m.all_input_nodes if i in members and i not in tail and i not in feeding
                and isinstance(i.meta.get("val"), torch.Tensor) and tuple(i.meta["val"].shape) == shape}  # fmt: skip

    for m in tail:
        frontier |= before(m)
    while frontier and sum(not is_view_node(m) for m in tail) < 2:
        m = max(frontier, key=position.__getitem__)
        frontier.discard(m)
        tail.add(m)
        frontier |= before(m)
    return tail
