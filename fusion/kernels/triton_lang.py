"""What the code generator (Phase 8, ``fusion.codegen``) writes besides the op lines: Triton spellings of dtypes and
constants, the combine functions of reductions, kernel names, memory order, and the check that a region is one the
generator has rules for. Machinery: a learner reads ``fusion/codegen.py``."""

from __future__ import annotations

import io
import itertools
import math
import operator
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

from fusion.aten.nodes import DEPTHWISE_CONV, LOW_MEMORY_MAX_POOLS, is_view_node
from fusion.compiler.ir import SplitRegion, Unsupported, next_power_of_2, rows_per_program

CAT = torch.ops.aten.cat.default  # generated as selects between masked loads (``triton_blocks.concatenation``)
# Max-pools whose values (getitem 0) are generated as a max over the window's masked loads (``triton_blocks.window_max``):
# Inductor's low-memory prims (values, int8 offsets) and aten's (values, indices); the second output is not generated.
MAX_POOLS = LOW_MEMORY_MAX_POOLS | {"aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices"}


def is_max_pool(node: object) -> bool:
    target = getattr(node, "target", None)
    return isinstance(target, torch._ops.OpOverload) and target._schema.name in MAX_POOLS


def is_depthwise(node: object) -> bool:
    """Is ``node`` a depthwise convolution renamed by Phase 9's pass ``depthwise`` (a window sum with weights,
    ``triton_blocks.window_sum``)?"""
    target = getattr(node, "target", None)
    return isinstance(target, torch._ops.OpOverload) and target._schema.name == DEPTHWISE_CONV


# Elements a program of a pointwise kernel takes on a GPU: 1024, and 512 where the kernel computes a depthwise
# convolution (9 or 25 loads an element, the ops before the window again at each): 1.04-1.7x faster on MobileNetV2's
# layers on an H200 (scripts/gpu_probe_depthwise.py, results h200-2026-11-25-aq2-probe_depthwise.json).
POINTWISE_BLOCK, WINDOW_BLOCK = 1024, 512


def pointwise_block(region) -> int:
    return WINDOW_BLOCK if any(is_depthwise(n) for n in region.nodes) else POINTWISE_BLOCK


def pooled_values(node: fx.Node) -> bool:
    """Is ``node`` ``getitem(max_pool(...), 0)``, the values of a max-pool?"""
    return node.target is operator.getitem and is_max_pool(node.args[0]) and node.args[1] == 0


COALESCED_ROWS = 16  # rows a program must take to read a reduction over non-innermost dims coalesced
# A row longer than one block is reduced in a loop over blocks, one program per row (a looped reduction). With fewer
# rows than a GPU has SMs (an H100 has 132) most of the GPU would idle while a few programs walk their rows; Inductor
# splits such a reduction over two kernels, we leave it to aten's reduction, which spreads one row over the GPU.
LOOPED_MIN_ROWS = 128

_names = itertools.count()


def next_kernel_index() -> int:
    """A process-wide counter: kernel names are unique per process, as Inductor's are (``..._0``, ``..._1``)."""
    return next(_names)


@dataclass(frozen=True)
class Line:
    """One line of a kernel body, ``tmp = expr``: a load of the input ``node``, one op computing member ``node``,
    or a helper step (``node`` None); with ``tmp`` empty, a statement (a store, a loop's header). ``depth``: inside
    how many loops. The generator writes the source and the kernel's op list from these records."""

    tmp: str
    expr: str
    dtype: torch.dtype | None  # the dtype the tmp holds (half/bf16 values are held in float32)
    node: fx.Node | None = None
    depth: int = 0

    def source(self) -> str:
        return "    " * self.depth + (f"{self.tmp} = {self.expr}" if self.tmp else self.expr)


@dataclass(frozen=True)
class Rows:
    """How a reduction kernel walks its region: XBLOCK rows of ``shape[:-nred]`` per program (chosen at launch); a row
    is the last ``nred`` dimensions, ``rnumel`` elements in one block of ``rblock`` lanes. A pointwise kernel has
    none."""

    shape: tuple[int, ...]
    nred: int
    rnumel: int
    rblock: int
    looped: bool = False  # the row is longer than one block: reduced in a loop over blocks of RBLOCK

    @classmethod
    def of(cls, reductions: Sequence[fx.Node], stored: Sequence[fx.Node], max_rblock: int) -> Rows:
        """The rows of the region's first reduction (its input's shape, its reduced dims); :class:`Unsupported` unless
        every reduction reduces the trailing dims of that shape and every store lies inside the walk (a whole row,
        or one element per row: anything else would be written out of its bounds)."""
        shape = tuple(reductions[0].args[0].meta["val"].shape)  # (..., N): rows of N
        ndim = len(shape)  # a 0-d tensor reduced over dim -1 or 0: one row of one element

        def dims_of(r: fx.Node) -> list[int]:
            dims = bind_args(r).get("dim")  # a list, None (all), or one int (any.dim)
            dims = [dims] if isinstance(dims, int) else dims or range(ndim)
            return sorted({d % ndim for d in dims}) if ndim else []

        nred = len(dims_of(reductions[0]))  # the row: the last nred dims (softmax 1, a global pool 2)
        nrow = ndim - nred
        for r in reductions:
            dims = dims_of(r)
            if tuple(r.args[0].meta["val"].shape) != shape or dims != list(range(nrow, len(shape))):
                raise Unsupported(f"{r.name} reduces dims {dims} of {tuple(r.args[0].meta['val'].shape)}: "
                                  "only the trailing dimensions of one common shape are generated", r)  # fmt: skip
        val = reductions[0].args[0].meta["val"]
        kept = [(st, size) for st, size in zip(val.stride()[:nrow], shape[:nrow], strict=True) if size > 1]
        reduced = [st for st, size in zip(val.stride()[nrow:], shape[nrow:], strict=True) if size > 1]
        rnumel = math.prod(shape[nrow:])
        rblock = next_power_of_2(rnumel)
        if kept and reduced and max(reduced) > min(st for st, _ in kept):  # channels_last, mean over H, W
            # The lanes of a row are scattered; the rows are what is contiguous (C). Worth generating only when a
            # program takes enough neighbouring rows that a warp reads whole sectors: the tile's column is C.
            xblock = rows_per_program(math.prod(shape[:nrow]), rblock)
            if not (kept[-1][0] == 1 and kept[-1][1] >= COALESCED_ROWS and xblock >= COALESCED_ROWS):
                raise Unsupported(f"{reductions[0].name} reduces dims {list(range(nrow, ndim))} of strides "
                                  f"{tuple(val.stride())}: not the innermost in memory, and a program would take "
                                  f"{xblock} neighbouring row(s) of them (< {COALESCED_ROWS}): its reads would be "
                                  "scattered (aten's reduction reads them coalesced)", reductions[0])  # fmt: skip
        for n in stored:
            if not isinstance(n.meta["val"], torch.Tensor):
                raise Unsupported(f"{n.name} has several outputs read outside the region: stored by another kernel", n)
            if tuple(n.meta["val"].shape) not in (shape, *per_row_shapes(shape, nred)):
                if row_permutation(n, shape) is None:
                    raise Unsupported(f"{n.name} {tuple(n.meta['val'].shape)} is neither the rows {shape}, a permutation"
                                      " of them nor one element per row: stored by another kernel", n)  # fmt: skip
        if rblock <= max_rblock:
            return cls(shape, nred, rnumel, rblock)
        if (rows := math.prod(shape[:nrow])) < LOOPED_MIN_ROWS:
            raise Unsupported(f"{rows} row(s) of {rnumel} elements: longer than one block ({max_rblock}) and too few "
                              f"to fill the GPU one program a row (< {LOOPED_MIN_ROWS}); aten splits them",
                              reductions[0])  # fmt: skip
        return cls(shape, nred, rnumel, max_rblock // 4, looped=True)


def per_row_shapes(shape: tuple[int, ...], nred: int) -> tuple[tuple[int, ...], ...]:
    """The shapes of one element per row of ``shape`` (rows of its last ``nred`` dims): keepdim or not."""
    nrow = len(shape) - nred
    return shape[:nrow], shape[:nrow] + (1,) * nred


def row_permutation(node: fx.Node, shape: tuple[int, ...]) -> tuple[tuple[int, ...], fx.Node] | None:
    """``(perm, rows)`` where ``node`` is a transposed copy of ``rows``, a tensor of ``shape`` (a clone of a permute or
    transpose, identity views between: MultiheadAttention's ``x.transpose(0, 1)`` before its in-projection, copied to
    row order by pass ``bmm_as_mm``), ``node.shape[d] == shape[perm[d]]``; None for anything else. A reduction kernel
    stores ``rows``' values at ``node``'s strides: element ``[i[perm[0]], i[perm[1]], ...]`` from the program that
    holds row ``i``."""
    aten = torch.ops.aten

    def shape_of(n: object) -> tuple | None:
        val = n.meta.get("val") if isinstance(n, fx.Node) else None
        return tuple(val.shape) if isinstance(val, torch.Tensor) else None

    same = (aten.view.default, aten._unsafe_view.default, aten.expand.default, aten.reshape.default)
    while (
        node.args
        and shape_of(node.args[0]) is not None
        and (
            node.target in (aten.clone.default, aten.alias.default)
            or (node.target in same and shape_of(node.args[0]) == shape_of(node))  # an identity view
        )
    ):
        node = node.args[0]
    if not node.args or shape_of(node.args[0]) != tuple(shape):
        return None
    if node.target is aten.permute.default:
        perm = [d % len(shape) for d in node.args[1]]
    elif node.target is aten.transpose.int:
        perm, (a, b) = list(range(len(shape))), (d % len(shape) for d in node.args[1:3])
        perm[a], perm[b] = perm[b], perm[a]
    else:
        return None
    # the innermost dim stays innermost: neighbouring lanes write neighbouring addresses (else aten's copy is better);
    # the identity is no copy to move
    return (tuple(perm), node.args[0]) if perm[-1] == len(shape) - 1 and perm != sorted(perm) else None


def bind_args(node: fx.Node) -> dict:
    """The node's arguments by schema name, defaults filled in: {'self': x, 'other': 2.0, 'alpha': 1}."""
    schema = node.target._schema
    bound = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    bound.update({a.name: v for a, v in zip(schema.arguments, node.args, strict=False)})
    bound.update(node.kwargs)
    return bound


def const_source(value: object) -> str:
    """A Python scalar as Triton source: 2.0, 1e-05, float('inf')."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'
    if isinstance(value, (int, float)):
        return repr(value)
    raise Unsupported(f"argument {value!r} of type {type(value).__name__} is not a scalar")


def tl_dtype(dtype: torch.dtype) -> str:
    names = {torch.bool: "int1", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    return "tl." + names.get(dtype, str(dtype).removeprefix("torch."))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half and bfloat16 compute in float32 (loaded up, rounded once at the store), like Inductor."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# The dtypes a kernel loads, computes and stores; anything else (complex, float8, unsigned > 8 bits) is refused.
DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
DTYPES |= {torch.float16, torch.bfloat16, torch.float32, torch.float64}


class Bf16Values:
    """Which tmps of a kernel hold a bfloat16 value already (a load of a bfloat16 tensor, a :func:`round_bf16`, a
    copy of either): rounding one of them again is the identity, so the writer reuses it instead."""

    def __init__(self) -> None:
        self.rounded: dict[str, str] = {}  # round_bf16 source of such a tmp -> the tmp

    def reuse(self, expr: str) -> str:
        return self.rounded.get(expr, expr)

    def note(self, tmp: str, expr: str, loaded: object) -> None:
        """``tmp = expr`` was written; ``loaded`` is the dtype of the input it loads (or a false value)."""
        if loaded == torch.bfloat16 or expr in self.rounded.values() or rounds_to_bf16(expr):
            self.rounded[round_bf16(tmp)] = tmp


def rounds_to_bf16(expr: str) -> bool:
    """Is ``expr`` what :func:`round_bf16` writes (its value is a bfloat16, held in a float32)?"""
    inner = expr.removesuffix(_TO_BF16)
    return inner != expr and (inner.isidentifier() or _one_parenthesis(inner))


_TO_BF16 = ".to(tl.bfloat16).to(tl.float32)"


def round_bf16(x: str) -> str:
    """float32 ``x`` rounded to the nearest bfloat16 (ties to even), still a float32: on a GPU one conversion
    instruction each way. (Triton's interpreter truncates and mishandles subnormals there: the runtime gives it exact
    conversions, ``triton_runtime.exact_bfloat16_in_the_interpreter``.)"""
    return f"{x if x.isidentifier() or _one_parenthesis(x) else f'({x})'}{_TO_BF16}"


def _one_parenthesis(s: str) -> bool:
    """Is ``s`` one parenthesised expression, "(" … ")" with the first parenthesis closed by the last character?"""
    depth = 0
    for i, ch in enumerate(s):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return s[0] == "(" and i == len(s) - 1
    return False


def cast(x: str, src: torch.dtype, dst: torch.dtype) -> str:
    """Source converting ``x`` (a tmp holding a value of compute dtype ``src``) to ``dst`` with torch's semantics,
    kept in ``compute_dtype(dst)``: half/bf16 rounded once and correctly (float64 via float32, as c10 does), float →
    integer truncated through int64 (float → uint8 wraps like torch), anything → bool is ``!= 0`` (NaN is True)."""
    if dst == torch.bool:
        return x if src == torch.bool else f"{x} != 0"
    if src == torch.bool:
        x, src = f"tl.where({x}, 1, 0)", torch.int32
    if dst in (torch.float16, torch.bfloat16):
        x32 = x if src == torch.float32 else f"{x}.to(tl.float32)"
        return f"{x32}.to(tl.float16).to(tl.float32)" if dst == torch.float16 else round_bf16(x32)
    if src == dst:
        return x
    if src.is_floating_point and not dst.is_floating_point and dst != torch.int64:
        return f"{x}.to(tl.int64).to({tl_dtype(dst)})"
    return f"{x}.to({tl_dtype(dst)})"


def divide(x: str, n: int, dtype: torch.dtype) -> str:
    """``x / n`` rounded as torch rounds it. Triton's float32 ``/`` is ``div.full.f32`` on NVIDIA GPUs (up to 2 ulp
    off: 3v / 3 need not be v), so a float32 quotient is ``tl.math.div_rn``; float64's ``/`` is already IEEE."""
    return f"tl.math.div_rn({x}, {float(n)})" if dtype == torch.float32 else f"{x} / {n}"


def int_power(x: str, e: int, floating: bool) -> str:
    """``x ** e`` for an integer ``e`` by repeated squaring, as torch (and Inductor) do: signs stay exact (x**4 of a
    negative x is positive), NaN ** 0 and inf ** 0 are 1, a negative exponent is one reciprocal."""
    if e == 0:
        return f"tl.where({x} != {x}, 1.0, 1.0).to({x}.dtype)" if floating else f"({x} * 0 + 1)"  # float64 stays
    if e < 0:
        return f"1.0 / ({int_power(x, -e, floating)})"
    if e == 1:
        return x
    half = int_power(x, e // 2, floating)
    square = f"({half}) * ({half})" if e // 2 > 1 else f"{x} * {x}"
    return square if e % 2 == 0 else f"{square} * {x}"


def rounded(value: object, dtype: torch.dtype) -> object:
    """A Python float as ``dtype`` holds it (0.1 in float16 is 0.0999755859375); anything else unchanged."""
    if isinstance(value, float) and dtype.is_floating_point and math.isfinite(value):
        return torch.tensor(value, dtype=dtype).item()
    return value


TANH_SERIES = (-1 / 3, 2 / 15, -17 / 315, 62 / 2835, -1382 / 155925, 21844 / 6081075, -929569 / 638512875)


def tanh(x: str, dtype: torch.dtype) -> str:
    """tanh as source: (1 - e) / (1 + e) with e = exp(-2|x|), and near 0, where 1 - e cancels every digit, its
    Taylor series (x - x³/3 + …, 8 terms, Horner in x²). Triton has no portable tl.tanh (the interpreter lacks it)."""
    big = f"tl.where({x} < 0, -1.0, 1.0) * (1.0 - tl.exp(-2.0 * tl.abs({x}))) / (1.0 + tl.exp(-2.0 * tl.abs({x})))"
    series = "0.0"
    for c in reversed(TANH_SERIES):
        series = f"({c!r} + {x} * {x} * {series})"
    small = f"{x} * (1.0 + {x} * {x} * {series})"
    return f"tl.where(tl.abs({x}) < {0.05 if dtype == torch.float64 else 0.55}, {small}, {big})"


def constant(value: object, dtype: torch.dtype) -> str:
    """A Python scalar operand of an op computed in ``dtype``, as torch would use it: float64 keeps every bit
    (a bare literal is a float32 in Triton), an integer must fit ``dtype`` (else refused: torch wraps it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return const_source(value)
    if dtype == torch.float64 and isinstance(value, float) and math.isfinite(value):
        return f"tl.full([], {value!r}, tl.float64)"
    if not dtype.is_floating_point and dtype != torch.bool:
        if isinstance(value, float):
            raise Unsupported(f"float constant {value!r} in an op computed in {dtype}")
        info = torch.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise Unsupported(f"constant {value} does not fit {dtype} (torch wraps it around)")
        if dtype == torch.int64 and not -(2**31) <= value < 2**31:
            return f"tl.full([], {value}, tl.int64)"
    return const_source(value)


COMBINE_FUNCTIONS = [
    "@triton.jit", "def _add(a, b):", "    return a + b", "", "",
    "@triton.jit", "def _maximum(a, b):", "    return tl.where(a != a, a, tl.where(a > b, a, b))", "", "",
    "@triton.jit", "def _minimum(a, b):", "    return tl.where(a != a, a, tl.where(a < b, a, b))", "",
]  # fmt: skip


def ops(body: Sequence[Line], members) -> list[str]:
    """The aten ops a kernel computes, in body order, read off its lines (loads and helpers left out)."""
    return list(dict.fromkeys(f"{ln.node.name} = {ln.node.target}" for ln in body if ln.node in members))


def index_setup(shape: tuple[int, ...], rows: Rows | None) -> list[str]:
    """The lines before a kernel's body: this program's lanes (``xindex``) and the mask of the last block's tail; a
    reduction's XBLOCK rows as a column and its RBLOCK lanes as a row (a looped one sets those in each loop)."""
    if rows is None:
        return [f"# elementwise over {shape}: {(n := math.prod(shape))} elements",
                "xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)", f"xmask = xindex < {n}"]  # fmt: skip
    count = math.prod(shape[: len(shape) - rows.nred])
    lines = [f"# XBLOCK rows per program: {count} rows of {rows.rnumel}" + (", RBLOCK lanes at a time" if rows.looped else ""),
             "xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]", f"xmask = xindex < {count}"]  # fmt: skip
    return lines + (
        [] if rows.looped else ["rindex = tl.arange(0, RBLOCK)[None, :]", f"rmask = rindex < {rows.rnumel}"]
    )


def module_source(head: str, body: list[str], reduction: bool) -> str:
    """A kernel's module: the imports, the combine functions a reduction's tl.reduce may call (NaN-propagating max
    and min; a sum where Triton lacks its own), then ``@triton.jit``, the signature ``head`` and the ``body``
    indented under it."""
    lines = ["import triton", "import triton.language as tl", "", ""] + ([*COMBINE_FUNCTIONS, ""] if reduction else [])
    return "\n".join([*lines, "@triton.jit", head] + ["    " + b for b in body]) + "\n"


def memory_order(val: torch.Tensor, shape: Sequence[int]) -> list[int]:
    """The dims of ``shape`` from outermost to innermost *in memory* for an output laid out like ``val`` (largest
    stride first; size-1 dims anywhere): (N, C, H, W) channels_last → [0, 2, 3, 1]. Logical order otherwise."""
    order = list(range(len(shape)))
    if tuple(val.shape) == tuple(shape):
        order.sort(key=lambda d: -val.stride()[d] if shape[d] != 1 else 0)
    return order


UNNAMED = "KERNEL_NAME"  # the name a kernel's draft source is written with; kernel_name() puts the real one in
_named: dict[tuple[str, str], str] = {}  # (prefix, code without comments) -> the name that code was first given


def kernel_name(region, rows: Rows | None, draft: str) -> tuple[str, str]:
    """(name, source) for a kernel whose ``draft`` source calls it :data:`UNNAMED`. Inductor's naming:
    triton_poi_fused_<ops>_<n> for pointwise, triton_per_fused_… for a persistent reduction (a row in one block),
    triton_red_fused_… for a looped one. A kernel whose code is an earlier kernel's, comments aside (a transformer's
    layers, ResNet's repeated blocks), gets that kernel's name: the runtime loads one module for both, and Triton
    compiles it once (Inductor's ``src_to_kernel`` does the same). Its source keeps the comments of its own region."""
    ops = sorted({n.target.overloadpacket.__name__.strip("_") for n in region.nodes if hasattr(n.target, "overloadpacket") and not is_view_node(n, getitem=False)})  # fmt: skip
    prefix = f"triton_{'poi' if rows is None else 'red' if rows.looped else 'per'}_fused_{'_'.join(ops[:8])}"
    key = (prefix, code_only(draft))
    if key not in _named:
        _named[key] = f"{prefix}_{next_kernel_index()}"
    return _named[key], draft.replace(f"def {UNNAMED}(", f"def {_named[key]}(", 1)


def code_only(source: str) -> str:
    """``source`` without its comments and blank lines (read by ``tokenize``: a '#' inside a string stays): two
    kernels with the same code compile to the same binary, whatever nodes their comments name."""
    cut = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            cut[tok.start[0]] = tok.start[1]
    lines = (ln[: cut[i]].rstrip() if i in cut else ln for i, ln in enumerate(source.splitlines(), 1))
    return "\n".join(ln for ln in lines if ln.strip())


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


def stored_members(region) -> list[fx.Node]:
    """The members a kernel stores: the region's external outputs, an escaping view replaced by the member it
    aliases (the view itself is rebuilt on the stored tensor after the launch)."""
    stored = [n for n in region.external_outputs if not is_view_node(n, getitem=False)]
    for n in region.external_outputs:
        while is_view_node(n, getitem=False) and n.args[0] in region.members:
            n = n.args[0]
        if not is_view_node(n, getitem=False) and n not in stored:
            stored.append(n)
    return stored


def _check_rule(region, n: fx.Node, val, reductions: set) -> None:
    """Raise :class:`Unsupported` unless member ``n`` is an op the generator has a rule for (:func:`check_region`)."""
    t = n.target
    if n.op != "call_function" or val is None:
        raise Unsupported(f"{n.name} has no meta['val']: capture the graph with fusion.regions.capture_aten", n)
    if is_max_pool(n):  # only its values are generated, read inside the region
        if any(not pooled_values(u) or u not in region.members for u in n.users):
            raise Unsupported(f"{n.name} ({t}): only a max-pool's values, read inside the region, are generated", n)
        if not val[0].dtype.is_floating_point:
            raise Unsupported(f"{n.name}: a max-pool of {val[0].dtype} is not generated", n)
        return
    if is_depthwise(n):  # a window sum: triton_blocks.window_sum
        return
    if t is operator.getitem:
        src = n.args[0]
        if pooled_values(n) and src in region.members:
            return
        if getattr(src, "target", None) is not torch.ops.aten.var_mean.correction or src not in region.members:
            raise Unsupported(f"no Triton expression for {n.name} = {src}[{n.args[1]}] ({src.target})", n)
        return
    if isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable:
        raise Unsupported(f"{n.name} ({t}) changes its input in place", n)
    if not isinstance(t, torch._ops.OpOverload) or not (
        is_view_node(n, getitem=False) or t in reductions or torch.Tag.pointwise in t.tags or t is CAT
    ):
        same = sorted(str(r) for r in reductions if r.overloadpacket is getattr(t, "overloadpacket", None))
        why = f"the generator has a rule for {' and '.join(same)}, not for this overload" if same else "neither pointwise, a view, a cat, nor a sum/mean/amax/amin/var/var_mean"
        raise Unsupported(f"no Triton expression for {n.name} ({t}): {why}", n)  # fmt: skip


def check_region(region, stored: list[fx.Node], reductions: set) -> None:
    """Raise :class:`Unsupported` unless every member is an op the generator has a rule for (pointwise, a view, one of
    ``reductions``, a getitem of var_mean, a cat, a max-pool's values, a depthwise convolution) and every tensor,
    members' values included, has static sizes, a dtype kernels take, elements and 32-bit offsets, and one device."""
    if not stored:
        raise Unsupported("nothing in the region is used outside it")
    devices = set()
    for n in [*region.nodes, *region.external_inputs]:
        val = n.meta.get("val")
        if n in region.members:
            _check_rule(region, n, val, reductions)  # then its values, as every tensor's below
        for v in val if isinstance(val, (tuple, list)) else [val]:
            if isinstance(v, torch.Tensor):
                if v.dtype not in DTYPES:
                    raise Unsupported(f"{n.name} is {v.dtype}: kernels are generated for bool, integers and floats", n)
                if not all(type(d) is int for d in (*v.shape, *v.stride())):
                    raise Unsupported(
                        f"{n.name} has symbolic sizes {tuple(v.shape)}: kernels are generated for static shapes"
                    )
                if v.numel() == 0:
                    raise Unsupported(f"{n.name} is empty {tuple(v.shape)}")
                if max(v.numel(), sum((s - 1) * st for s, st in zip(v.shape, v.stride(), strict=True))) >= 2**31:
                    raise Unsupported(f"{n.name} {tuple(v.shape)} needs 64-bit indexing; kernels index with int32")
                devices.add(v.device)
    if len(devices) > 1:
        raise Unsupported(f"tensors on several devices {sorted(map(str, devices))}")
