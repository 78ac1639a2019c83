"""Ops a pass wants as a generated kernel even where no region holds them.

Phase 6 builds a region only around two or more ops: an op alone is an aten call. A few lone ops are worth a kernel of
their own all the same, and the pass that knows marks them (``node.meta[OWN_KERNEL]``): pass ``copy_kernels``'s layout
copies (aten's copy of a permuted view is a generic, slow kernel) and pass ``split_reductions``'s two stages (aten's
reduction of a few long rows or columns of partials costs more than the generated one). Code generation gives each
marked op that no region holds a region of its own with the views before it that only it reads
(:func:`lone_kernel_regions`, from ``generate.compile_graph``); ``partition`` keeps a marked op's piece of one op
where a region is cut (:func:`is_lone_kernel_piece`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.compiler.graph_passes import writes_state
from fusion.ir.plan import Region

OWN_KERNEL = "own_kernel"  # node.meta key: this op runs as a generated kernel where no region holds it


def is_lone_kernel_piece(nodes: Sequence[fx.Node]) -> bool:
    """Is this piece of a region one marked op and the views it reads (kept as a kernel, not left to aten)?"""
    ops = [n for n in nodes if not is_view_node(n)]
    return len(ops) == 1 and ops[0].meta.get(OWN_KERNEL, False)


def lone_kernel_regions(gm: fx.GraphModule, regions: Sequence[Region]) -> list[Region]:
    """A region for each marked op that no region holds: the op and the views before it that only it reads (none a
    member of another region, and no write between the view and the op: the kernel's call sits where its first
    member is, and reads its input there), in graph order."""
    taken = {n for r in regions for n in r.nodes}
    lone = [n for n in gm.graph.nodes if n.meta.get(OWN_KERNEL) and n not in taken]
    if not lone:
        return []
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    writes = [order[n] for n in gm.graph.nodes if writes_state(n)]
    out: list[Region] = []
    for node in lone:
        chain, x = [node], node.args[0]
        while (
            isinstance(x, fx.Node) and x.op == "call_function" and is_view_node(x, getitem=False)
            and x not in taken and len(x.users) == 1 and len(x.all_input_nodes) == 1
            and not any(order[x] < w < order[node] for w in writes)
        ):  # fmt: skip
            chain.insert(0, x)
            x = x.args[0]
        out.append(Region(chain, index=len(regions) + len(out)))
        taken.update(chain)
    return out
