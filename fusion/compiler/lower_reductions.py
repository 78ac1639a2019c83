"""The reductions of the device-neutral lowering (``fusion.compiler.lowering``): which rows a reduction kernel walks
(:func:`walk_rows`) and how each reduction folds one (:class:`Reductions`, the lowering's base class).

A reduction kernel walks rows: the region's reductions all reduce the same dims of one shape, every store is a whole
row or one element per row. The kept dims are the kernel's loops (in logical order), the reduced dims its reduce
loops, each element read at its real strides, so a reduction over trailing dims (softmax, LayerNorm) and one over
leading or middle dims (a bias gradient's ``sum([0, 1])``, Inductor's OUTER reductions) are the same record; the
renderer picks the loop order that reads memory contiguously (``fusion.kernels.c_render``).

Numerics as Phase 8's: sums start at +0.0 and accumulate half types in float32, max/min propagate NaN, a half result
is rounded once; ``any`` is the largest of ``x != 0`` as 0.0/1.0 (NaN counts as True), then ``> 0``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
import torch.fx as fx

from fusion.aten.nodes import bind_args, reduced_dims
from fusion.compiler.index_algebra import add, scale
from fusion.ir import kernel_ir as ir
from fusion.ir.plan import Unsupported
from fusion.kernels.rows import Rows, per_row_permutation, read_at_another_row, row_permutation, row_reshape

aten = torch.ops.aten
REDUCTIONS = {aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.amax.default, aten.amin.default}
REDUCTIONS |= {aten.var_mean.correction, aten.var.correction}
REDUCTIONS |= {aten.any.dim, aten.any.dims, aten.any.default}  # a masked softmax's "does the row keep any entry"
HALF = (torch.float16, torch.bfloat16)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def compute(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in HALF else dtype


def recombined(e: ir.Affine) -> ir.Affine:
    """``e`` with every ``m*k*(a // k) + m*(a % k)`` put back together as ``m*a``: a reshape's flat position split
    over one shape and merged again (a reduction kernel storing a reshape of its rows reads them back that way), so
    the row it reads is the loop's own row, recognisably, and computed once."""
    terms = {atom: c for c, atom in e.terms}
    for atom, c in terms.items():
        if isinstance(atom, ir.FloorDiv):
            mod = ir.Mod(
                ir.Affine(tuple((k, a) for k, a in atom.of.terms if k % atom.by), atom.of.const % atom.by), atom.by
            )
            if mod in terms and c == terms[mod] * atom.by:
                m = terms.pop(mod)
                del terms[atom]
                rest = ir.Affine(tuple((k, a) for a, k in terms.items()), e.const)
                return recombined(add(rest, scale(atom.of, m)))
    return e


def walk_rows(reductions: Sequence[fx.Node], stored: Sequence[fx.Node], members=()) -> Rows:
    """The rows of the region's reductions: every one must reduce the same dims of one shape, every store be a whole
    row, one element per row (with keepdim or not) or a transposed copy of it, a reshape of the rows (``row_reshape``)
    or, over trailing dims, a transposed copy of the rows
    (``row_permutation``: MultiheadAttention's ``x.transpose(0, 1)``), else :class:`Unsupported`. Any dims: a CPU loop reads any
    stride (the GPU's coalescing rules of ``Rows.of`` do not apply); the walk is the kept dims, then the reduced."""
    shape, reduced = reduced_dims(reductions[0])
    for r in reductions[1:]:
        its, dims = reduced_dims(r)
        if (its, dims) != (shape, reduced):
            raise Unsupported(f"{r.name} reduces dims {dims} of {its}, {reductions[0].name} dims {reduced} of "
                              f"{shape}: a kernel's reductions reduce the same dims of one shape", r)  # fmt: skip
    kept = [d for d in range(len(shape)) if d not in reduced]
    rows = Rows(shape, len(reduced), math.prod(shape[d] for d in reduced), 1, order=tuple(kept + reduced))
    reshaped = set()
    for n in stored:
        val = n.meta["val"]
        if not isinstance(val, torch.Tensor):
            raise Unsupported(f"{n.name} has several outputs read outside the region: stored by another kernel", n)
        trailing = reduced == list(range(len(kept), len(shape)))
        if tuple(val.shape) in (shape, *rows.per_row()):
            continue
        if row_reshape(n, shape, members, reductions):  # GPT-2's LayerNorm output as the next Linear's view(-1, d)
            reshaped.add(n.name)
        elif not ((trailing and row_permutation(n, shape)) or per_row_permutation(n, rows) is not None):
            raise Unsupported(f"{n.name} {tuple(val.shape)}: neither the rows {shape}, a reshape or a transposed copy "
                              "of them nor one element per row: stored by another kernel", n)  # fmt: skip
    return dataclasses.replace(rows, reshaped=frozenset(reshaped))


class Reductions:
    """The lowering's reductions (mixed into ``fusion.compiler.lowering.Lowering``, which provides ``op``, ``const``,
    ``cast``, ``operand`` and the state: ``rows``, ``index``, ``top``, ``block``, ``scopes``)."""

    def _in_loop(self, build) -> object:
        """Run ``build()`` emitting into a new :class:`ReduceLoop` at row level (appended when done)."""
        saved = self.block, self.scopes
        body: list = []
        self.block, self.scopes = body, [self.scopes[0], {}]
        try:
            result = build()
        finally:
            self.block, self.scopes = self.top, [saved[1][0]]
        self.top.append(ir.ReduceLoop(tuple(body)))
        self.block, self.scopes = saved
        return result

    def reduce(self, node: fx.Node, index: Sequence | None = None) -> tuple:
        """A row reduction, once per row: (name, dtype), or (var, mean) for var_mean. ``index``: where its value is
        read (one index per kept dim, or per dim with keepdim), which must be the row the loop reduces."""
        if not self.rows or node not in self.members:
            raise Unsupported(f"{node.name} ({node.target}) is not a row reduction of this kernel", node)
        if index is not None and [self.index[d] for d in self.rows.kept] != [
            recombined(i) for i in ([index[d] for d in self.rows.kept] if len(index) == len(self.shape) else index)
        ]:
            raise read_at_another_row(self.region, node, self.reductions)  # two kernels: one stores, one reads
        key = (node, "reduce")
        if key in self.scopes[0]:
            return self.scopes[0][key]
        val = node.meta["val"]
        out_dtype = (val[0] if isinstance(val, (tuple, list)) else val).dtype
        dt, target = compute(out_dtype), node.target
        if target.overloadpacket is not aten.any and not dt.is_floating_point:
            raise Unsupported(f"{node.name}: reductions to {dt} are not generated", node)
        n, row = self.rows.rnumel, self.index

        def fold(kind: str, values, dtype: torch.dtype = dt) -> str:
            out = self.new()
            self._in_loop(lambda: self.block.append(ir.Reduce(out, kind, values(), dtype_name(dtype))))
            return out

        saved = self.block, self.scopes
        self.block, self.scopes = self.top, [self.scopes[0]]  # the fold's result lives at row level
        try:
            x = lambda: self.operand(node.args[0], row, dt)  # noqa: E731
            if target.overloadpacket is aten.any:  # the largest (x != 0) as 0.0/1.0, NaN True; > 0 (an empty row: -inf)
                f32 = torch.float32
                flag = fold("max", lambda: self.cast(self.operand(node.args[0], row, torch.bool), torch.bool, f32), f32)
                result = (self.op("gt", [flag, self.const(0.0, f32)], torch.bool), torch.bool)
                self.scopes[0][key] = result
                return result
            if target in (aten.amax.default, aten.amin.default):
                out = fold("max" if target is aten.amax.default else "min", x)
            else:
                out = fold("sum", x)
                if target.overloadpacket is not aten.sum:
                    out = self.op("exact_div", [out, self.const(float(n), dt)], dt)  # n equal values: the value
            if target.overloadpacket in (aten.var_mean, aten.var):
                mean, corr = out, bind_args(node).get("correction")

                def squares() -> str:
                    c = self.op("sub", [x(), mean], dt)
                    return self.op("mul", [c, c], dt)

                sq = fold("sum", squares)
                var_ = self.op("exact_div", [sq, self.const(float(max(n - (1 if corr is None else corr), 0)), dt)], dt)
                out = (var_, mean) if target is aten.var_mean.correction else var_
            outs = out if isinstance(out, tuple) else (out,)
            if out_dtype in HALF:
                outs = tuple(self.op(f"round_{dtype_name(out_dtype)}", [o], dt) for o in outs)
            result = tuple((o, dt) for o in outs)
            result = result if isinstance(out, tuple) else result[0]
        finally:
            self.block, self.scopes = saved
        self.scopes[0][key] = result
        return result
