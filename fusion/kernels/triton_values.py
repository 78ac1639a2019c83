"""How the code generator's ``KernelWriter`` (Phase 8, ``fusion.codegen``) holds values: each line it emits, the
cached tmp of each (node, index), an operand converted as eager converts it, a load's pointer and mask. Machinery:
the lesson's ``KernelWriter`` subclasses :class:`ValueWriter` and writes the ops (``_compute``), the reductions and
the stores; a learner reads ``fusion/codegen.py``.

Two rules of eager's numerics live here. **One rounding per value**: eager holds every float16/bfloat16 value
rounded to its dtype; the kernel computes in float32 and rounds a value only where an op needs eager's number (a
reduction, a comparison, a cast, an op of a wider dtype). Such a value is rounded once, where it is computed, so
every reader sees the same number (``rounded``; ``generate_kernel`` writes a kernel again when its first pass finds
such reads in ``exact_reads``). **0-d operands**: a float32 operand of a float16 op is rounded first, except a 0-d one
that eager reads at float32 (``fusion.aten.precision`` asks eager which).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from fusion.aten import precision
from fusion.aten.nodes import is_view_node as is_view
from fusion.ir.plan import Unsupported
from fusion.kernels import triton_blocks as blocks
from fusion.kernels import triton_lang as tlang
from fusion.kernels.triton_lang import const_source


class ValueWriter:
    """The value plumbing of a kernel writer. A subclass sets ``region``, ``members``, ``body``, ``cache``, ``depth``,
    ``guards``, ``rows``, ``index``, ``row``, ``lanes``, ``flat``, ``bf16`` and ``inputs`` (see
    ``KernelWriter.__init__``), calls :meth:`start_values`, and defines ``_compute(node, index)``,
    ``broadcast_index(index, shape)`` and ``offset_expr(index, strides)``."""

    def start_values(self, rounded: frozenset[fx.Node]) -> None:
        """``rounded``: members held rounded to their half dtype where computed; ``reading``: the ops being computed."""
        self.rounded, self.exact_reads, self.reading = rounded, set(), []

    def emit(self, expr: str, dtype: torch.dtype, node: fx.Node | None = None) -> tuple[str, torch.dtype]:
        """Append ``tmp<i> = expr`` (computing ``node``, if any); returns (tmp, dtype)."""
        expr = self.bf16.reuse(expr)  # a bfloat16 (a load, a rounding) rounded again is itself: no ALU spent
        self.body.append(tlang.Line(tmp := f"tmp{len(self.body)}", expr, dtype, node, self.depth))
        self.bf16.note(tmp, expr, loaded=node is not None and node not in self.members and node.meta["val"].dtype)
        return tmp, dtype

    def address(self, ptr: str, offset: str) -> tuple[str, str | None]:
        """(pointer, mask) for tl.load/tl.store: masked where the offset moves with the lanes."""
        down = self.rows and any(v in offset for v in self.row if v != "0")
        guard = "".join(f" & {g}" for g, at in self.guards if any(s in offset for s in at))  # cat input, window tap
        if any(v in offset for v in self.lanes if v != "0"):
            offset = self.flat[1] if offset in self.flat[0] else offset
            return f"{ptr} + ({offset})", (("xmask & rmask" if down else "rmask") if self.rows else "xmask") + guard
        if down:
            return f"{ptr} + ({offset})", "xmask" + guard  # one element per row: a column of XBLOCK
        return f"{ptr} + ({offset}) + 0 * xindex", "xmask" + guard  # one element in every lane: a vector

    def value(self, node: object, index: list[str]) -> tuple[str, torch.dtype]:
        """Source for ``node``'s element at ``index`` (one index expression per dimension of ``node``)."""
        if not isinstance(node, fx.Node):
            return const_source(node), torch.float64 if isinstance(node, float) else torch.int64
        compute = machinery_rule(node, self.members) or blocks.rule(node, self.members) or type(self)._compute
        key = (node, tuple(index))  # (a rule: rand, fma, cat, max-pool; else the lesson's _compute)
        if key not in self.cache:
            self.reading.append(node)
            try:
                value = compute(self, node, list(index))
            except Unsupported as e:  # remember the op that failed: compile_graph cuts the region there
                e.node = e.node or node
                raise
            finally:
                self.reading.pop()
            if node in self.rounded:  # held rounded to its dtype, as eager holds it, for every reader
                value = self.emit(tlang.cast(value[0], value[1], node.meta["val"].dtype), value[1])
            self.cache[key] = value
        return self.cache[key]

    def _base(self, node: fx.Node) -> fx.Node:
        """The member whose numbers a view member shows (a view rounds nothing: its base is what gets rounded)."""
        while is_view(node, getitem=False) and isinstance(src := node.args[0], fx.Node) and src in self.members:
            node = src
        return node

    def operand(self, arg: object, index: list[str], dtype: torch.dtype, exact: bool = False, op_dtype=None) -> str:
        """``arg`` (a node or a Python scalar) read at ``index`` broadcast to its shape, converted to ``dtype``.
        ``exact``: a computed half/bf16 value rounded to its dtype first, as eager holds it (before a comparison or an
        integer cast). ``op_dtype``: torch converts a tensor operand to the op's dtype first (a float32 operand of a
        float16 op is rounded), except a 0-d operand that eager reads at float32 (``x * torch.tensor(65536.)``)."""
        if not isinstance(arg, fx.Node):
            return tlang.constant(arg, dtype)
        val = arg.meta["val"]
        src, dt = self.value(arg, self.broadcast_index(index, val.shape))
        wider = op_dtype not in (None, torch.float16, torch.bfloat16)  # eager rounded it before promoting it
        if (exact or wider) and arg in self.members and val.dtype in (torch.float16, torch.bfloat16):
            self.exact_reads.add(base := self._base(arg))
            if base not in self.rounded:  # (a first pass: generate_kernel rounds it where it is computed)
                src, dt = self.emit(tlang.cast(src, dt, val.dtype), dt)
        if op_dtype in (torch.float16, torch.bfloat16) and val.dtype not in (op_dtype, torch.bool):
            if not self._zero_dim_at_op_math(arg, op_dtype):
                src, dt = self.emit(tlang.cast(src, dt, op_dtype), torch.float32)
        return src if dt == dtype else self.emit(tlang.cast(src, dt, dtype), dtype)[0]

    def _zero_dim_at_op_math(self, arg: fx.Node, op_dtype: torch.dtype) -> bool:
        """Does eager read 0-d float ``arg`` of the op being computed at float32 rather than at ``op_dtype``?"""
        val, op = arg.meta["val"], self.reading[-1] if self.reading else None
        if val.dim() != 0 or not val.dtype.is_floating_point or op is None or op.op != "call_function":
            return False
        tensors = [a for a in op.args if isinstance(a, fx.Node)]
        if (
            not hasattr(op.target, "overloadpacket")
            or len(op.args) != 2
            or len(tensors) != 2
            or tensors[0] is tensors[1]
        ):
            return False
        position = op.args.index(arg)
        return precision.zero_dim_at_op_math(
            op.target.overloadpacket, position, 2, op_dtype, val.dtype, val.device.type
        )


# ----------------------------------------------------------------------------------------------------------------------
# Ops generated by machinery, outside the learner's table (``pointwise_expr``): Philox random numbers and fma


def machinery_rule(node: fx.Node, members) -> object:
    """The function computing member ``node`` when it is ``fusion.philox_rand`` or ``prims.fma``, else None."""
    if node not in members or node.op != "call_function":
        return None
    if tlang.is_philox_rand(node):
        return philox_rand
    return fma if tlang.is_fma(node) else None


def philox_rand(w: ValueWriter, node: fx.Node, index: list[str]) -> tuple[str, torch.dtype]:
    """``tl.rand(seed, position)`` (as ``_philox_rand``): Philox4x32-10 keyed by the seed this call drew
    (``fusion.compiler.random_ops``), counter the element's position in the contiguous tensor, whatever order the
    kernel walks it in. The seed is one int64 element: an input read as one scalar (``reinterpret`` of the seeds:
    the same source for every dropout of a shape), or a member (a slice of seeds in the region) read at index 0."""
    seed_node, size = node.args
    if isinstance(seed_node, fx.Node) and seed_node not in w.members:
        ptr = w.inputs.setdefault(seed_node, f"in_ptr{len(w.inputs)}")
        seed = w.emit(f"tl.load({ptr})", torch.int64)[0]  # one scalar
    else:
        seed = w.value(seed_node, ["0"] * seed_node.meta["val"].dim())[0]
    shape = tuple(int(s) for s in size)
    at = w.offset_expr(w.broadcast_index(index, shape), tlang.contiguous_strides(shape))
    if at.isdigit():  # one position for every lane (a size-1 tensor): a block of it
        at = f"tl.full([1], {at}, tl.int32)"
    return w.emit(f"_philox_rand({seed}, {at})", torch.float32, node)  # tl.rand's bits (triton_lang.RAND_FUNCTION)


def fma(w: ValueWriter, node: fx.Node, index: list[str]) -> tuple[str, torch.dtype]:
    """``prims.fma(a, b, c)``: ``a * b + c`` rounded once (``tl.fma``), as Inductor's ``fma``."""
    val = node.meta["val"]
    ct = tlang.compute_dtype(val.dtype)
    if not ct.is_floating_point:
        raise Unsupported(f"{node.name}: fma of {val.dtype} is not generated", node)
    ops = [w.operand(a, index, ct, op_dtype=val.dtype) for a in node.args[:3]]  # three tensors (its schema)
    return w.emit(f"tl.fma({', '.join(ops)})", ct, node)
