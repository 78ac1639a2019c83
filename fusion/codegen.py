"""Phase 8 — code generation: every fusion region becomes one generated Triton kernel.

Run it:   uv run python -m fusion.codegen          (``--quick`` for the small version CI runs)
Test it:  uv run pytest -m phase8

What you learn
--------------
* Phase 6 found the regions; here each one becomes **one kernel launch**: external inputs loaded once, every op one
  line of Triton on registers, every member someone outside needs stored: intermediates never touch DRAM.
* **Indexing is the whole trick.** A pointwise kernel walks the output's elements by a *flat index*
  ``xindex = program_id * XBLOCK + arange(XBLOCK)``, splits it into one index per dimension with ``//`` and ``%``
  (``x1 = xindex // 64``, ``x0 = xindex % 64``) and loads every tensor at ``sum(index_d * stride_d)``. Broadcasting
  is free: a size-1 (or missing) dimension contributes nothing, so ``b`` of shape (64,) is read at ``x0``. Other
  strides, views, the *mask* ``xindex < numel`` for the last block's tail, a ``cat`` (each input loaded at its shifted
  index under its own mask, a ``tl.where`` picks): all index arithmetic. The walk follows the first output's memory
  order (channels_last: C fastest), so neighbouring lanes touch neighbouring addresses. In Triton's CPU interpreter
  every load and store is checked to stay inside its tensor (``fusion.kernels.interp_check``): a missing mask or a
  wrong index is an error naming the kernel's line, never a silent read past the end or a crash of Python.
* **Reductions over the last dimension** (softmax, LayerNorm): a program takes ``XBLOCK`` rows (``xindex``, a column)
  of ``RBLOCK`` lanes (``rindex``, masked by ``rindex < N``), reduces along axis 1 and does the pointwise work before
  and after in the same kernel: softmax is one kernel. Short rows share a program. A row longer than one block is
  walked in a loop over blocks (a *looped* reduction): each reduction folds block after block into partials, the
  values after it are computed again in a later loop: softmax reads its row three times, still one kernel.
* **Reductions over leading dims** (a bias or LayerNorm weight gradient, ``g.sum([0, 1])``): the same kernel with the
  walk permuted: the kept dims are the rows (``xindex``), the reduced dims the row (``rindex``), each dim indexed at
  its own position and loaded at its real strides, so a program reads ``XBLOCK`` neighbouring outputs coalesced.
* Half and bfloat16 are loaded, converted to float32, computed in float32 and rounded where eager rounds.
* What the generator cannot do (an op without a Triton line, a reduction over dims not innermost in memory that too
  few rows share a program to read coalesced) is cut out the way Phase 6 cuts a span: that op runs as one aten call,
  with the reason in the report, and the pieces around it still become kernels. Never a crash, never a wrong answer.

Does Phase 6's cost model hold? ``run()`` on a GPU prints each kernel's time beside bytes ÷ copy bandwidth: pointwise
kernels land close; row reductions less so (load → reduce → reduce again → store: more passes over registers).

Anchors: early TorchInductor's ``codegen/triton.py``, Inductor's ``TORCH_LOGS=output_code``, Triton's tutorials.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence

import torch
import torch.fx as fx

from fusion import models
from fusion.aten.nodes import is_view_node as is_view
from fusion.common import heading, lesson_cli, shorten
from fusion.compiler import registry
from fusion.compiler.lowering import lower_plan, lower_region
from fusion.compiler.partition import CompiledGraph, CompiledModel, Worklist, ensure_meta
from fusion.ir.plan import GeneratedKernel, KernelPlan, Unsupported, row_warps
from fusion.kernels import rows as krows
from fusion.kernels import timing, triton_ir_runtime
from fusion.kernels import triton_blocks as blocks
from fusion.kernels import triton_demo as demo
from fusion.kernels import triton_lang as tlang
from fusion.kernels import triton_runtime as rt
from fusion.kernels.rows import bind_args
from fusion.kernels.triton_lang import compute_dtype, const_source, tl_dtype
from fusion.kernels.triton_values import ValueWriter
from fusion.kernels.triton_views import stored_index, unsplit, view_index
from fusion.regions import FusionRegion, aten_inputs, build_fusion_regions, capture_aten, unique_regions

aten, prims = torch.ops.aten, torch.ops.prims
MAX_RBLOCK = 16384  # the longest row held in registers whole (Triton's softmax tutorial); longer rows loop over blocks


# ----------------------------------------------------------------------------------------------------------------------
# 1. One aten op → one Triton expression


def pointwise_expr(node: fx.Node, args: list[str]) -> str:
    """The Triton expression computing one pointwise aten op from its operands (tmp names or constants).

    ``args`` are the op's positional tensor/scalar arguments already turned into source, e.g. ``['tmp0', '2.0']``.

    >>> g = fx.Graph(); x = g.placeholder("x"); n = g.call_function(aten.mul.Tensor, (x, 2.0))
    >>> pointwise_expr(n, ["tmp0", "2.0"])
    'tmp0 * 2.0'
    """
    packet, bound = node.target.overloadpacket, bind_args(node)
    # TODO(human): map each pointwise aten op to a Triton expression over args giving torch's result, special values included: binary ops, unary math (sin and cos included), bitwise_and and bitwise_or (bool and integers, as torch: & and | of each bit), relu/maximum/minimum/clamp (NaN propagates: maximum(nan, 0) is nan), where, comparisons, logical_not, clone and alias (the identity); tanh keeps its relative accuracy near 0 (tanh(1e-6 * x) * 1e6 is x to 1e-5); pow with a scalar exponent e as torch: an integer e exact for every sign (x**3 of -2 is -8, x**-2 a reciprocal, nan**0 is 1), e = 0.5 is sqrt and -0.5 rsqrt ((-0.0)**-0.5 is -inf, (-inf)**0.5 and (-inf)**-0.5 are nan), any other e is nan for a negative finite x, and (-inf)**e is inf for e > 0, 0 for e < 0; raise Unsupported(reason) for anything else (div with a rounding_mode included). Hint: a dict from the overload packet (aten.add, aten.exp, …) to a format string like '{0} + {1}' covers most ops; add's alpha, clamp's optional bounds and pow's exponent need code, and every special value above is a case to test. More: test a != a first for NaN (no | between a vector and a scalar, the interpreter cannot); sigmoid is 1/(1+exp(-x)) (tl.sigmoid is a @jit helper the interpreter cannot call); tanh is tlang.tanh (no portable tl.tanh; 2*sigmoid(2x)-1 loses every digit near 0); an integer exponent is tlang.int_power (repeated multiplication: exp(log(x)*e) gives NaN for x < 0), 0.5 and -0.5 are tl.sqrt and tl.rsqrt, another finite exponent exp(e*log(x)) with a tl.where for x == -inf (log(-inf) is nan)
    # BEGIN SOLUTION
    a = args
    table_ = {
        aten.mul: "{0} * {1}", aten.div: "{0} / {1}", aten.neg: "-{0}", aten.sin: "tl.sin({0})",
        aten.abs: "tl.abs({0})", aten.exp: "tl.exp({0})", aten.log: "tl.log({0})", aten.sqrt: "tl.sqrt({0})",
        aten.rsqrt: "tl.rsqrt({0})", aten.sigmoid: "1.0 / (1.0 + tl.exp(-{0}))", aten.erf: "tl.erf({0})",
        aten.tanh: tlang.tanh("{0}", node.meta["val"].dtype), aten.reciprocal: "1.0 / {0}",
        aten.relu: "tl.where({0} < 0, 0, {0})", aten.where: "tl.where({0}, {1}, {2})",
        aten.maximum: "tl.where({0} != {0}, {0}, tl.where({0} > {1}, {0}, {1}))",
        aten.minimum: "tl.where({0} != {0}, {0}, tl.where({0} < {1}, {0}, {1}))",
        aten.eq: "{0} == {1}", aten.ne: "{0} != {1}", aten.lt: "{0} < {1}", aten.le: "{0} <= {1}",
        aten.gt: "{0} > {1}", aten.ge: "{0} >= {1}", aten.clone: "{0}", aten.alias: "{0}", aten.cos: "tl.cos({0})",
        aten.logical_not: "{0} == 0", aten.bitwise_and: "{0} & {1}", aten.bitwise_or: "{0} | {1}",
    }  # fmt: skip
    if packet in (aten.add, aten.sub):
        sign, alpha = ("+" if packet is aten.add else "-"), bound.get("alpha", 1)
        return f"{a[0]} {sign} {a[1]}" + ("" if alpha == 1 else f" * {tlang.constant(alpha, node.meta['val'].dtype)}")
    if bound.get("rounding_mode") is not None:
        raise Unsupported(f"{node.target} with rounding_mode={bound['rounding_mode']!r}")
    if packet in (aten.clamp, aten.clamp_min, aten.clamp_max):
        lo = bound.get("min") if packet is not aten.clamp_max else None
        hi = bound.get("max") if packet is not aten.clamp_min else None
        expr = a[0]
        if lo is not None:  # NaN stays NaN: x < lo is False for NaN
            expr = f"tl.where({expr} < {const_source(lo)}, {const_source(lo)}, {expr})"
        if hi is not None:
            expr = f"tl.where({expr} > {const_source(hi)}, {const_source(hi)}, {expr})"
        return expr
    if node.target is aten.pow.Tensor_Scalar and isinstance(e := bound["exponent"], (int, float)) and math.isfinite(e):
        floating = node.meta["val"].dtype.is_floating_point
        if float(e).is_integer() and abs(e) <= 32 and (floating or e >= 0):
            return tlang.int_power(a[0], int(e), floating)
        if e in (0.5, -0.5):  # as torch: sqrt / rsqrt (pow(-inf, 0.5) is nan)
            return f"tl.{'sqrt' if e > 0 else 'rsqrt'}({a[0]})"
        if floating and not float(e).is_integer():  # x < 0 gives NaN as torch; -inf ** e is inf (e > 0) or 0
            limit = "0.0" if e < 0 else 'float("inf")'
            return f'tl.where({a[0]} == float("-inf"), {limit}, tl.exp(tl.log({a[0]}) * {const_source(float(e))}))'
    if packet in table_:
        return table_[packet].format(*a)
    raise Unsupported(f"no Triton expression for {node.target}{' ' + str(node.args[1:]) if packet is aten.pow else ''}")
    # END SOLUTION


# ----------------------------------------------------------------------------------------------------------------------
# 2. Indexing: flat index → one index per dimension → an offset by strides


def split_index(flat: str, shape: Sequence[int], prefix: str = "x") -> list[tuple[str, str]]:
    """Name and expression of each dimension's index, from a flat index over a contiguous ``shape``.

    Innermost dimension first gets ``x0``; a size-1 dimension has no variable (its index is always 0).

    >>> split_index("xindex", (8, 1, 64))
    [('x1', 'xindex // 64'), ('0', '0'), ('x0', 'xindex % 64')]
    """
    # TODO(human): split the flat index into one index per dimension and return them outermost first, as (name, expr): named prefix0, prefix1, … from the innermost; the innermost is 'flat % size', each outer one '(flat // inner) % size' where inner is the product of the sizes inside it, the outermost dimension (the first of size > 1) without '% size' (the mask keeps it in range), a size-1 dim ('0', '0'); written exactly so, e.g. for (4, 8, 64) 'xindex // 512', '(xindex // 64) % 8', 'xindex % 64', because fusion.kernels.triton_views.unsplit parses them back. Hint: walk the dimensions from the last to the first, keeping the product of the sizes seen so far. More: one space around // and %, no '// 1'; collect innermost first and reverse at the end; a wrong index is caught as an access outside its tensor (fusion.kernels.interp_check) or a wrong element
    # BEGIN SOLUTION
    out: list[tuple[str, str]] = []
    inner, k = 1, 0
    outermost = next((d for d, s in enumerate(shape) if s != 1), len(shape))
    for d in range(len(shape) - 1, -1, -1):
        size = shape[d]
        if size == 1:
            out.append(("0", "0"))
            continue
        expr = flat if inner == 1 else f"{flat} // {inner}"
        if d != outermost:
            expr = f"({expr}) % {size}" if inner != 1 else f"{expr} % {size}"
        out.append((f"{prefix}{k}", expr))
        inner, k = inner * size, k + 1
    return out[::-1]
    # END SOLUTION


def broadcast_index(index: Sequence[str], shape: Sequence[int]) -> list[str]:
    """The index into a tensor of ``shape`` broadcast against ``index``: align on the right, size-1 dims read 0.

    >>> broadcast_index(["x1", "x0"], (64,)), broadcast_index(["x1", "x0"], (8, 1))
    (['x0'], ['x1', '0'])
    """
    tail = list(index[len(index) - len(shape) :]) if shape else []
    return ["0" if size == 1 else i for i, size in zip(tail, shape, strict=True)]


def offset_expr(index: Sequence[str], stride: Sequence[int], offset: int = 0) -> str:
    """``sum(index_d * stride_d) + offset`` as source; indices that are 0 drop out: '64*x1 + x0'."""
    if flat := unsplit(list(index), tuple(stride), split_index):  # a re-split flat index: // and % cancel
        return flat + (f" + {offset}" if offset else "")
    pairs = [(i, s) for i, s in zip(index, stride, strict=True) if i != "0"]
    terms = [i if s == 1 else f"{s}*{i}" if i.isidentifier() else f"{s}*({i})" for i, s in pairs]
    return " + ".join(terms + ([str(offset)] if offset else [])) or "0"


# ----------------------------------------------------------------------------------------------------------------------
# 3. The kernel body: loads, computation in order, stores

REDUCTIONS = {aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.amax.default, aten.amin.default}
REDUCTIONS |= {aten.var_mean.correction, aten.var.correction}  # what Inductor's decompositions leave
REDUCTIONS |= {aten.any.dim, aten.any.dims, aten.any.default}  # a masked softmax's "does the row keep any entry"
COMPARISONS = (aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge)
LOGICAL = (aten.add, aten.mul, aten.maximum, aten.minimum)  # on bools: or, and, or, and


class KernelWriter(ValueWriter):
    """Writes one region as a Triton kernel. ``value(node, index)`` returns the tmp holding that element (it and
    ``emit``/``operand``/``address`` are machinery: ``fusion.kernels.triton_values``)."""

    broadcast_index = staticmethod(broadcast_index)  # what ValueWriter.operand reads an operand's index with
    offset_expr = staticmethod(offset_expr)  # a position in a tensor (triton_values.philox_rand: rand's counter)

    def __init__(self, region: FusionRegion, rounded: frozenset[fx.Node] = frozenset()) -> None:
        self.region, self.members = region, region.members
        self.start_values(rounded)  # eager's rounding: one per value, computed where the value is (triton_values)
        self.body: list[tlang.Line] = []  # the kernel body as data: source and op list are read off it
        self.inputs: dict[fx.Node, str] = {}  # external input -> in_ptr<i>
        self.cache: dict[tuple, tuple[str, torch.dtype]] = {}  # (node, index) -> (tmp, dtype of the tmp)
        self.depth, self.guards = 0, []  # loops around the next line (a looped reduction); masks on its loads (cat)
        self.reductions = reductions = [n for n in region.nodes if n.op == "call_function" and n.target in REDUCTIONS]
        self.stored = krows.stored_members(region)  # an escaping view: its member is stored, the view rebuilt after
        krows.check_region(region, self.stored, REDUCTIONS)  # static shapes, one device, ops we have a rule for
        # A reduction kernel walks rows (legal: every reduction over the same dims of one shape, every store a whole
        # row or one element per row): the kept dims, then the reduced ones (a sum over leading dims: a permuted
        # walk, each dim indexed at its own position); a pointwise kernel walks the broadcast shape of what it stores.
        if reductions and (split := krows.split_by_reductions(region, reductions, self.stored)):
            raise split  # reductions walking different rows (a row's and a column's): one kernel each
        self.rows = krows.Rows.of(reductions, self.stored, MAX_RBLOCK, True, self.members) if reductions else None
        if self.rows:
            self.shape, walk, nrow = self.rows.shape, self.rows.walk, len(self.rows.kept)
            self.splits = split_index("xindex", walk[:nrow]) + split_index("rindex", walk[nrow:], "r")
            names = [n for n, _ in self.splits]  # in walk order
            self.index = [names[self.rows.walk_dims.index(d)] for d in range(len(self.shape))]
            flat = f"{self.rows.rnumel}*xindex + rindex"
        else:
            try:
                self.shape = tuple(torch.broadcast_shapes(*(tuple(n.meta["val"].shape) for n in self.stored)))
            except RuntimeError as e:
                raise krows.split_by_shape(region, self.stored) from e
            # Walk the first output's memory order (channels_last: C fastest) so lanes coalesce, as Inductor orders loops.
            order = tlang.memory_order(self.stored[0].meta["val"], self.shape)
            walk, flat = [self.shape[d] for d in order], "xindex"
            self.splits = split_index("xindex", walk)
            self.index = [name for _, (name, _) in sorted(zip(order, self.splits, strict=True))]
        nrow = len(self.rows.kept) if self.rows else 0
        self.row = [n for n, _ in self.splits[:nrow]] if self.rows else []  # a program's rows: xmask masks them
        self.lanes = [n for n, _ in self.splits[nrow:]] if self.rows else self.index  # what the other mask masks
        walked = offset_expr([n for n, _ in self.splits], [math.prod(walk[d + 1 :]) for d in range(len(walk))])
        self.flat = ({walked, f"({walked})"}, flat)  # at the walk's own contiguous strides: the flat index itself
        self.bf16 = tlang.Bf16Values()  # tmps holding a bfloat16 already: rounding one again is a no-op

    def _compute(self, node: fx.Node, index: list[str]) -> tuple[str, torch.dtype]:
        val = node.meta.get("val")
        # TODO(human): produce node's element at index: an external input is a tl.load at its strides masked so that no lane reads outside the tensor (the last block's tail, a row shorter than RBLOCK: the tests check every access), half/bf16 converted to float32; a view reads its input at view_index; a cast converts its operand; a reduction goes to self.reduce; any other op computes pointwise_expr over its operands, each read at its own broadcast index (where's condition too: a (4, 1) condition selects whole rows), bool add, mul, maximum and minimum as logical or, and, or, and (torch: True + True is True; Triton's int1 arithmetic wraps, 1 + 1 = 0). Hint: self.emit(expr, dtype, node) writes one line and returns (tmp, dtype); self.value(arg, idx) recurses and caches; self.operand(arg, index, dtype, exact) reads an operand (node or scalar) converted to dtype, the arithmetic one compute_dtype(val.dtype). More: the load is tl.load(ptr, mask) with (ptr, mask) = self.address(name, offset_expr(index, val.stride())) (no mask: leave it out); give each input a pointer name in self.inputs (in_ptr0, in_ptr1, …); a getitem of var_mean is self.reduce(var_mean, index)[i]; a comparison converts both sides to their torch.result_type (exact=True, and a scalar rounded to that dtype: eager compares fp16 0.1 with fp16 0.1); a cast is the operand at its own dtype through tlang.cast (exact=True); where's condition is self.value at broadcast_index; a bool op of LOGICAL computes on int32 operands and ends in != 0; any other op reads its operands with op_dtype=val.dtype (torch converts each operand to the op's dtype first)
        # BEGIN SOLUTION
        if node not in self.members:  # an external input: one load per distinct index
            if not isinstance(val, torch.Tensor):
                raise Unsupported(f"input {node.name} is not a tensor ({type(val).__name__})")
            ptr = self.inputs.setdefault(node, f"in_ptr{len(self.inputs)}")
            pointer, mask = self.address(ptr, offset_expr(index, val.stride()))  # the pointer is the first element
            load = f"tl.load({pointer}{', ' + mask if mask else ''})"
            ct = compute_dtype(val.dtype)
            return self.emit(load if ct == val.dtype else f"{load}.to({tl_dtype(ct)})", ct, node)
        if node.target is operator.getitem:
            return self.reduce(node.args[0], index)[node.args[1]]
        if is_view(node):
            return self.value(node.args[0], view_index(node, index, split_index, offset_expr, broadcast_index))
        if node.target in REDUCTIONS:
            return self.reduce(node, index)
        src_dtype = node.args[0].meta["val"].dtype if isinstance(node.args[0], fx.Node) else None
        if node.target is prims.convert_element_type.default:
            src = self.operand(node.args[0], index, compute_dtype(src_dtype), exact=True)
            return self.emit(tlang.cast(src, compute_dtype(src_dtype), val.dtype), compute_dtype(val.dtype), node)
        args = [a.meta["val"] if isinstance(a, fx.Node) else a for a in node.args]
        cast_to, compare = compute_dtype(val.dtype), node.target.overloadpacket in COMPARISONS
        if compare:
            promoted = torch.result_type(*args[:2])
            cast_to, args = compute_dtype(promoted), [tlang.rounded(a, promoted) for a in node.args]
        else:
            args = list(node.args)
        logical = cast_to == torch.bool and node.target.overloadpacket in LOGICAL
        cast_to = torch.int32 if logical else cast_to  # bool + bool is or, bool * bool and: int1 arithmetic wraps
        operands = []
        for i, a in enumerate(args):
            if isinstance(a, fx.Node) and node.target.overloadpacket is aten.where and i == 0:
                operands.append(self.value(a, broadcast_index(index, a.meta["val"].shape))[0])  # the condition
            elif isinstance(a, (fx.Node, int, float, bool)):
                operands.append(self.operand(a, index, cast_to, exact=compare, op_dtype=val.dtype))
        expr = pointwise_expr(node, operands)
        return self.emit(f"({expr}) != 0" if logical else expr, compute_dtype(val.dtype), node)
        # END SOLUTION

    def reduce(self, node: fx.Node, index: list[str]) -> tuple:
        """A row reduction, computed once per program; ``index`` must be this program's row."""
        if not self.rows or node not in self.members:
            raise Unsupported(f"{node.name} ({node.target}) is not a row reduction of this kernel", node=node)
        kept = self.rows.kept  # its value's index: one per kept dim, or (keepdim) one per dim
        if ([index[d] for d in kept] if len(index) == len(self.shape) else list(index)) != self.row:
            raise krows.read_at_another_row(self.region, node)  # a kernel stores it, a second reads it (or aten)
        key = (node, "reduce")
        if key in self.cache:
            return self.cache[key]
        val = node.meta["val"]
        dt = compute_dtype((val[0] if isinstance(val, (tuple, list)) else val).dtype)  # sum(dtype=float64): float64
        if node.target.overloadpacket is aten.any:  # the largest of (x != 0) as 0.0/1.0 (NaN is True); > 0 after it,
            x = functools.partial(self.operand, node.args[0], self.index, torch.bool, True)  # as an empty row is -inf
            flag = blocks.row_reduction(self, lambda: f"({x()}).to(tl.float32)", "_maximum", torch.float32)
            self.cache[key] = out = self.emit(f"{flag[0]} > 0", torch.bool, node)
            return out
        if not dt.is_floating_point:
            raise Unsupported(f"{node.name}: reductions to {dt} are not generated")
        n, target = self.rows.rnumel, node.target

        x = functools.partial(self.operand, node.args[0], self.index, dt, True)  # the row (a half one rounded first)

        def squares() -> str:  # variance: a second pass over the row, the squares about its mean
            return (c := self.emit(f"{x()} - {out[0]}", dt)[0]) + f" * {c}"

        if target in (aten.amax.default, aten.amin.default):
            out = blocks.row_reduction(self, x, "_maximum" if target is aten.amax.default else "_minimum", dt, node)
        else:
            total = blocks.row_reduction(self, x, "_add", dt, node)
            out = total if target.overloadpacket is aten.sum else self.emit(tlang.divide(total[0], n, dt), dt)
        if target.overloadpacket in (aten.var_mean, aten.var):
            corr = bind_args(node).get("correction")
            sq = blocks.row_reduction(self, squares, "_add", dt)
            var = self.emit(tlang.divide(sq[0], max(n - (1 if corr is None else corr), 0), dt), dt)
            out = (var, out) if target is aten.var_mean.correction else var
        self.cache[key] = out
        return out

    def store(self, i: int, node: fx.Node) -> None:
        """Compute stored member ``node`` and write it to ``out_ptr<i>``: a whole row, or one element per row."""
        val, (source, at, own) = node.meta["val"], (node, self.index, self.index)
        if self.rows:  # a whole row, one element per row, a permutation or a reshape of the rows (triton_views)
            source, at, own = stored_index(node, self.rows, self.index, split_index, offset_expr)
        src = self.operand(source, at, val.dtype if val.dtype == torch.bool else compute_dtype(val.dtype))
        if val.dtype == torch.bfloat16:  # rounded here: Triton's interpreter truncates on .to(tl.bfloat16)
            src = self.emit(tlang.cast(src, torch.float32, val.dtype), torch.float32)[0]
        pointer, mask = self.address(f"out_ptr{i}", offset_expr(broadcast_index(own, val.shape), val.stride()))
        cast = "" if compute_dtype(val.dtype) == val.dtype else f".to({tl_dtype(val.dtype)})"
        store = f"tl.store({', '.join(filter(None, (pointer, src + cast, mask)))})  # {node.name}"
        self.body.append(tlang.Line("", store, None, None, self.depth))

    def source(self, name: str) -> str:
        """Assemble the kernel: signature, index setup, the body (values of the stored members, their stores)."""
        looped = self.rows and self.rows.looped
        for r in self.reductions:  # each at the top level, in graph order: a looped one is a loop of its own
            self.reduce(r, self.index)
        per_row = self.rows.per_row() if self.rows else ()
        whole = [looped and tuple(n.meta["val"].shape) not in per_row for n in self.stored]
        for i in [i for i, w in enumerate(whole) if not w]:
            self.store(i, self.stored[i])
        if any(whole):  # whole rows of a looped reduction: one last loop over the blocks
            with blocks.row_loop(self):
                for i in [i for i, w in enumerate(whole) if w]:
                    self.store(i, self.stored[i])
        ptrs = [*self.inputs.values(), *(f"out_ptr{i}" for i in range(len(self.stored)))]
        head = f"def {name}({', '.join(ptrs)}, XBLOCK: tl.constexpr{', RBLOCK: tl.constexpr' if self.rows else ''}):"
        ops = [n.name for n in self.region.nodes if not is_view(n) and n.target is not operator.getitem]
        body = [
            f"# region #{self.region.index}: {shorten(' → '.join(ops), 100)}",
            *tlang.index_setup(self.shape, self.rows),
        ]
        body += [f"{v} = {e}" for v, e in blocks.used_splits(self) if not (looped and v[0] == "r")]  # x0 = xindex % 64
        for ln in self.body:
            what = ln.node and (f"{ln.node.name} = {ln.node.target}" if ln.node in self.members else ln.node.name)
            body.append(ln.source() + (f"  # {what}" if what else ""))
        return tlang.module_source(head, body, reduction=self.rows is not None)  # imports, @triton.jit, indented body


def generate_kernel(region: FusionRegion) -> KernelPlan:
    """One region → one KernelPlan (source, arguments, grid), or :class:`Unsupported` with the reason."""
    writer = KernelWriter(region)
    code = writer.source(tlang.UNNAMED)
    if writer.exact_reads:  # values some op reads rounded: written again, rounded once where they are computed
        writer = KernelWriter(region, frozenset(writer.exact_reads))
        code = writer.source(tlang.UNNAMED)
    name, source = tlang.kernel_name(region, writer.rows, code)  # a repeated code: one name
    kind, inputs = "reduction" if writer.rows else "pointwise", list(writer.inputs)
    kernel = GeneratedKernel(name, source, region, kind, tlang.ops(writer.body, region.members))
    meta = [(tuple(n.meta["val"].shape), tuple(n.meta["val"].stride()), n.meta["val"].dtype) for n in inputs]
    if writer.rows:
        rows, rblock = writer.rows.count, writer.rows.rblock
        least = krows.COALESCED_ROWS if writer.rows.column else 1  # a column walk: whole sectors a warp
        plan = KernelPlan(kernel, inputs, meta, writer.stored, region.external_outputs, rows, {"RBLOCK": rblock}, row_warps(rows, rblock, least), min_xblock=least)  # fmt: skip
    else:
        plan = KernelPlan(kernel, inputs, meta, writer.stored, region.external_outputs, 0, {}, 4, math.prod(writer.shape), tlang.pointwise_block(region))  # fmt: skip
    return triton_ir_runtime.lower_for(plan, lower_plan)  # its kernel IR too, where C or the IR's Triton renders it


# ----------------------------------------------------------------------------------------------------------------------
# 4. The whole graph: one launch per region, aten for the rest


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledGraph:
    """One Triton kernel per fusion region of an aten graph (``meta["val"]`` on its nodes: capture_aten or AOT); the
    rest stays aten calls. Called like ``gm``; has ``.kernels``, ``.report``, ``.num_kernels``, ``.library_calls``. A
    region with an op the generator cannot compile is cut there (an aten call, its reason in the report)."""
    ensure_meta(gm, example_inputs)
    work = Worklist(gm, unique_regions(build_fusion_regions(gm)))  # Phase 6's regions, built once
    for region in work:
        try:
            work.done(generate_kernel(region))
        except Exception as e:  # an op without a Triton line: cut the region there (Unsupported names the node)
            work.refuse(region, e)
    return work.compiled()  # fusion.compiler.partition: the graph with one call per kernel


def compile_regions(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor]) -> CompiledModel:
    """capture_aten + compile_graph: a module computing ``model(*inputs)`` for inputs of the example shapes."""
    return CompiledModel(model, compile_graph(capture_aten(model, example_inputs), aten_inputs(model, example_inputs)))


# ----------------------------------------------------------------------------------------------------------------------
# The lesson


def generated_sources(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> list[GeneratedKernel]:
    """The kernels of every region, generated but not loaded: this works without Triton installed."""
    return [generate_kernel(r).kernel for r in unique_regions(build_fusion_regions(capture_aten(model, inputs)))]


def run(quick: bool = False) -> None:
    heading("Phase 8 — code generation: every fusion region becomes one Triton kernel")
    runs, why = rt.triton_status()
    device = "cuda" if torch.cuda.is_available() and runs else "cpu"
    print(why + (". Interpreter runs check correctness only: no timings are shown." if device == "cpu" else "."))
    heading("A region and the kernel generated for it", "-")
    chain = generated_sources(models.ElementwiseChain(), models.elementwise_inputs(batch=8, d=64))[0]
    demo.show_region(chain)
    heading("The same region as C: one kernel IR, two renderers", "-")
    demo.show_c(chain, lower_region(chain.region, name=chain.name))  # the device-neutral lowering's record
    heading("Indexing: flat index, broadcast by // and %, the mask", "-")
    demo.show_indexing(split_index, broadcast_index, offset_expr)  # prints what these three functions give
    heading("Reductions: softmax and LayerNorm + GELU + residual, one kernel each", "-")
    (soft,) = generated_sources(models.ScaledSoftmax(), models.norm_inputs())
    print(f"softmax(x * 0.125): {soft.name}, ops {' → '.join(n.name for n in soft.region.nodes)}")
    (norm,) = generated_sources(models.NormGELUResidual(), models.norm_inputs())
    print(f"x + gelu(layer_norm(x)): one kernel, XBLOCK rows per program:\n\n{norm.source}")
    demo.show_looped(generated_sources(models.ScaledSoftmax(), (torch.randn(128, MAX_RBLOCK + 1),))[0], MAX_RBLOCK)
    if not runs:
        print(f"These kernels cannot run here: {why}.")
        return
    heading("What falls back, and why: the region is cut at the op, the pieces around it still fuse", "-")
    demo.show_fallbacks(compile_graph)
    heading("The course's models: generated kernels vs eager", "-")
    demo.models_table(compile_regions, build_fusion_regions, device, quick)
    if device == "cuda":
        timing.gpu_numbers([(*case, compile_regions(*case[1:])) for case in timing.gpu_cases(quick)])


def main(argv: list[str] | None = None) -> int:
    return lesson_cli(run, __doc__, argv)


registry.register(8, compile_graph=compile_graph, compile_regions=compile_regions)  # the backend's code generator
if __name__ == "__main__":
    raise SystemExit(main())
