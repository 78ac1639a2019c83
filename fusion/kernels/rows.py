"""What a generated kernel takes and how it walks its region (Phase 8, ``fusion.codegen``): which members the
generator has rules for (:func:`check_region`), which it stores (:func:`stored_members`), and a reduction kernel's
walk over rows (:class:`Rows`); where a region is cut in two kernels is ``fusion.kernels.row_splits``. Nothing here writes
Triton: ``fusion.kernels.triton_lang`` holds the spellings, and re-exports these names for the readers that know
them from there. Machinery: a learner reads ``fusion/codegen.py``."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

from fusion.aten.nodes import DEPTHWISE_CONV, LOW_MEMORY_MAX_POOLS, bind_args, is_view_node
from fusion.ir.plan import SplitRegion, Unsupported, next_power_of_2
from fusion.ir.views import extent
from fusion.kernels.row_splits import misfit_store, upstream

_aten = torch.ops.aten
CAT = _aten.cat.default  # generated as selects between masked loads (``lowering.concatenation``)
# Max-pools whose values (getitem 0) are generated as a max over the window's masked loads (``lower_windows.window_max``):
# Inductor's low-memory prims (values, int8 offsets) and aten's (values, indices); the second output is not generated.
MAX_POOLS = LOW_MEMORY_MAX_POOLS | {"aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices"}


def is_max_pool(node: object) -> bool:
    target = getattr(node, "target", None)
    return isinstance(target, torch._ops.OpOverload) and target._schema.name in MAX_POOLS


def is_depthwise(node: object) -> bool:
    """Is ``node`` a depthwise convolution renamed by Phase 9's pass ``depthwise`` (a window sum with weights,
    ``lower_windows.window_sum``)?"""
    target = getattr(node, "target", None)
    return isinstance(target, torch._ops.OpOverload) and target._schema.name == DEPTHWISE_CONV


# Indexed reads a kernel generates as one load at a computed position (``fusion.compiler.lower_gathers``)
GATHERS = frozenset({_aten.embedding.default, _aten.index.Tensor, _aten.index_select.default, _aten.gather.default})


def is_gather(node: object) -> bool:
    """Is ``node`` an embedding, ``index``, ``index_select`` or ``gather`` (a load at a position it reads)?"""
    return getattr(node, "target", None) in GATHERS


def pooled_values(node: fx.Node) -> bool:
    """Is ``node`` ``getitem(max_pool(...), 0)``, the values of a max-pool?"""
    return node.target is operator.getitem and is_max_pool(node.args[0]) and node.args[1] == 0


# The dtypes a kernel loads, computes and stores; anything else (complex, float8, unsigned > 8 bits) is refused.
DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
DTYPES |= {torch.float16, torch.bfloat16, torch.float32, torch.float64}


COALESCED_ROWS = 16  # rows a program must take to read a reduction over non-innermost dims coalesced
# A row longer than one block is reduced in a loop over blocks, one program per row (a looped reduction). With fewer
# rows than a GPU has SMs (an H100 has 132) most of the GPU would idle while a few programs walk their rows; Inductor
# splits such a reduction over two kernels, we leave it to aten's reduction, which spreads one row over the GPU.
LOOPED_MIN_ROWS = 128
# A column walk (the rows are what is contiguous: ``x.sum(0)``, a bias gradient) takes XBLOCK >= COALESCED_ROWS
# neighbouring rows a program, so its block of a row is short: a row of up to COLUMN_RBLOCK elements in one block
# (16 x 256 = 4096 elements, the table's ELEMENTS_PER_PROGRAM), a longer one in a loop: steps of COLUMN_LOOP_RBLOCK,
# a tile of 64 columns x 64 steps (XBLOCK halved to fill the GPU, never below 16), COLUMN_LOOP_WARPS warps; a sum of
# a half input (every load 2 bytes, every fold a sum) a tile of WIDE_COLUMN_LOOP_ELEMENTS, 128 x 128. Swept on an
# H200 (2026-11-28, scripts/gpu_column_sweep.py, scripts/results/h200-2026-11-28-1610-sweeps/: tiles of 32-256 x
# 16-256, 4-16 warps, 2-64 splits; times as multiples of the bandwidth limit): x.sum(0) of (8192, 4096) bf16 1.46
# with the 64 x 64 tile, 1.30 with 128 x 128 (Inductor 1.32), (65536, 1024) 1.22 -> 1.14; but a float32 sum or an amax
# over the 128 x 128 tile slowed to 1.33 and 2.15 (its float32 tile in registers), where 64 x 64 holds them at 1.13-
# 1.25. Warps: the rule below gave a halved 16 x 64 tile (a BERT bias gradient's) 2 warps, 13.6 us; 8 warps, 7.4
# (Inductor 7.7). Few long columns leave SMs idle: a looped column walk needs LOOPED_MIN_ROWS programs (2048 kept
# elements), else aten's reduction (on an H200, 2026-11-26: x.sum(0) of (65536, 1024) bf16 in 64 programs took 1015
# us against aten's 290; scripts/gpu_outer_sums.py); pass split_reductions splits such columns first.
COLUMN_RBLOCK, COLUMN_LOOP_RBLOCK, COLUMN_LOOP_WARPS = 256, 64, 8
WIDE_COLUMN_LOOP_RBLOCK, WIDE_COLUMN_LOOP_ELEMENTS = 128, 16384


@dataclass(frozen=True)
class Rows:
    """How a reduction kernel walks its region: XBLOCK rows per program (chosen at launch). ``shape`` is the first
    reduction's input; a row is its elements along the reduced dims, one row per index of the kept dims:
    ``rnumel`` elements in one block of ``rblock`` lanes, or (``looped``) in a loop over blocks. The walk visits the
    kept dims, then the reduced ones, each in logical order (``order``): over the trailing dims (softmax, LayerNorm)
    that is the identity, ``shape[:-nred]`` rows of the last ``nred`` dims; over leading or middle dims (a bias
    gradient's ``sum([0, 1])``, Inductor's OUTER reductions) a permuted walk, each element read at its real strides.
    ``column``: the kept dims hold the innermost in memory, so neighbouring rows are neighbouring addresses: a program
    takes at least :data:`COALESCED_ROWS` of them (a warp reads whole sectors) and steps along the reduced dims.
    A pointwise kernel has none."""

    shape: tuple[int, ...]
    nred: int
    rnumel: int
    rblock: int
    looped: bool = False  # the row is longer than one block: reduced in a loop over blocks of RBLOCK
    order: tuple[int, ...] | None = None  # the walk: kept dims then reduced dims (None: the identity)
    column: bool = False  # rows contiguous in memory: XBLOCK >= COALESCED_ROWS on a GPU
    reshaped: frozenset[str] = frozenset()  # the stored members that are reshapes of the rows (row_reshape)

    @property
    def walk_dims(self) -> tuple[int, ...]:
        return self.order if self.order is not None else tuple(range(len(self.shape)))

    @property
    def kept(self) -> tuple[int, ...]:
        """The dims of ``shape`` that index the rows, in logical order (the first of the walk)."""
        return self.walk_dims[: len(self.shape) - self.nred]

    @property
    def walk(self) -> tuple[int, ...]:
        """The sizes in walk order: the rows' dims, then a row's."""
        return tuple(self.shape[d] for d in self.walk_dims)

    @property
    def count(self) -> int:
        """How many rows."""
        return math.prod(self.shape[d] for d in self.kept)

    def per_row(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes of one element per row: without keepdim and with it."""
        rows = tuple(self.shape[d] for d in self.kept)
        return rows, tuple(s if d in self.kept else 1 for d, s in enumerate(self.shape))

    @classmethod
    def of(cls, reductions: Sequence[fx.Node], stored: Sequence[fx.Node], max_rblock: int, outer: bool = False,
           members=None, fill_gpu: bool = True) -> Rows:  # fmt: skip
        """The rows of the region's first reduction (its input's shape, its reduced dims); :class:`Unsupported` unless
        every reduction reduces the same dims of that shape (the trailing ones, unless ``outer``: any), the rows or
        a row are contiguous in memory, and every store lies inside the walk (a whole row, one element per row, a
        transposed copy of trailing rows or, given the region's ``members``, a reshape of the rows: anything else
        would be written out of its bounds). ``outer``: the Triton generator's walks over any dims,
        with a GPU's rules (whole sectors, enough programs); the C lowering builds its own (``lower_reductions``).
        ``fill_gpu=False``: the kernel runs as C on a CPU, where few long rows leave no SMs idle (one thread walks
        them, or OpenMP splits the rows): the rule of :data:`LOOPED_MIN_ROWS` does not apply."""
        shape = tuple(reductions[0].args[0].meta["val"].shape)  # (..., N): rows of N
        ndim = len(shape)  # a 0-d tensor reduced over dim -1 or 0: one row of one element

        def dims_of(r: fx.Node) -> list[int]:
            dims = bind_args(r).get("dim")  # a list, None (all), or one int (any.dim)
            dims = [dims] if isinstance(dims, int) else dims or range(ndim)
            return sorted({d % ndim for d in dims}) if ndim else []

        reduced = dims_of(reductions[0])  # the row: softmax [-1], a global pool [2, 3], a bias gradient [0, 1]
        nred, nrow = len(reduced), ndim - len(reduced)
        kept = [d for d in range(ndim) if d not in reduced]
        trailing = reduced == list(range(nrow, ndim))
        for r in reductions:
            dims, its = dims_of(r), tuple(r.args[0].meta["val"].shape)
            if not outer and (its != shape or dims != list(range(nrow, len(shape)))):
                raise Unsupported(f"{r.name} reduces dims {dims} of {its}: "
                                  "only the trailing dimensions of one common shape are generated", r)  # fmt: skip
            if its != shape or dims != reduced:
                raise Unsupported(f"{r.name} reduces dims {dims} of {its}, {reductions[0].name} dims {reduced} of "
                                  f"{shape}: a kernel's reductions reduce the same dims of one shape", r)  # fmt: skip
        val = reductions[0].args[0].meta["val"]
        stride = val.stride()
        rows_st = [(stride[d], shape[d]) for d in kept if shape[d] > 1]
        lanes_st = [stride[d] for d in reduced if shape[d] > 1]
        rnumel, count = math.prod(shape[d] for d in reduced), math.prod(shape[d] for d in kept)
        column = False
        if rows_st and lanes_st and max(lanes_st) > min(st for st, _ in rows_st) and (trailing or lanes_st[-1] != 1):
            # The lanes of a row are scattered; the rows are what is contiguous (C of channels_last, H of a bias
            # gradient). Worth generating only where a program takes enough neighbouring rows that a warp reads
            # whole sectors: the tile's column is that dim, XBLOCK >= COALESCED_ROWS of it (KernelPlan.min_xblock).
            column = rows_st[-1][0] == 1 and rows_st[-1][1] >= COALESCED_ROWS
            if not column:
                raise Unsupported(f"{reductions[0].name} reduces dims {reduced} of strides {tuple(stride)}: not the "
                                  f"innermost in memory, and the innermost kept dim is not one of >= {COALESCED_ROWS} "
                                  "neighbouring rows: its reads would be scattered (aten's reduction reads them "
                                  "coalesced)", reductions[0])  # fmt: skip
        per_row, reshaped, misfits = cls(shape, nred, rnumel, 1, order=tuple(kept + reduced)).per_row(), set(), []
        for n in stored:
            if not isinstance(n.meta["val"], torch.Tensor):
                raise Unsupported(f"{n.name} has several outputs read outside the region: stored by another kernel", n)
            if tuple(n.meta["val"].shape) in (shape, *per_row):
                continue
            if members is not None and row_reshape(n, shape, members, reductions):
                reshaped.add(n.name)
            elif not ((trailing and row_permutation(n, shape)) or row_permutation(n, per_row[0])):
                misfits.append(n)
        if misfits:
            raise misfit_store(misfits, (shape, *per_row), stored, members, reductions)
        order = None if trailing else tuple(kept + reduced)
        rblock, block = next_power_of_2(rnumel), min(COLUMN_RBLOCK, max_rblock) if column else max_rblock
        reshaped = frozenset(reshaped)
        if rblock <= block:
            return cls(shape, nred, rnumel, rblock, order=order, column=column, reshaped=reshaped)
        programs = count // COALESCED_ROWS if column else count  # a column walk: >= 16 neighbouring rows a program
        if programs < LOOPED_MIN_ROWS and fill_gpu:
            raise Unsupported(f"{count} row(s) of {rnumel} elements: longer than one block ({block}) and too few "
                              f"to fill the GPU ({programs} program(s) < {LOOPED_MIN_ROWS}); aten splits them",
                              reductions[0])  # fmt: skip
        step = min(COLUMN_LOOP_RBLOCK, max_rblock // 4) if column else max_rblock // 4
        return cls(shape, nred, rnumel, max(step, 1), looped=True, order=order, column=column, reshaped=reshaped)


def cat_parts(node: fx.Node, dim: int) -> list[tuple[fx.Node, int, int]]:
    """``(input, lo, hi)`` of ``cat(tensors, dim)``: the range of indices along ``dim`` each non-empty input owns."""
    parts, lo = [], 0
    for t in node.args[0]:
        size = t.meta["val"].shape[dim]
        if size:
            parts.append((t, lo, lo + size))
        lo += size
    return parts


def per_row_shapes(shape: tuple[int, ...], nred: int) -> tuple[tuple[int, ...], ...]:
    """The shapes of one element per row of ``shape`` (rows of its last ``nred`` dims): keepdim or not."""
    nrow = len(shape) - nred
    return shape[:nrow], shape[:nrow] + (1,) * nred


# Views that keep the elements' (contiguous) order: element f of the view is element f of its input, or (expand) the
# broadcast element of f's index. A permute, a slice, a select or a cat moves elements: not in the list.
ORDERED_VIEWS = frozenset({_aten.view, _aten.reshape, _aten._unsafe_view, _aten.alias, _aten.squeeze, _aten.unsqueeze})
ORDERED_VIEWS |= {_aten.expand}


def row_reshape(node: fx.Node, shape: Sequence[int], members, reductions: Sequence[fx.Node]) -> bool:
    """Is stored member ``node`` a reshape of the rows (``shape``): as many elements, another shape, and between it
    and the rows only pointwise ops and views that keep the elements' order (:data:`ORDERED_VIEWS`)? GPT-2's
    LayerNorm output (b, s, d), read by the next Linear as ``view(-1, d)`` and cast under autocast, is one. Its
    element at flat position ``f`` is computed from the row elements at ``f`` (and their rows' reductions), so the
    program holding row element ``i`` stores it at ``i``'s flat position split over the member's shape: no copy, and
    a contiguous member's offset is that flat position again (the lowering's store).
    A member reached through a permute, a slice or a cat is one only where no reduction of the kernel is computed
    before it (attention's packed q/k/v gradient, stacked and reshaped before its bias gradient's sum: each element
    is loads of the kernel's inputs at its own index); after a reduction it stays refused (the generator would read
    rows other than its own)."""
    val = node.meta["val"]
    if tuple(val.shape) == tuple(shape) or val.numel() != math.prod(shape):
        return False
    seen, stack, reduced = set(), [node], set(reductions)
    reordered = after_reduction = False
    while stack:
        n = stack.pop()
        if n in seen or n not in members:
            continue
        seen.add(n)
        if n in reduced or (n.target is operator.getitem and n.args[0] in reduced):  # one value per row, at its own
            after_reduction = True
            continue
        if is_max_pool(n) or is_depthwise(n):
            return False
        view = is_view_node(n, getitem=False) and getattr(n.target, "overloadpacket", None) not in ORDERED_VIEWS
        reordered = reordered or view or n.target is CAT
        stack += n.all_input_nodes
    return not (reordered and after_reduction)


def row_permutation(node: fx.Node, shape: tuple[int, ...]) -> tuple[tuple[int, ...], fx.Node] | None:
    """``(perm, rows)`` where ``node`` is a transposed copy of ``rows``, a tensor of ``shape`` (a clone of a permute or
    transpose, identity views between: MultiheadAttention's ``x.transpose(0, 1)`` before its in-projection, copied to
    row order by pass ``bmm_as_mm``; under autocast also cast to bfloat16 on the way), ``node.shape[d] ==
    shape[perm[d]]``; None for anything else. A reduction kernel stores ``node``'s element ``[i[perm[0]], i[perm[1]],
    ...]`` (computed there: a cast rounds it once) from the program that holds row ``i``."""
    aten = torch.ops.aten

    def shape_of(n: object) -> tuple | None:
        val = n.meta.get("val") if isinstance(n, fx.Node) else None
        return tuple(val.shape) if isinstance(val, torch.Tensor) else None

    same = (aten.view.default, aten._unsafe_view.default, aten.expand.default, aten.reshape.default)
    elementwise = (aten.clone.default, aten.alias.default, torch.ops.prims.convert_element_type.default)
    while (
        node.args
        and shape_of(node.args[0]) is not None
        and (
            node.target in elementwise  # a copy, or autocast's cast of the copy: element for element
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


def per_row_permutation(node: fx.Node, rows: Rows) -> tuple[int, ...] | None:
    """``perm`` where ``node`` is a transposed copy of one element per row (``row_permutation`` against the kept
    dims' shape: grouped-query attention's key gradient, summed over the repeated heads as (b, kv, s, d), copied to
    (b, s, kv, d) for the projection's GEMM): ``node``'s dim d is kept dim ``perm[d]``. None for anything else."""
    moved = row_permutation(node, rows.per_row()[0])
    return moved[0] if moved else None


def read_at_another_row(region, node: fx.Node, reductions: Sequence[fx.Node] = ()) -> Unsupported:
    """Reduction ``node`` is read at another row than the one its program reduces (Llama's rotary embedding after
    grouped-query attention's backward: the sum over the repeated heads, then ``rotate_half``'s backward reads its
    other half; Swin's LayerNorm backward before the reverse roll): :class:`SplitRegion` with ``node``, the region's
    ``reductions`` before it and their ancestors in the region as the first kernel, which stores them, and the rest as
    a second kernel, which loads them at any row (the reductions before it first: a LayerNorm backward's second sum
    reads the first's operand, so a first kernel of the later sum alone would strand the earlier one); a plain
    :class:`Unsupported` (the reduction runs as an aten call) where that first kernel would be the reduction alone (a
    lone op is no kernel). Inductor unrolls a reduction of at most 8 elements into a pointwise sum instead, read
    anywhere with no round trip: not done here."""
    why = f"{node.name} is read at another row than the one its program reduces"
    first = [r for r in region.nodes if r in reductions and region.nodes.index(r) < region.nodes.index(node)] + [node]
    need = upstream(first, region.members)
    if sum(not is_view_node(n) for n in need) < 2:
        return Unsupported(why, node)
    return SplitRegion(f"{why}: a first kernel stores it, a second reads it", node, first)


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
    if is_depthwise(n) or is_gather(n):  # a window sum (lower_windows.window_sum), an indexed read (lower_gathers)
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
        why = (
            f"the generator has a rule for {' and '.join(same)}, not for this overload"
            if same
            else "neither pointwise, a view, a cat, nor a sum/mean/amax/amin/var/var_mean"
        )
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
                if max(v.numel(), extent(v.shape, v.stride()) - 1) >= 2**31:  # the last element's index
                    raise Unsupported(f"{n.name} {tuple(v.shape)} needs 64-bit indexing; kernels index with int32")
                devices.add(v.device)
    if len(devices) > 1:
        raise Unsupported(f"tensors on several devices {sorted(map(str, devices))}")
