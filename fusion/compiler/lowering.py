"""The device-neutral lowering: one fusion region (Phase 6's) -> a kernel IR record, which each target renders.

    FusionRegion ──lower_region──▶ kernel_ir.Kernel ──a renderer (kernels/triton_render.py, kernels/c_render.py)──▶ source

What it takes is decided by the checks code generation runs first (``fusion.compiler.generate.check``:
``rows.check_region``, ``stored_members``): pointwise regions (views, broadcasting, strides, casts, a cat), and reductions over the same
dims of one shape, trailing or not (sum, mean, amax, amin, var, var_mean, any: softmax, a masked softmax, LayerNorm,
a bias gradient's ``sum([0, 1])``; ``fusion.compiler.lower_reductions``), and windows (a max-pool's values, a
depthwise convolution: their taps unrolled as guarded loads, ``fusion.compiler.lower_windows``). Anything else
raises :class:`Unsupported` with the reason, and the region is cut there (that op runs as aten).

The numerics are Phase 8's rules:

* half and bfloat16 values are computed in float32; every value of such a dtype is rounded to it once, where it is
  computed (``round_float16``/``round_bfloat16``), so every reader sees eager's number;
* an operand is converted to the op's dtype first, as torch converts it; a 0-d float operand of a half op is read at
  the precision ``fusion.aten.precision`` says eager reads it;
* sums start at +0.0 and accumulate half types in float32; max/min propagate NaN (the renderer's ``Reduce``);
* a Python scalar operand is used at the op's compute dtype (compared at the promoted dtype, rounded to it).

Index arithmetic is exact integer algebra on :class:`~fusion.ir.kernel_ir.Affine` expressions
(``fusion.compiler.index_algebra``): a reshape splits a flat position with ``//`` and ``%``, cancelled wherever the
loop ranges prove it (a contiguous reshape costs nothing).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch
import torch.fx as fx

from fusion.aten import precision
from fusion.aten.nodes import bind_args
from fusion.aten.nodes import is_view_node as is_view
from fusion.compiler.index_algebra import broadcast, const, offset, split, substitute, var, view_index
from fusion.compiler.lower_gathers import gathered
from fusion.compiler.lower_reductions import HALF, REDUCTIONS, Reductions, compute, dtype_name, recombined, walk_rows
from fusion.compiler.lower_windows import window
from fusion.ir import kernel_ir as ir
from fusion.ir.plan import Unsupported
from fusion.kernels import rows as krows
from fusion.kernels import triton_lang as tlang
from fusion.kernels.rows import cat_parts, per_row_permutation, row_permutation
from fusion.kernels.window_rules import is_window

aten, prims = torch.ops.aten, torch.ops.prims
UNARY = {aten.neg: "neg", aten.abs: "abs", aten.exp: "exp", aten.log: "log", aten.sqrt: "sqrt", aten.rsqrt: "rsqrt",
         aten.sigmoid: "sigmoid", aten.erf: "erf", aten.tanh: "tanh", aten.reciprocal: "reciprocal", aten.relu: "relu",
         aten.logical_not: "logical_not", aten.clone: "identity", aten.alias: "identity", aten.ceil: "ceil",
         aten.floor: "floor", aten.trunc: "trunc", aten.sign: "sign", aten.sin: "sin", aten.cos: "cos"}  # fmt: skip
BINARY = {aten.mul: "mul", aten.maximum: "maximum", aten.minimum: "minimum", aten.remainder: "remainder",
          aten.floor_divide: "floordiv", aten.bitwise_and: "bitwise_and",
          aten.bitwise_or: "bitwise_or"}  # fmt: skip
COMPARISONS = {aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt", aten.ge: "ge"}
LOGICAL = {aten.add: "or", aten.mul: "and", aten.maximum: "or", aten.minimum: "and"}  # on bools


# ----------------------------------------------------------------------------------------------------------------------
# The lowering


class Lowering(Reductions):
    """Builds one :class:`~fusion.ir.kernel_ir.Kernel` from a region (see the module's docstring)."""

    def __init__(self, region, stored: Sequence[fx.Node] | None = None):
        self.region, self.members = region, region.members
        self.stored = list(stored) if stored is not None else krows.stored_members(region)
        krows.check_region(region, self.stored, REDUCTIONS)
        self.inputs: list[fx.Node] = []  # external inputs in order of first use: the kernel's in0, in1, ...
        self.reductions = [n for n in region.nodes if n.op == "call_function" and n.target in REDUCTIONS]
        self.top: list = []
        self.block, self.scopes, self.reading, self.count = self.top, [{}], [], 0
        self.guards: list[str] = []  # masks of the loads emitted now (a cat input's range, a tap's), innermost last
        self.safe: dict[str, frozenset] = {}  # a tap's mask -> the index parts it need not guard (lower_windows)
        self.trace: list | None = None  # where a window counts what a tap computes again (lower_windows)
        self.rebased: dict[str, ir.Affine] = {}  # a cat input's own index variable -> its loops' (concatenation)
        if self.reductions:
            self.rows = walk_rows(self.reductions, self.stored, self.members)  # kept dims, then reduced (any dims)
            self.shape, self.nrow = self.rows.shape, len(self.rows.kept)
            names = [f"x{d}" if d in self.rows.kept else f"r{d}" for d in range(len(self.shape))]
            order = self.rows.walk_dims
        else:
            self.rows, self.nrow = None, 0
            try:
                self.shape = tuple(torch.broadcast_shapes(*(tuple(n.meta["val"].shape) for n in self.stored)))
            except RuntimeError as e:
                raise Unsupported(f"the region's outputs do not broadcast together ({e})") from e
            names = [f"x{d}" for d in range(len(self.shape))]
            order = tlang.memory_order(self.stored[0].meta["val"], self.shape)  # walk the output's memory order
        self.index = tuple(const(0) if s == 1 else var(v) for v, s in zip(names, self.shape, strict=True))
        self.sizes = {v: s for v, s in zip(names, self.shape, strict=True)}
        walk = [ir.Loop(names[d], self.shape[d]) for d in order if self.shape[d] != 1]
        self.loops = tuple(lp for lp in walk if lp.var[0] == "x")
        self.reduce_loops = tuple(lp for lp in walk if lp.var[0] == "r")

    # -- statements ----------------------------------------------------------------------------------------------------

    def new(self) -> str:
        self.count += 1
        return f"t{self.count - 1}"

    def op(self, name: str, args: Sequence[str], dtype: torch.dtype) -> str:
        out = self.new()
        self.block.append(ir.Op(out, name, tuple(args), dtype_name(dtype)))
        return out

    def const(self, value: object, dtype: torch.dtype) -> str:
        """A Python scalar at ``dtype`` as torch would use it: an integer must fit (torch wraps it: refused)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if not isinstance(value, bool):
                raise Unsupported(f"argument {value!r} of type {type(value).__name__} is not a scalar")
        elif not dtype.is_floating_point and dtype != torch.bool:
            if isinstance(value, float):
                raise Unsupported(f"float constant {value!r} in an op computed in {dtype}")
            info = torch.iinfo(dtype)
            if not info.min <= value <= info.max:
                raise Unsupported(f"constant {value} does not fit {dtype} (torch wraps it around)")
        if dtype.is_floating_point:
            value = float(value)
        elif dtype == torch.bool:
            value = bool(value)
        else:
            value = int(value)
        key = ("const", type(value), repr(value), dtype)  # repr: -0.0 == 0.0 in Python, but x / -0.0 is -inf
        if key not in self.scopes[0]:
            out = self.new()
            self.top.insert(0, ir.Const(out, value, dtype_name(dtype)))  # a constant is defined before everything
            self.scopes[0][key] = out
        return self.scopes[0][key]

    def cast(self, x: str, src: torch.dtype, dst: torch.dtype) -> str:
        """``x`` (held at compute dtype ``src``) converted to ``dst`` with torch's rules, held at ``compute(dst)``."""
        if dst == torch.bool:
            return x if src == torch.bool else self.op("to", [x], torch.bool)
        if dst in HALF:
            x32 = x if src == torch.float32 else self.op("to", [x], torch.float32)
            return self.op(f"round_{dtype_name(dst)}", [x32], torch.float32)
        if src == dst:
            return x
        if src.is_floating_point and not dst.is_floating_point and dst != torch.int64:
            x = self.op("to", [x], torch.int64)
        return self.op("to", [x], dst)

    # -- values --------------------------------------------------------------------------------------------------------

    def value(self, node: fx.Node, index: Sequence[ir.Affine]) -> tuple[str, torch.dtype]:
        """(name, compute dtype) of ``node``'s element at ``index``, computed once per index and scope."""
        index = [recombined(i) for i in index]  # a reshape split and merged again: the index it was
        guards = self.guards_at(index)
        key = (node, tuple(index), guards)  # a value under a mask is not the unmasked one
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        self.reading.append(node)
        outer, self.guards = self.guards, list(guards)
        try:
            out = self._compute(node, list(index))
        except Unsupported as e:
            e.node = e.node or node
            raise
        finally:
            self.reading.pop()
            self.guards = outer
        if self.trace is not None:
            self.trace.append(node)
        self.scopes[-1][key] = out
        return out

    def real(self, e: ir.Affine) -> ir.Affine:
        """``e`` in the kernel's loop variables: a cat input's own index variable replaced by what it stands for."""
        return substitute(e, self.rebased) if self.rebased else e

    def index_value(self, e: ir.Affine) -> str:
        """A new value holding index ``e`` (in the loops' variables: what every statement of the IR is written in)."""
        at = self.new()
        self.block.append(ir.Index(at, self.real(e)))
        return at

    def guards_at(self, index: Sequence[ir.Affine]) -> tuple[str, ...]:
        """The masks a value at ``index`` is read under: a window tap's is dropped where every part of the index is
        a constant or the window's own leading index (a per-channel parameter: inside whatever the tap)."""
        n, safe = len(self.guards), self.safe
        while n and self.guards[n - 1] in safe and all(not i.terms or i in safe[self.guards[n - 1]] for i in index):
            n -= 1
        return tuple(self.guards[:n])

    def operand(self, arg: object, index, dtype: torch.dtype, op_dtype: torch.dtype | None = None) -> str:
        """``arg`` (a node or a scalar) read at ``index`` broadcast to its shape, as torch converts it for an op of
        ``op_dtype``, then held at ``dtype``."""
        if not isinstance(arg, fx.Node):
            return self.const(arg, dtype)
        val = arg.meta["val"]
        src, dt = self.value(arg, broadcast(index, val.shape))
        if (
            op_dtype in HALF
            and val.dtype not in (op_dtype, torch.bool)
            and not self._zero_dim_at_op_math(arg, op_dtype)
        ):
            src = self.cast(src, dt, op_dtype)  # a float32 operand of a half op: rounded to it first, as eager does
            dt = torch.float32
        return src if dt == dtype else self.cast(src, dt, dtype)

    def _zero_dim_at_op_math(self, arg: fx.Node, op_dtype: torch.dtype) -> bool:
        val, op = arg.meta["val"], self.reading[-1] if self.reading else None
        if val.dim() != 0 or not val.dtype.is_floating_point or op is None or not hasattr(op.target, "overloadpacket"):
            return False
        tensors = [a for a in op.args if isinstance(a, fx.Node)]
        if len(op.args) != 2 or len(tensors) != 2 or tensors[0] is tensors[1]:
            return False
        return precision.zero_dim_at_op_math(
            op.target.overloadpacket, op.args.index(arg), 2, op_dtype, val.dtype, val.device.type
        )

    def load(self, node: fx.Node, at: ir.Affine, indirect: tuple = ()) -> tuple[str, torch.dtype]:
        """(name, compute dtype) of one load of kernel input ``node`` (its buffer ``in<k>``: inputs in order of first
        use) at offset ``at`` (plus ``indirect``'s computed terms: ``lower_gathers``), under the innermost guard."""
        if node not in self.inputs:
            self.inputs.append(node)
        out, ct = self.new(), compute(node.meta["val"].dtype)
        mask = self.guards[-1] if self.guards else None
        self.block.append(ir.Load(out, f"in{self.inputs.index(node)}", at, dtype_name(ct), mask, indirect))
        return out, ct

    def _compute(self, node: fx.Node, index: list[ir.Affine]) -> tuple[str, torch.dtype]:
        val = node.meta.get("val")
        if node not in self.members:  # an external input
            if not isinstance(val, torch.Tensor):
                raise Unsupported(f"input {node.name} is not a tensor ({type(val).__name__})")
            return self.load(node, self.real(recombined(offset(index, val.stride()))))
        if is_window(node):  # a max-pool's values, a depthwise convolution: fusion.compiler.lower_windows
            return window(self, node, index)
        if krows.is_gather(node):  # embedding, index, index_select, gather: fusion.compiler.lower_gathers
            return gathered(self, node, index)
        if node.target is operator.getitem:
            return self.reduce(node.args[0], index)[node.args[1]]
        if is_view(node):
            return self.value(node.args[0], view_index(node, index, self.sizes))
        if node.target in REDUCTIONS:
            return self.reduce(node, index)
        if node.target is krows.CAT:
            return self.concatenation(node, index), compute(val.dtype)
        if node.target is prims.convert_element_type.default:
            src_dtype = compute(node.args[0].meta["val"].dtype)
            src = self.operand(node.args[0], index, src_dtype)
            return self.cast(src, src_dtype, val.dtype), compute(val.dtype)
        out = self.pointwise(node, index, val.dtype)
        if val.dtype in HALF:  # eager holds the value rounded to its dtype: once, here, for every reader
            out = self.op(f"round_{dtype_name(val.dtype)}", [out], torch.float32)
        return out, compute(val.dtype)

    def concatenation(self, node: fx.Node, index: list[ir.Affine]) -> str:
        """``cat(tensors, dim)`` at ``index``: each input owns a range [lo, hi) along ``dim`` and is read at
        ``index[dim] - lo`` with its loads masked to that range (never outside its bounds); ``where`` picks."""
        val = node.meta["val"]
        dim, dtype = bind_args(node).get("dim", 0) % val.dim(), compute(val.dtype)
        parts = cat_parts(node, dim)
        i = index[dim]

        def shifted(lo: int, hi: int) -> list[ir.Affine]:
            """The input's index: ``index[dim] - lo``. In a pointwise kernel where that is one loop variable ``v``
            plus a constant, it is a variable of its own, ranging over [0, hi - lo) as the input's mask ensures
            (``v - lo`` otherwise ranges over the loop's whole [0, size) and below: its views' ``//`` and ``%``
            could not cancel; a rotary embedding's halves are slices of a reshaped GEMM output)."""
            k, v = i.terms[0] if len(i.terms) == 1 else (0, None)
            if self.rows is None and k == 1 and isinstance(v, ir.Var):
                own = f"{v.name}_{node.name}_{lo}"
                self.sizes[own], self.rebased[own] = hi - lo, self.real(ir.Affine(((1, v),), i.const - lo))
                return [var(own) if d == dim else j for d, j in enumerate(index)]
            return [ir.Affine(i.terms, i.const - lo) if d == dim else j for d, j in enumerate(index)]

        if not i.terms or len(parts) == 1:  # a constant index (a select of the cat) or one input: no select
            t, lo, hi = next(p for p in parts if p[1] <= i.const < p[2]) if not i.terms else parts[0]
            return self.operand(t, shifted(lo, hi), dtype, op_dtype=val.dtype)
        at = self.index_value(i)
        picks = []
        for k, (t, lo, hi) in enumerate(parts):
            bounds = [("ge", lo)] if k else []
            bounds += [("lt", hi)] if k < len(parts) - 1 else []
            conds = [self.op(cmp, [at, self.const(b, torch.int64)], torch.bool) for cmp, b in bounds]
            inside = conds[0] if len(conds) == 1 else self.op("and", conds, torch.bool)
            mask = self.op("and", [self.guards[-1], inside], torch.bool) if self.guards else inside
            self.guards.append(mask)
            try:
                picks.append((inside, self.operand(t, shifted(lo, hi), dtype, op_dtype=val.dtype)))
            finally:
                self.guards.pop()
        out = picks[-1][1]
        for inside, v in reversed(picks[:-1]):
            out = self.op("where", [inside, v, out], dtype)
        return out

    def pointwise(self, node: fx.Node, index: list[ir.Affine], out_dtype: torch.dtype) -> str:
        packet, bound = node.target.overloadpacket, bind_args(node)
        args, cast_to = list(node.args), compute(out_dtype)
        if packet in COMPARISONS:
            promoted = torch.result_type(*(a.meta["val"] if isinstance(a, fx.Node) else a for a in args[:2]))
            ops = [
                self.operand(tlang.rounded(a, promoted), index, compute(promoted), op_dtype=promoted) for a in args[:2]
            ]
            return self.op(COMPARISONS[packet], ops, torch.bool)
        if cast_to == torch.bool and packet in LOGICAL:  # bool + bool is or, bool * bool and
            ops = [self.operand(a, index, torch.bool) for a in args[:2]]
            return self.op(LOGICAL[packet], ops, torch.bool)

        def x(i: int) -> str:
            return self.operand(args[i], index, cast_to, op_dtype=out_dtype)

        if tlang.is_philox_rand(node):  # fusion.compiler.random_ops: Philox at the element's position
            return self.philox_rand(node, index)
        if tlang.is_fma(node) and cast_to.is_floating_point:  # prims.fma: rounded once
            return self.op("fma", [x(0), x(1), x(2)], cast_to)
        if packet is aten.where:
            cond = self.value(args[0], broadcast(index, args[0].meta["val"].shape))[0]
            return self.op("where", [cond, x(1), x(2)], cast_to)
        if packet in (aten.add, aten.sub):
            b, alpha = x(1), bound.get("alpha", 1)
            if alpha != 1:
                b = self.op("mul", [b, self.const(alpha, cast_to)], cast_to)
            return self.op("add" if packet is aten.add else "sub", [x(0), b], cast_to)
        if packet is aten.div:
            mode = bound.get("rounding_mode")
            if mode is None:
                return self.op("truediv", [x(0), x(1)], cast_to)
            if mode == "floor":
                return self.op("floordiv", [x(0), x(1)], cast_to)
            if cast_to.is_floating_point:
                return self.op("trunc", [self.op("exact_div", [x(0), x(1)], cast_to)], cast_to)
            return self.op("truncdiv", [x(0), x(1)], cast_to)
        if packet in (aten.clamp, aten.clamp_min, aten.clamp_max):
            lo = bound.get("min") if packet is not aten.clamp_max else None
            hi = bound.get("max") if packet is not aten.clamp_min else None
            out = x(0)
            for bound_, test in ((lo, "lt"), (hi, "gt")):  # NaN stays NaN: the comparison is False
                if bound_ is not None:
                    if isinstance(bound_, fx.Node):
                        raise Unsupported(f"{node.name}: clamp with tensor bounds")
                    c = self.const(bound_, cast_to)
                    out = self.op("where", [self.op(test, [out, c], torch.bool), c, out], cast_to)
            return out
        if node.target is aten.pow.Tensor_Scalar:
            return self.power(x(0), bound["exponent"], cast_to, node)
        if packet in UNARY:
            return self.op(UNARY[packet], [x(0)], cast_to)
        if packet in BINARY:
            return self.op(BINARY[packet], [x(0), x(1)], cast_to)
        raise Unsupported(f"no kernel-IR op for {node.target}", node)

    def philox_rand(self, node: fx.Node, index: list[ir.Affine]) -> str:
        """``rand(seed, position)``: the seed the one int64 element of its input, the position the element's flat
        index in the contiguous tensor (the counter the Triton path and the eager op use)."""
        seed_node, size = node.args
        seed = self.value(seed_node, [const(0)] * seed_node.meta["val"].dim())[0]
        shape = tuple(int(s) for s in size)
        at = self.index_value(offset(broadcast(index, shape), tlang.contiguous_strides(shape)))
        return self.op("rand", [seed, at], torch.float32)

    def power(self, x: str, e: object, dtype: torch.dtype, node: fx.Node) -> str:
        """``x ** e`` as torch computes it: an integer exponent by repeated squaring, 0.5 a square root."""
        if not isinstance(e, (int, float)) or isinstance(e, bool) or not math.isfinite(e):
            raise Unsupported(f"{node.name}: pow with exponent {e!r}", node)
        floating = dtype.is_floating_point
        if float(e).is_integer() and abs(e) <= 32 and (floating or e >= 0):
            e = int(e)
            if e == 0:
                return self.const(1, dtype)  # NaN ** 0 is 1

            def times(n: int) -> str:
                if n == 1:
                    return x
                half = times(n // 2)
                sq = self.op("mul", [half, half], dtype)
                return sq if n % 2 == 0 else self.op("mul", [sq, x], dtype)

            out = times(abs(e))
            return out if e > 0 else self.op("reciprocal", [out], dtype)
        if e in (0.5, -0.5):
            return self.op("sqrt" if e > 0 else "rsqrt", [x], dtype)
        if floating:
            return self.op("pow", [x, self.const(float(e), dtype)], dtype)
        raise Unsupported(f"{node.name}: integer pow with exponent {e!r}", node)

    # -- reductions and stores -----------------------------------------------------------------------------------------

    def store(self, i: int, node: fx.Node) -> None:
        val = node.meta["val"]  # a whole row, or one element per row (walk_rows checked): without keepdim, the kept
        per_row = self.rows and len(val.shape) == self.nrow < len(self.shape)  # dims' indices
        own = at = [self.index[d] for d in self.rows.kept] if per_row else self.index
        if moved := self.rows and row_permutation(node, self.shape):  # a transposed copy of the rows: its dim d
            own = at = [self.index[p] for p in moved[0]]  # is the rows' dim perm[d] (its views map the index back)
        elif per_row and (perm := per_row_permutation(node, self.rows)):  # of one element per row: kept dim perm[d]
            own = at = [self.index[self.rows.kept[p]] for p in perm]
        elif self.rows and node.name in self.rows.reshaped:  # a reshape of the rows: the row's flat position, split
            own = at = split(offset(self.index, torch.empty(self.shape, device="meta").stride()), val.shape, self.sizes)
        src = self.operand(node, at, val.dtype if val.dtype == torch.bool else compute(val.dtype))
        self.block.append(ir.Store(f"out{i}", offset(broadcast(own, val.shape), val.stride()), src))

    def kernel(self, name: str = "kernel") -> ir.Kernel:
        for r in self.reductions:  # each at row level, in graph order
            self.reduce(r)
        per_row = self.rows.per_row() if self.rows else ()
        whole = [self.rows is not None and tuple(n.meta["val"].shape) not in per_row
                 and per_row_permutation(n, self.rows) is None for n in self.stored]  # fmt: skip
        for i, n in enumerate(self.stored):
            if not whole[i]:
                self.store(i, n)
        if any(whole):
            self._in_loop(lambda: [self.store(i, n) for i, n in enumerate(self.stored) if whole[i]])
        buffers = [ir.Buffer(f"in{i}", tuple(v.shape), tuple(v.stride()), dtype_name(v.dtype))
                   for i, v in enumerate(n.meta["val"] for n in self.inputs)]  # fmt: skip
        buffers += [ir.Buffer(f"out{i}", tuple(v.shape), tuple(v.stride()), dtype_name(v.dtype), output=True)
                    for i, v in enumerate(n.meta["val"] for n in self.stored)]  # fmt: skip
        ops = tuple(f"{n.name} = {n.target}" for n in self.region.nodes if not is_view(n))
        kind = "reduction" if self.rows else "pointwise"
        return ir.Kernel(name, kind, tuple(buffers), self.loops, self.reduce_loops, tuple(self.top), ops)


def lower_region(region, stored: Sequence[fx.Node] | None = None, name: str = "kernel") -> ir.Kernel:
    """One region -> one :class:`~fusion.ir.kernel_ir.Kernel`, or :class:`Unsupported` with the reason.
    Its inputs are in order of first use; ``stored``: the members it stores, in argument order (by default
    ``stored_members(region)``)."""
    return Lowering(region, stored).kernel(name)
