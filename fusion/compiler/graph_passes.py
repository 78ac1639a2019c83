"""The graph clean-ups every compiler runs on an aten graph (Phase 9's passes ``cse``, ``constants``, ``reinplace``,
``reorder``): work the graph repeats once, values of no input computed at compile time, buffer updates in place as
eager makes them, and ops moved next to their readers so Phase 6's runs of fusible ops meet.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.aten.nodes import as_traced, is_view_node
from fusion.compiler.lower_reductions import REDUCTIONS
from fusion.fxutils.finish import relint
from fusion.kernels.rows import is_gather

aten = torch.ops.aten
prims = torch.ops.prims


# ----------------------------------------------------------------------------------------------------------------------
# Locality: each op next to its first reader


def reorder_for_locality(gm: fx.GraphModule, note: Callable[..., None]) -> None:
    """Phase 9's pass ``reorder``: :func:`sink_to_first_use`, :func:`hoist_constants`, :func:`raise_returned`. Phase
    6 fuses runs of *consecutive* fusible ops, and AOTAutograd's backward may compute a value far from where it is
    read (a ReLU's mask at the top, its ``where`` much later): moved together, they become one region."""
    moved = sink_to_first_use(gm.graph)
    hoist_constants(gm.graph)
    saved = raise_returned(gm.graph)
    relint(gm)
    if moved:
        note("reorder for locality", [f"{moved} op(s)"], "moved", "each just before its first user")
    if saved:
        note("reorder for locality", [f"{saved} op(s)"], "moved", "read only by the output: just after its inputs")


def raise_returned(graph: fx.Graph) -> int:
    """Move every pure pointwise op and view that only the graph's output reads, directly or through other such ops
    (a value a training forward saves for the backward: LayerNorm's ``rsqrt(var + eps) / d``; a bias gradient's
    ``view`` and cast back to float32), up to just after its last input. Where it was, at the end of the graph, it
    ran alone (a library call of one op); next to its input it joins that input's region (stored by the LayerNorm
    kernel, one element per row), and its input is no longer kept alive until the end. Returns how many moved."""
    nodes = list(graph.nodes)
    returned: set[fx.Node] = set()
    for node in reversed(nodes):  # readers first: a chain is returned-only from its end
        if node.op == "call_function" and node.users and node.all_input_nodes and cheap_and_pure(node):
            if all(u.op == "output" or u in returned for u in node.users):
                returned.add(node)
    order = {n: i for i, n in enumerate(graph.nodes)}
    moved = 0
    for node in nodes:  # writers first: a chain moves in order, each after the one before it
        if node not in returned:
            continue
        last = max(node.all_input_nodes, key=order.__getitem__)
        if last.next is not node and last.op != "placeholder":
            last.append(node)
            moved += 1
            order = {n: i for i, n in enumerate(graph.nodes)}  # positions as they are now (a few moves a graph)
    return moved


def reductions_to_their_inputs(gm: fx.GraphModule, note: Callable[..., None]) -> None:
    """Pass ``raise_reductions``: :func:`raise_reductions`, after ``reorder`` has put each op before its reader."""
    raised = raise_reductions(gm.graph)
    relint(gm)
    if raised:
        note("raise reductions", [f"{raised} reduction(s)"], "moved", "just after the op computing their input")


def raise_reductions(graph: fx.Graph) -> int:
    """Move each reduction up to just after the op that computes its input, with the views between (a bias
    gradient's ``sum`` over the rows of a GELU's or LayerNorm's backward: AOTAutograd writes it after the two GEMMs
    that read the same gradient, and pass ``reorder`` sinks the gradient's ``view`` to the first GEMM, so a GEMM cut
    the sum from its producer and it ran alone, one library call). Only where that op is fusible (a kernel computes
    it) and a library call lies between; never past an op that writes a tensor or has side effects. Next to its
    input the sum joins the input's kernel, which sums what it stores. Returns how many moved."""
    moved = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in REDUCTIONS or len(node.all_input_nodes) != 1:
            continue
        chain, anchor = [], node.all_input_nodes[0]  # the views from the computed value to the reduction's input
        while (
            anchor.op == "call_function"
            and len(anchor.all_input_nodes) == 1
            and (
                is_view_node(anchor) or (anchor.target is prims.convert_element_type.default and len(anchor.users) == 1)
            )
        ):  # and a split reduction's upcast of its input (read by the reduction alone)
            chain.append(anchor)
            anchor = anchor.all_input_nodes[0]
        if anchor.op != "call_function" or cuts_run(anchor) or anchor.target in REDUCTIONS:
            continue  # (a reduction of a reduction, a split's stage 2, walks other rows: it stays with its readers)
        between, cur = [], anchor.next
        while cur is not node:
            between.append(cur)
            cur = cur.next
        if not any(cuts_run(n) for n in between) or any(writes_state(n) for n in between):
            continue  # no library call between (the regions take it where it is), or a write it must not cross
        at = anchor
        for n in [*reversed(chain), node]:  # each after the one it reads
            if n is not at.next:
                at.append(n)
            at = n
        moved += 1
    return moved


def cuts_run(node: fx.Node) -> bool:
    """Whether ``node`` ends a run of fusible ops (a GEMM, an attention call: an op neither pointwise, a view, a
    gather, a cat nor a reduction, that reads a value)."""
    if node.op != "call_function" or not node.all_input_nodes:
        return False
    fusible = node.target in REDUCTIONS or node.target in (aten.cat.default, operator.getitem)
    return not (fusible or cheap_and_pure(node))


def writes_state(node: fx.Node) -> bool:
    """Whether ``node`` is the output, impure, or an op that writes one of its arguments (nothing moves past it)."""
    target = node.target
    return (
        node.op == "output"
        or node.is_impure()
        or (isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable)
    )


def sink_to_first_use(graph: fx.Graph) -> int:
    """Move every pure pointwise op and view down to just before its first user, never up and never past an op with
    side effects (``copy_`` into an input: the value read would change). Walked from the end, so a chain follows
    its consumer. Returns how many moved. (Inductor's ``reorder_for_locality`` moves producers too, but towards
    consumers it has already placed, which can lift them to the top: its scheduler fuses by dependence, ours by
    adjacency.)"""
    moved = 0
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function" or not node.users or not cheap_and_pure(node):
            continue
        cur = node.next
        while cur not in node.users and cur.op != "output" and not cur.is_impure():
            cur = cur.next
        if cur in node.users and cur is not node.next:
            cur.prepend(node)
            moved += 1
    return moved


def cheap_and_pure(node: fx.Node) -> bool:
    """Whether ``node`` is a view, a gathered read, a ``cat`` or a deterministic pointwise op: what a generated
    kernel takes (a cat is its loads, one per piece)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable or node.is_impure():
        return False
    tags = target.tags  # an indexed read (an embedding, a gathered bias) is a load of the kernel that reads it
    return (
        target.is_view
        or target is aten.cat.default
        or is_gather(node)
        or (torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags)
    )


def hoist_constants(graph: fx.Graph) -> None:
    """One-element tensors made from nothing (``scalar_tensor(0.0)``: ReLU's backward has one per layer) go to the
    top of the graph, each distinct one once: a factory between two fusible ops would cut their run in two."""
    top = next((n for n in graph.nodes if n.op != "placeholder"), None)
    seen: dict[tuple, fx.Node] = {}
    for node in list(graph.nodes):
        val = node.meta.get("val")
        if node.op != "call_function" or node.all_input_nodes or not isinstance(val, torch.Tensor) or val.numel() > 1:
            continue
        if not isinstance(node.target, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded in node.target.tags:
            continue
        key = (node.target, repr(node.args), repr(sorted(node.kwargs.items())))
        returned = any(u.op == "output" for u in node.users)  # a graph output is the caller's own tensor: never shared
        if key in seen and not returned and not any(u.op == "output" for u in seen[key].users):
            node.replace_all_uses_with(seen[key])
            graph.erase_node(node)
        else:
            seen.setdefault(key, node)
            if node is not top:
                top.prepend(node)


# ----------------------------------------------------------------------------------------------------------------------
# Buffer updates in place, as eager


def reinplace_buffer_updates(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """Phase 9's pass ``reinplace``: a BatchNorm in training mode updates its running statistics in place, as eager.

    AOTAutograd's graph is functional: ``_native_batch_norm_legit_functional`` returns new statistics (outputs 3
    and 4) and ``copy_`` writes them into the buffers at the graph's end; ``num_batches_tracked`` is an ``add`` and
    a ``copy_``. That is three device copies per BatchNorm per step that eager never makes (ResNet-50: 159). Where
    the buffer is read by nothing else, the pair becomes the in-place op: ``_native_batch_norm_legit`` (writes
    ``running_mean`` and ``running_var`` itself), ``add_``. A backward that was handed the new statistics gets
    ``save_mean``/``save_invstd`` in their place: in training mode ``native_batch_norm_backward`` reads only those
    (handing it the buffer instead would fail autograd's version check after a second forward).
    Returns the number of updates rewritten."""
    users_ok = lambda buf, *mine: buf.op == "placeholder" and set(buf.users) == set(mine)  # noqa: E731
    done = 0
    for bn in list(gm.graph.find_nodes(op="call_function", target=aten._native_batch_norm_legit_functional.default)):
        outs = {u.args[1]: u for u in bn.users if u.target is operator.getitem}
        bufs = bn.args[3:5]
        copies = [next((c for c in outs[i].users if c.target is aten.copy_.default), None) if i in outs else None
                  for i in (3, 4)]  # fmt: skip
        if bn.args[5] is not True or not all(c is not None and c.args == (b, outs[i]) and users_ok(b, bn, c)
                   and all(u is c or u.op == "output" for u in outs[i].users)  # saved for the backward, at most
                   and _same_kind(outs[i].meta["val"], bn.meta["val"][i - 2])
                   for c, b, i in zip(copies, bufs, (3, 4), strict=True)):  # fmt: skip
            continue
        for c, i in zip(copies, (3, 4), strict=True):
            gm.graph.erase_node(c)
            if len(outs[i].users):  # saved for the backward: save_mean / save_invstd stand in (see the docstring)
                with gm.graph.inserting_after(outs[i]):
                    stand_in = gm.graph.call_function(operator.getitem, (bn, i - 2))
                stand_in.meta = dict(outs[i].meta, val=bn.meta["val"][i - 2])
                outs[i].replace_all_uses_with(stand_in)
            gm.graph.erase_node(outs[i])
        bn.target, bn.meta["val"] = aten._native_batch_norm_legit.default, tuple(bn.meta["val"][:3])
        done += 1
    for c in list(gm.graph.find_nodes(op="call_function", target=aten.copy_.default)):
        buf, add = c.args
        if c.users:  # the updated value is read (returned): the copy_ is the output, keep it
            continue
        if add.op == "call_function" and add.target is aten.add.Tensor and add.args[0] is buf and users_ok(buf, add, c):
            if len(add.users) == 1 and buf.meta["val"].dtype == add.meta["val"].dtype:
                gm.graph.erase_node(c)
                add.target = aten.add_.Tensor
                done += 1
    if done:
        relint(gm)
        note("reinplace", [f"{done} buffer update(s)"], "rewritten", "BatchNorm statistics updated in place, as eager")
    return done


def _same_kind(a: object, b: object) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and (a.shape, a.dtype) == (b.shape, b.dtype)


# ----------------------------------------------------------------------------------------------------------------------
# Common subexpressions and constants: work the graph repeats, or that no input changes


def eliminate_common_subexpressions(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """Phase 9's pass ``cse``: an op applied twice to the same inputs runs once, as AOTAutograd's ``fx_graph_cse``
    does on training graphs. Never merged: random ops, ops with side effects, two reads of a tensor with a write
    between them (each write starts a new region, as Inductor's mutation regions), a tensor an op writes in place,
    and anything the graph returns or views to return (the caller owns each output). HuggingFace's GPT-2 on a CPU
    turns its causal mask into an additive one in every layer: twelve ``where`` calls of the same mask, now one (on
    CUDA the attention rewrite converts each mask once already). Ours, not torch's: ``fx_graph_cse`` imports
    Inductor's pattern matcher, 1.6-2.4 s of the first compile in a process on our CPU machine. Returns how many
    nodes went."""
    escaping, written = _escaping(gm.graph), _written(gm.graph)
    seen: dict[tuple, fx.Node] = {}
    region = removed = 0
    for node in list(gm.graph.nodes):
        target = node.target
        if node.op != "call_function" or node in escaping or node in written:
            continue
        if isinstance(target, torch._ops.OpOverload):
            if target._schema.is_mutable or node.is_impure():
                region += 1  # a write (or an effect): reads after it may see other values
                continue
            if torch.Tag.nondeterministic_seeded in target.tags:
                continue
        elif target is not operator.getitem:
            continue  # a Python function: left alone
        key = (target, _frozen(node.args), _frozen(node.kwargs), region)
        try:
            first = seen.setdefault(key, node)
        except TypeError:  # an argument that cannot be hashed
            continue
        if first is not node:
            node.replace_all_uses_with(first)
            gm.graph.erase_node(node)
            removed += 1
    if removed:
        relint(gm)
        note("cse", [f"{removed} node(s)"], "merged", "the same op on the same inputs: computed once")
    return removed


def _frozen(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def _escaping(graph: fx.Graph) -> set[fx.Node]:
    """The nodes the graph returns, and every node they are views of (a returned view shares its base's memory)."""
    return _with_view_bases(graph.find_nodes(op="output")[0].all_input_nodes)


def _written(graph: fx.Graph) -> set[fx.Node]:
    """Every tensor an op of the graph writes in place (``copy_`` into a buffer: two ``empty`` buffers are two), or
    reads beside one it writes, and what they are views of."""
    mutating = (n for n in graph.nodes if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable)
    return _with_view_bases(a for n in mutating for a in n.all_input_nodes)


def _with_view_bases(nodes) -> set[fx.Node]:
    out = set(nodes)
    todo = list(out)
    while todo:
        node = todo.pop()
        if node.op == "call_function" and is_view_node(node) and node.args and isinstance(node.args[0], fx.Node):
            if node.args[0] not in out:
                out.add(node.args[0])
                todo.append(node.args[0])
    return out


FOLD_LIMIT_BYTES = 64 << 20  # at most this much memory held by one graph's folded constants


def fold_constants(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """Phase 9's pass ``constants``: every value computed from no graph input (an attention mask built from
    ``iota`` and the sequence length, a ``scalar_tensor``) is computed once, at compile time, and the graph reads
    the result (Inductor's ``ConstantFolder`` evaluates it). GPT-2's causal mask is ~25 library calls a call without
    it. A constant the graph returns (a training forward's saved mask: Swin-T's five shifted-window masks were 180
    library calls a step) is folded too and returned as a ``clone`` of the folded value, the caller's own tensor each
    call; a returned view stays a view of that copy. Not folded: a value an op writes into, itself or through a view
    (a constant must stay constant), random ops, and values beyond :data:`FOLD_LIMIT_BYTES` in all. Returns how many
    folded."""
    from torch._inductor.constant_folding import ConstantFolder, replace_node_with_constant
    from torch.utils._python_dispatch import _disable_current_modes

    written, escaping = _written(gm.graph), _escaping(gm.graph)
    returned = {n for n in escaping if not is_view_node(n)}  # folded as a copy each call (views of them stay views)

    class BoundedFolder(ConstantFolder):  # a value larger than the limit is never computed, even to be dropped
        def __init__(self, gm: fx.GraphModule) -> None:
            super().__init__(gm)
            self.returned: dict[fx.Node, torch.Tensor] = {}

        def run_node(self, node: fx.Node):
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and val.numel() * val.element_size() > FOLD_LIMIT_BYTES:
                return self.unknown_value
            return super().run_node(node)

        def add_node_replacement(self, node: fx.Node, tensor: torch.Tensor) -> None:
            super().add_node_replacement(node, tensor)
            if node in returned:  # kept though its users fold too (the folder then drops it: only views escape)
                self.returned[node] = tensor

    held, folded, copied = 0, [], []
    with _disable_current_modes(), torch.no_grad():  # real tensors: computed and read outside the fake mode
        folder = BoundedFolder(gm)
        folder.run()
        found = {**folder.returned, **folder.node_replacements}
        for node, value in found.items():
            if node.op != "call_function" or not isinstance(value, torch.Tensor) or node in written:
                continue
            if node in escaping and node not in returned:  # a returned view shares its base's memory: left as it is
                continue
            size = value.untyped_storage().nbytes()
            if held + size > FOLD_LIMIT_BYTES:
                note("constants", [node.name], "skipped", f"would hold over {FOLD_LIMIT_BYTES >> 20} MB of constants")
                continue
            held += size
            val, name = node.meta.get("val"), f"_folded_{node.name}"
            value = as_traced(value, val.stride()) if isinstance(val, torch.Tensor) else value  # as traced
            if node in returned:  # returned: a copy of the folded value each call, the caller's own (one call)
                _fold_returned(gm, node, value, name, escaping)
                copied.append(node.name)
            else:
                replace_node_with_constant(gm, node, value, name=name)
            folded.append(name)
        selects = _constant_selects(gm)
    if folded:
        gm.graph.eliminate_dead_code()
        read = {n.target for n in gm.graph.find_nodes(op="get_attr")}
        for name in folded:  # a folded condition whose selects all went: its tensor goes too
            if name not in read and hasattr(gm, name):
                delattr(gm, name)
        relint(gm)
        note("constants", [f"{len(folded)} value(s)"], "precomputed", "computed from no input: once, at compile time")
    if copied:
        note(
            "constants", copied, "returned", "a constant the graph returns: folded, and copied for the caller each call"
        )
    if selects:
        note("constants", selects, "dropped", "a where whose folded condition is the same everywhere: that branch")
    return len(folded)


def _fold_returned(gm: fx.GraphModule, node: fx.Node, value: torch.Tensor, name: str, escaping: set[fx.Node]) -> None:
    """``node``, a constant the graph returns (a training forward's saved mask, say): the graph's own readers read
    the folded value, as any constant's, and what is returned (the output, and the views on the way to it) reads
    ``clone`` of it, a tensor of the caller's own each call (clone keeps the traced strides of a dense value)."""
    graph = gm.graph
    gm.register_buffer(name, value)
    with graph.inserting_before(node):
        const = graph.get_attr(name)
        copy = graph.call_function(aten.clone.default, (const,))
    const.meta.update(node.meta)
    copy.meta.update(node.meta)
    on_the_way_out = {u for u in node.users if u.op == "output" or (u in escaping and is_view_node(u))}
    node.replace_all_uses_with(copy, delete_user_cb=on_the_way_out.__contains__)
    node.replace_all_uses_with(const)
    graph.erase_node(node)


def _constant_selects(gm: fx.GraphModule) -> list[str]:
    """``where(c, a, b)`` with ``c`` a folded constant that is all True is ``a`` (all False: ``b``) where that branch
    is a fresh tensor (computed in the graph, no view) of the result's shape, dtype and strides (the views after the
    select were traced on its layout) and neither it nor the select is returned, itself or through a view (the caller
    owns each output, and two outputs never share memory that eager's did not). The
    attention rewrite's ``where(attends, out, 0)`` per layer is such a select for a causal or an all-ones mask:
    every query attends to something. Returns the selects dropped."""
    dropped, escaping = [], _escaping(gm.graph)
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.where.self)):
        cond, val = node.args[0], node.meta.get("val")
        if not (isinstance(cond, fx.Node) and cond.op == "get_attr" and cond.target.startswith("_folded_")):
            continue
        c = getattr(gm, cond.target)
        if c.dtype != torch.bool or c.numel() == 0 or node in escaping:
            continue
        every = bool(c.all())
        if not (every or not c.any()):
            continue
        pick = node.args[1 if every else 2]
        pv = pick.meta.get("val") if isinstance(pick, fx.Node) else None
        # computed here (not an input or a constant, whose memory is not the select's to hand on), not a view, not
        # returned itself: the select's readers then share memory with nothing the caller gets
        fresh = isinstance(pick, fx.Node) and pick.op == "call_function" and pick not in escaping
        fresh = fresh and not is_view_node(pick, getitem=False)
        fresh = fresh and not (pick.target is operator.getitem and is_view_node(pick.args[0], getitem=False))
        if fresh and _same_tensor_meta(pv, val):  # no view: the views after the select were traced on its layout
            node.replace_all_uses_with(pick)
            gm.graph.erase_node(node)
            dropped.append(node.name)
    return dropped


def _same_tensor_meta(a: object, b: object) -> bool:
    return _same_kind(a, b) and (a.stride(), a.storage_offset()) == (b.stride(), b.storage_offset())
