"""Phase 9's pass ``sibling_casts``: a dtype cast that only GEMMs read joins the kernel of a pointwise op reading the
same tensor (:func:`join_sibling_casts`).

T5's backward casts the attention probabilities its forward saved in float32 to bfloat16 for the batched GEMM of
the values' gradient, and reads them in float32 in the softmax's backward. Alone, the cast was a library call: a
read of the whole tensor, a write, a launch (12 a step, 409.5 us of an H200's time,
scripts/results/h200-2026-11-28-sibling-casts/). Beside the softmax backward's ops, and tied to them by one alias of
the tensor both read, it is one more store of that kernel. Switch it off with ``options={"sibling_casts": False}``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.aten.nodes import dtype_cast, is_view_node, view_root
from fusion.compiler.graph_passes import cheap_and_pure, cuts_run, writes_state
from fusion.compiler.passes import Pass, noted
from fusion.fxutils.finish import relint
from fusion.fxutils.meta import call_with_meta

aten = torch.ops.aten


def casts_to_their_siblings(gm: fx.GraphModule, note: Callable[..., None]) -> None:
    """Pass ``sibling_casts``: :func:`join_sibling_casts`, after ``reorder`` and ``raise_reductions``."""
    joined = join_sibling_casts(gm.graph)
    relint(gm)
    if joined:
        note("sibling casts", [f"{len(joined)} cast(s)"], "moved", "beside a fusible op reading the same input: "
             + ", ".join(f"{c} with {r}" for c, r in joined[:4]) + ("..." if len(joined) > 4 else ""))  # fmt: skip


SIBLING = "sibling_of"  # node.meta key: the fusible op a cast was moved beside (pass combo_casts leaves it there)


def _readers_through_views(node: fx.Node) -> tuple[list[fx.Node], list[fx.Node]]:
    """(the views of ``node``, views of views included, the other nodes that read them or ``node``)."""
    views, readers, todo = [], [], list(node.users)
    while todo:
        u = todo.pop()
        if u in views or u in readers:
            continue
        if u.op == "call_function" and is_view_node(u) and len(u.all_input_nodes) == 1:
            views.append(u)
            todo.extend(u.users)
        else:
            readers.append(u)
    return views, readers


def _reads_from(node: fx.Node, base: fx.Node) -> fx.Node:
    """The node on ``node``'s own view chain that reads ``base`` itself (``node`` where it reads ``base``)."""
    cur = node
    while base not in cur.all_input_nodes:
        cur = next(a for a in cur.all_input_nodes if a is base or (is_view_node(a) and view_root(a) is base))
    return cur


def join_sibling_casts(graph: fx.Graph) -> list[tuple[str, str]]:
    """Move each dtype cast that only library calls read (a GEMM, through views) next to a pointwise op of the same
    shape that reads the same tensor later in the graph (its sibling), and the cast's readers down to where that
    op's run of fusible ops ends: the cast then joins the sibling's kernel, which reads the tensor anyway, and is
    stored from there (one write) instead of running alone (a read, a write, a launch).

    The case: T5's attention probabilities, saved in float32 by the forward; the backward casts them to bfloat16 for
    the batched GEMM of the values' gradient, and reads them in float32 in the softmax's backward. Inductor's
    scheduler fuses the two because they share a read; ours fuses runs of consecutive ops, so the cast has to stand
    in the run (and, standing there, share an edge: both read one alias of the tensor). Only a cast of a graph input
    or of a library call's output (no kernel computes its input, so it could join no producer); only where nothing
    between the cast and the run's end writes a tensor, and where every moved reader's own readers come after the
    run. Returns the (cast, sibling) names moved."""
    joined = []
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        cast = dtype_cast(node)
        if cast is None or not isinstance(cast[0], fx.Node) or SIBLING in node.meta:
            continue
        x = cast[0]
        base, in_views = view_root(x), []
        while x is not base:  # the views between the tensor and the cast, the tensor's own first
            in_views.insert(0, x)
            x = x.args[0]
        if not (base.op == "placeholder" or cuts_run(base)) or any(len(v.users) > 1 for v in in_views):
            continue
        views, readers = _readers_through_views(node)
        if not readers or not all(cuts_run(r) and not writes_state(r) for r in readers):
            continue
        val = node.meta.get("val")
        sibling = None
        for cur in sorted(_readers_through_views(base)[1], key=order.__getitem__):  # the base's readers, in order
            rv = cur.meta.get("val")
            if (
                cur is not node and order[cur] > order[node] and cur.op == "call_function"
                and isinstance(cur.target, torch._ops.OpOverload) and torch.Tag.pointwise in cur.target.tags
                and cheap_and_pure(cur) and isinstance(rv, torch.Tensor) and isinstance(val, torch.Tensor)
                and rv.shape == val.shape
            ):  # fmt: skip
                sibling = cur
                break
        if sibling is None:
            continue
        end = sibling.next  # where the sibling's run of fusible ops ends
        while end.op != "output" and not cuts_run(end) and not writes_state(end):
            end = end.next
        span = []
        cur = node.next
        while cur is not end:
            span.append(cur)
            cur = cur.next
        if any(writes_state(n) for n in span):
            continue
        # what moves to the run's end: the cast's views and readers there, and whatever there reads them (a view of
        # the GEMM's result); never the sibling or its run (they would then wait for the GEMM: no move)
        moving = set(views) | set(readers)
        moved = []
        for n in span:
            if n in moving or any(a in moving for a in n.all_input_nodes):
                moving.add(n)
                moved.append(n)
        if any(order[n] >= order[sibling] for n in moved):
            continue
        # Phase 6 joins producers and consumers: two readers of an input from outside the run are not joined. One
        # alias of the input, read by both, ties them into one region (a view: the kernel reads the tensor as is).
        for v in (*in_views, node):  # the cast (and the views it reads) just before its sibling
            sibling.prepend(v)
        for n in moved:  # the cast's views and readers, in their order, where the run ends
            end.prepend(n)
        heads = (in_views[0] if in_views else node, _reads_from(sibling, base))  # the two nodes that read base
        order = {n: i for i, n in enumerate(graph.nodes)}
        with graph.inserting_before(min(heads, key=order.__getitem__)):
            alias = call_with_meta(graph, aten.alias.default, (base,))
        for head in heads:
            head.replace_input_with(base, alias)
        node.meta[SIBLING] = sibling.name
        joined.append((node.name, sibling.name))
        order = {n: i for i, n in enumerate(graph.nodes)}
    return joined


SIBLING_CASTS = Pass("sibling_casts", noted(casts_to_their_siblings),
                     doc="a cast only GEMMs read: beside a pointwise op reading the same input, in its kernel")  # fmt: skip
