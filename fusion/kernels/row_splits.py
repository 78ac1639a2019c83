"""Where a region is cut in two kernels: a row region's store that does not fit its walk (a second kernel writes
it), reductions that walk different rows (:func:`split_by_reductions`, one kernel per walk), and pointwise outputs
that do not broadcast together (:func:`split_by_shape`), and, in C, a small table of transcendental values that
the kernel's loop would compute again for every element it is broadcast to (:func:`split_repeated_tables`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node, reduced_dims
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


def split_by_shape(region, stored: Sequence[fx.Node]) -> SplitRegion:
    """Where to cut a pointwise region whose outputs do not broadcast together: before the first output (in graph
    order) whose shape does not broadcast with those before it. The first output stays on the first side, so each
    side is smaller than the region."""
    position = {n: i for i, n in enumerate(region.nodes)}
    ordered, shape, first, misfit = sorted(stored, key=position.__getitem__), (), [], None
    for n in ordered:
        try:
            shape = torch.broadcast_shapes(shape, tuple(n.meta["val"].shape))
            first.append(n)
        except RuntimeError:
            misfit = misfit or n
    assert misfit is not None, "the outputs broadcast together"
    return SplitRegion(
        f"{misfit.name} {tuple(misfit.meta['val'].shape)} does not broadcast with {shape}", misfit, first
    )


def _within(region, starts: Sequence[fx.Node], neighbours) -> set[fx.Node]:
    """The members of ``region`` reached from ``starts`` (included) through ``neighbours(node)``: its inputs (what
    computes them) or its users (what they reach)."""
    seen, stack = set(), list(starts)
    while stack:
        n = stack.pop()
        if n not in seen and n in region.members:
            seen.add(n)
            stack += neighbours(n)
    return seen


# ops a CPU computes in tens of cycles an element (libm or our polynomials): worth a kernel of their own when repeated
TRANSCENDENTAL = frozenset(
    getattr(torch.ops.aten, name).default
    for name in ("sin", "cos", "tan", "exp", "exp2", "expm1", "log", "log1p", "log2", "tanh", "erf", "sigmoid", "atan")
)
REPEATS = 4  # a table computed this many times over, or more, is split off


def split_repeated_tables(region, stored: Sequence[fx.Node]) -> SplitRegion | None:
    """A pointwise C kernel's loop runs over its largest output; a stored output broadcast ``REPEATS`` times or more
    across it (Llama's rotary sin and cos tables, (s, d), beside the rotated keys, (b, heads, s, d)) is computed again
    at every repeat, and a ``sin`` costs tens of cycles on a CPU: 188 against 85 us for the layer's kernel at the CPU
    sizes. Split it off: its own kernel computes the table once, the rest reads it. Only where the table's
    computation holds a transcendental op (else recomputing is cheaper than a launch); None otherwise. On a GPU the
    repeats are spare compute under the memory traffic: not asked there."""
    numel = {n: n.meta["val"].numel() for n in stored}
    largest = max(numel.values(), default=0)

    computed = {  # what computes each output repeated often enough, in the region
        n: _within(region, [n], lambda m: m.all_input_nodes)
        for n in stored
        if numel[n] and largest >= REPEATS * numel[n]
    }
    tables = [n for n, need in computed.items() if any(a.target in TRANSCENDENTAL for a in need)]
    if not tables:
        return None
    need = set().union(*(computed[t] for t in tables))
    first = [n for n in stored if n in need]  # every table (sin and cos: one kernel), and what they compute anyway
    table = tables[0]
    return SplitRegion(
        f"{table.name} {tuple(table.meta['val'].shape)} is a table of sin/exp-like values the kernel's loop would "
        f"compute {largest // numel[table]} times over: its own kernel",
        table,
        first,
    )


def split_by_reductions(region, reductions: Sequence[fx.Node], stored: Sequence[fx.Node]) -> SplitRegion | None:
    """Where to cut a region whose reductions walk different rows (LayerNorm's backward: the input gradient's sums
    over the last dim, the weight and bias gradients' sums over the leading ones), or None when they all reduce the
    same dims of one shape. The first kernel stores the outputs that need no reduction walking other rows than the
    region's first; the rest is cut again in turn, so each walk gets a kernel and nothing runs as aten. (Inductor's
    mix-order reduction computes both walks in one kernel; not done here.)"""

    walk = reduced_dims(reductions[0])
    others = [r for r in reductions if reduced_dims(r) != walk]
    if not others:
        return None

    def reached(starts: list[fx.Node]) -> set[fx.Node]:  # what these reductions' values reach inside the region
        return _within(region, starts, lambda n: n.users)

    shape, dims = reduced_dims(others[0])
    why = (f"{others[0].name} reduces dims {dims} of {shape}, {reductions[0].name} dims {walk[1]} of {walk[0]}: "
           "one kernel per walk")  # fmt: skip
    # First the outputs that need none of the first walk's reductions (LayerNorm's backward: the weight and bias
    # gradients' column sums, with what they read, before the row sums of the input gradient), else those that need
    # none of the other walks' (a column sum of a LayerNorm's output: the LayerNorm first).
    # A first side must reduce something: one that only computes a value both walks read (a split LayerNorm
    # gradient's cast of a GEMM output, stored for the row sums) would be a kernel of one op, left to aten.
    for starts in ([r for r in reductions if r not in others], others):
        first = [n for n in stored if n not in reached(starts)]
        if 0 < len(first) < len(stored) and _reduces(region, first, reductions):
            return SplitRegion(why, others[0], first)
    # Else everything the other walks do not depend on, with what they read of it (a split reduction's two stages:
    # every stage-1 reduction in the first kernel, every stage 2 in the second).
    down = reached(others)
    first = [n for n in region.nodes if n not in down and (n in stored or any(u in down for u in n.users))]
    if first and _reduces(region, first, reductions):
        return SplitRegion(why, others[0], first)
    return SplitRegion(why, others[0], [])  # every output needs both walks: cut just before the other walk


def _reduces(region, outputs: Sequence[fx.Node], reductions: Sequence[fx.Node]) -> bool:
    """Does computing ``outputs`` inside ``region`` take one of ``reductions`` (one of them, or an ancestor)?"""
    seen, stack, reductions = set(), list(outputs), set(reductions)
    while stack:
        n = stack.pop()
        if n in seen or n not in region.members:
            continue
        seen.add(n)
        if n in reductions:
            return True
        stack += n.all_input_nodes
    return False
