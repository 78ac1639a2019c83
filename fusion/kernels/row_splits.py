"""Where a row region's store does not fit its walk: the region split so a second kernel writes it (issue 39)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.ir.plan import SplitRegion, Unsupported


def misfit_store(misfits: Sequence[fx.Node], walked: tuple, stored: Sequence[fx.Node], members) -> Unsupported:
    """Stores the rows' walk cannot write (Swin's window partition: a permutation of a reshape of a LayerNorm's
    rows, then an add): :class:`SplitRegion` just before the first op of the misfit's own tail (its ancestors in the
    region of other shapes than the walk's ``walked``), where that tail holds two ops or more: a second, pointwise
    kernel copies the rows (the outputs outside the tail stay in the first); else a plain :class:`Unsupported` for
    the first misfit (it runs as an aten call, its reason in the report)."""
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
