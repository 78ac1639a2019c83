"""Phase 9's pass ``cast_views``: a cast after views written as the views of a cast, so it joins the kernel that
computes the views' input (``cast(permute(view(x)))`` as ``permute(view(cast(x)))``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.compiler.graph_passes import cuts_run, writes_state
from fusion.compiler.passes import Pass, noted
from fusion.fxutils.finish import relint
from fusion.fxutils.meta import call_with_meta

aten, prims = torch.ops.aten, torch.ops.prims


# Views that relabel every element of their input, none dropped or repeated: a cast commutes with them
SAME_ELEMENTS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
                 aten.transpose.int, aten.t.default, aten.alias.default, aten.squeeze.dim, aten.squeeze.dims,
                 aten.squeeze.default, aten.unsqueeze.default}  # fmt: skip


def casts_before_views(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """Pass ``cast_views``: ``cast(permute(view(x)))`` as ``permute(view(cast(x)))`` where a kernel computes ``x``
    (a cast is elementwise: the same values, and it keeps its input's strides, so the same layout). The cast then has
    ``x``'s shape and joins ``x``'s kernel as one more store; after the views it was a store of another shape, cut
    off into a kernel of one op (an aten call). T5's attention multiplies in float32 and the min-cut partitioner
    saves bfloat16 casts of the transposed q, k and v: 36 aten casts a training step. Kept as it was where the
    layout would differ. Returns how many moved."""
    graph, moved = gm.graph, []
    for node in list(graph.find_nodes(op="call_function", target=prims.convert_element_type.default)):
        chain, x = [], node.args[0]
        while isinstance(x, fx.Node) and x.op == "call_function" and x.target in SAME_ELEMENTS:
            chain.append(x)
            x = x.args[0]
        if not chain or not isinstance(x, fx.Node) or x.op != "call_function" or cuts_run(x) or writes_state(x):
            continue  # no view between, or x is a library call's output or an input: nothing to join
        new: list[fx.Node] = []
        try:
            with graph.inserting_after(x):
                cur = call_with_meta(graph, node.target, (x, *node.args[1:]), dict(node.kwargs))
                new.append(cur)
            for view in reversed(chain):
                with graph.inserting_after(cur):
                    cur = call_with_meta(graph, view.target, (cur, *view.args[1:]), dict(view.kwargs))
                    new.append(cur)
            same = (
                cur.meta["val"].shape == node.meta["val"].shape
                and cur.meta["val"].stride() == node.meta["val"].stride()
            )
        except Exception:  # noqa: BLE001 - a view the cast's layout does not allow: left as it was
            same = False
        if not same:
            for n in reversed(new):
                graph.erase_node(n)
            continue
        node.replace_all_uses_with(cur)
        graph.erase_node(node)
        for view in chain:  # the old views, where nothing else reads them
            if not view.users:
                graph.erase_node(view)
        moved.append(node.name)
    if moved:
        relint(gm)
        note("cast views", moved, "moved", "a cast after views as the views of a cast: it joins its input's kernel")
    return len(moved)


CAST_VIEWS = Pass("cast_views", noted(casts_before_views),
                  doc="a cast after views as the views of a cast: it joins the kernel computing its input")  # fmt: skip
