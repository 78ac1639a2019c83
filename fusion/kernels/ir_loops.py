"""Loop transformations on the kernel IR (``fusion.ir.kernel_ir``) before a renderer writes it: the same values
computed in the same order, in loops a compiler vectorizes better. Device-neutral records in, records out; the C
renderer (``fusion.kernels.c_render``) applies both.

* :func:`coalesce` — neighbouring loops that every index walks as one contiguous range become one loop (a channel's
  7x7 feature map one loop of 49: long enough for SIMD lanes).
* :func:`one_walk` — a walk of a row joins the walk before it when it reads nothing that walk defines and folds
  nothing, or both fold sums only (squeeze-excitation's values stored and their mean folded in one pass; a
  LayerNorm's weight and bias gradients summed, and its input gradient stored, in one pass).
* :func:`invariant` / :func:`hoist` — what a loop's body computes the same at every step (a channel's BatchNorm
  scale, ``rsqrt(var + eps)``; a squeeze-excite gate, ``sigmoid(s[c])``) computed once before the loop: a sum over a
  row no longer takes a square root and a division per element (gcc hoists them out of a plain loop, not out of a
  blocked ``omp simd`` sum).
* :func:`cse` — a value computed twice (the same op of the same values, a load of the same element) computed once:
  after :func:`one_walk` the stored ``silu(bn(x))`` and the one folded into its mean are the same expression.
* :func:`prologue` — what varies along the innermost loop only (a channels-last image's per-channel scale) computed
  once per value of that loop, before the loops, into small arrays the body reads.
* :func:`transposed` / :func:`tile` — a pointwise walk that reads an input across its layout (a copy of ``k.mT``)
  as tiles: the innermost loop split into blocks of lanes, its block index moved outside the loop its loads walk
  contiguously (the Triton renderer's transposed walk).
"""

from __future__ import annotations

import dataclasses

from fusion.ir import kernel_ir as ir

PROLOGUE_MAX = 16384  # elements of a prologue's arrays (64 KiB of float32 on the stack)
TILE_LANES = 64  # a transposed walk's lanes a program: what its stores write contiguously
TILE_MIN = 16  # the shortest loops a transposed walk tiles (a warp's loads: whole 32-byte sectors of half floats)


def _affines(s) -> list[ir.Affine]:
    if isinstance(s, (ir.Load, ir.Store)):
        return [s.offset]
    return [s.expr] if isinstance(s, ir.Index) else []


def coef(e: ir.Affine, var: str) -> int:
    """The coefficient of loop variable ``var`` in ``e``'s plain terms (not under a ``//`` or ``%``)."""
    return sum(c for c, atom in e.terms if atom == ir.Var(var))


def _drop(e: ir.Affine, var: str) -> ir.Affine:
    return ir.Affine(tuple(t for t in e.terms if t[1] != ir.Var(var)), e.const)


def _fuse(loops: tuple[ir.Loop, ...], exprs: list[ir.Affine]) -> tuple[tuple[ir.Loop, ...], set[str]]:
    """``loops`` with each pair of neighbours that every index walks as one loop (``a`` outer, ``b`` inner: ``a``'s
    coefficient is ``b``'s times ``b``'s size in every expression, neither under a ``//`` or ``%``) made one loop:
    ``b`` over ``a.size * b.size`` elements; the merged-away variables."""
    out, gone = list(loops), set()
    for i in range(len(out) - 2, -1, -1):
        a, b = out[i], out[i + 1]
        nested = any(
            {a.var, b.var} & atom.of.variables() for e in exprs for _, atom in e.terms if not isinstance(atom, ir.Var)
        )
        if nested or any(coef(e, a.var) != coef(e, b.var) * b.size for e in exprs):
            continue
        out[i : i + 2] = [ir.Loop(b.var, a.size * b.size)]
        exprs[:] = [_drop(e, a.var) for e in exprs]
        gone.add(a.var)
    return tuple(out), gone


def coalesce(k: ir.Kernel) -> ir.Kernel:
    """``k`` with neighbouring loops that every index walks contiguously merged into one (kept loops among
    themselves, reduce loops among themselves): a channel's 7x7 feature map is one loop of 49, so the innermost loop
    is long enough to run in SIMD lanes (a loop of 7 never reaches gcc's vector body: EfficientNet-B0's 7x7 and
    14x14 maps ran scalar, 3-4 ns an element). A sum's blocks then span the merged row (blocks of :data:`SUM_BLOCK`
    of the whole row, added pairwise), as a contiguous row's do. The values computed are the same; only the
    loops' shape changes."""
    exprs = [e for s in k.statements() for e in _affines(s)]
    loops, gone = _fuse(k.loops, exprs)
    reduce_loops, gone_r = _fuse(k.reduce_loops, exprs)
    gone |= gone_r
    if not gone:
        return k

    def rewrite(s):
        if isinstance(s, ir.ReduceLoop):
            return ir.ReduceLoop(tuple(rewrite(t) for t in s.body))
        if isinstance(s, (ir.Load, ir.Store)):
            e = s.offset
            for v in gone:
                e = _drop(e, v)
            return dataclasses.replace(s, offset=e)
        if isinstance(s, ir.Index):
            e = s.expr
            for v in gone:
                e = _drop(e, v)
            return dataclasses.replace(s, expr=e)
        return s

    body = tuple(rewrite(s) for s in k.body)
    return dataclasses.replace(k, loops=loops, reduce_loops=reduce_loops, body=body)


def _uses(s) -> set[str]:
    if isinstance(s, ir.ReduceLoop):
        return set().union(*map(_uses, s.body)) if s.body else set()
    if isinstance(s, ir.Op):
        return set(s.args)
    if isinstance(s, ir.Load):
        return ({s.mask} if s.mask else set()) | {v for v, _, _ in s.indirect}
    if isinstance(s, (ir.Store, ir.Reduce)):
        return {s.value}
    return set()


def _defines(s) -> set[str]:
    if isinstance(s, ir.ReduceLoop):
        return set().union(*map(_defines, s.body)) if s.body else set()
    return {s.out} if hasattr(s, "out") else set()


def _folds(walk: ir.ReduceLoop) -> set[str]:
    return {s.op for s in walk.body if isinstance(s, ir.Reduce)}


def one_walk(k: ir.Kernel) -> ir.Kernel:
    """``k`` with a walk of the row joined to the walk before it when it reads nothing that walk or the statements
    between them define (a folded row's mean), and either folds nothing or both walks fold sums only (sibling sums).
    Squeeze-excite's ``y = silu(bn(x))`` stored and ``y.mean((2, 3))`` folded in one pass over ``x``, where two passes
    computed ``y`` twice (the exp and the division); gcc computes the repeated expressions once. A looped Triton
    reduction reads its inputs once instead of once a walk: a bias gradient's sum and the values it sums stored
    (GELU's backward), a LayerNorm's weight and bias gradients. Each store and each fold sees the same values in the
    same order as before: a fold's blocks are the row's, whatever else the walk computes. The statements between
    the two walks (a fold's result stored) stay after the joined walk. Folds of other kinds stay apart (a renderer
    folds a walk of sums only in blocks: a max beside them would change how the sums are added)."""
    body = list(k.body)
    i = 0
    while i < len(body):
        if isinstance(body[i], ir.ReduceLoop):
            j, between = i + 1, set()
            while j < len(body) and not isinstance(body[j], ir.ReduceLoop):
                between |= _defines(body[j])
                j += 1
            later = body[j] if j < len(body) else None
            if (
                later is not None
                and (not _folds(later) or _folds(body[i]) | _folds(later) == {"sum"})
                and not _uses(later) & (between | _defines(body[i]))
            ):
                body[i] = ir.ReduceLoop((*body[i].body, *later.body))
                del body[j]
                continue
        i += 1
    return k if len(body) == len(k.body) else dataclasses.replace(k, body=tuple(body))


def cse(k: ir.Kernel) -> ir.Kernel:
    """``k`` with each statement that repeats an earlier one it can see (an op of the same values and dtype, a
    constant, an index, a load of the same element with the same mask and no store between) dropped and its uses
    renamed to the earlier value. A walk of the row sees the statements before it, not another walk's. The values are
    the same: every op of the IR is a pure function of its arguments. After :func:`one_walk`, gcc did not merge the
    two ``exp``s of squeeze-excite's joined walk (a mean kernel ran at half a pointwise kernel's speed)."""
    rename: dict[str, str] = {}

    def key(s) -> tuple | None:
        if isinstance(s, ir.Op):
            return ("op", s.op, tuple(rename.get(a, a) for a in s.args), s.dtype)
        if isinstance(s, ir.Const):
            return ("const", type(s.value).__name__, repr(s.value), s.dtype)  # repr: -0.0 and nan stay apart
        if isinstance(s, ir.Index):
            return ("index", s.expr)
        if isinstance(s, ir.Load):
            return ("load", s.buffer, s.offset, s.dtype, rename.get(s.mask, s.mask), renamed(s.indirect))
        return None

    def renamed(indirect: tuple) -> tuple:
        return tuple((rename.get(v, v), n, st) for v, n, st in indirect)

    def without_loads(seen: dict) -> dict:  # a load after a store reads memory again
        return {k: v for k, v in seen.items() if k[0] != "load"}

    def walk(body, seen: dict) -> list:
        out = []
        for s in body:
            if isinstance(s, ir.ReduceLoop):
                out.append(ir.ReduceLoop(tuple(walk(s.body, dict(seen)))))
                if any(isinstance(t, ir.Store) for t in s.body):
                    seen = without_loads(seen)
                continue
            if isinstance(s, ir.Store):
                seen = without_loads(seen)
                out.append(dataclasses.replace(s, value=rename.get(s.value, s.value)))
                continue
            if isinstance(s, ir.Reduce):
                out.append(dataclasses.replace(s, value=rename.get(s.value, s.value)))
                continue
            k_ = key(s)
            if k_ is not None and k_ in seen:
                rename[s.out] = seen[k_]
                continue
            if isinstance(s, ir.Op):
                s = dataclasses.replace(s, args=tuple(rename.get(a, a) for a in s.args))
            elif isinstance(s, ir.Load) and (s.mask or s.indirect):
                s = dataclasses.replace(s, mask=rename.get(s.mask, s.mask), indirect=renamed(s.indirect))
            if k_ is not None:
                seen[k_] = s.out
            out.append(s)
        return out

    body = tuple(walk(k.body, {}))
    return dataclasses.replace(k, body=body) if rename else k


def invariant(body, over: set[str]) -> tuple[list, list]:
    """(the statements of ``body`` that read none of the loop variables ``over``, directly or through a value
    defined in ``body``; the rest), each list in the body's order. A store and a fold stay in the loop."""
    hoisted, kept, varying = [], [], set()
    for s in body:
        moves = isinstance(s, (ir.Load, ir.Index, ir.Const, ir.Op)) and not (_uses(s) & varying)
        moves = moves and not any(e.variables() & over for e in _affines(s))
        if moves:
            hoisted.append(s)
        else:
            kept.append(s)
            varying |= _defines(s)
    return hoisted, kept


def hoist(k: ir.Kernel) -> ir.Kernel:
    """``k`` with each walk of a row computing what reads no reduce variable once per row, before the walk (the same
    values: only where they are computed moves). A row of no element keeps its body (a load moved out would run)."""
    if k.kind != "reduction" or not k.reduce_loops or any(lp.size <= 0 for lp in k.reduce_loops):
        return k
    over, body, moved = {lp.var for lp in k.reduce_loops}, [], False
    for s in k.body:
        if isinstance(s, ir.ReduceLoop):
            out, kept = invariant(s.body, over)
            moved |= bool(out)
            body += [*out, ir.ReduceLoop(tuple(kept))]
        else:
            body.append(s)
    return dataclasses.replace(k, body=tuple(body)) if moved else k


def _gathered(s, var: str) -> bool:
    """Does load ``s`` read the innermost loop's variable under a ``//`` or ``%`` (Llama's rotary frequencies,
    ``f[x % 32]`` along a head's 64 lanes)? Such a loop needs vector gathers, which gcc's tuning for recent Intel
    CPUs leaves out (the loop then runs scalar, libm calls included); read back from a prologue's array, the lanes
    are contiguous."""
    return isinstance(s, ir.Load) and any(
        not isinstance(atom, ir.Var) and var in atom.of.variables() for _, atom in s.offset.terms
    )


def prologue(body, loops: tuple[ir.Loop, ...], limit: int = PROLOGUE_MAX) -> tuple[list, list, list]:
    """A pointwise kernel's values that vary along the innermost loop only (a channels-last image's per-channel
    BatchNorm scale ``rsqrt(var[c] + eps)``, read where ``c`` is innermost) computed once for all ``c`` before the
    loops instead of once per element: (the statements to run in a loop over the innermost variable, the values to
    keep in arrays over it, the body with those values read back from the arrays as loads of ``<name>_a``). Taken
    only where such a value is computed (an op, not a plain load) or gathered (:func:`_gathered`), the outer loops
    run at least once (the prologue's loads run only where the body's would), and the arrays stay within ``limit``
    elements. The values are the same."""
    if len(loops) < 2 or loops[-1].size > limit or any(lp.size <= 0 for lp in loops):
        return [], [], list(body)
    inner = loops[-1]
    pre, kept = invariant(body, {lp.var for lp in loops[:-1]})
    constant = {id(s) for s in invariant(pre, {inner.var})[0]}
    varying = [s for s in pre if id(s) not in constant]
    needed = set().union(*map(_uses, kept)) if kept else set()
    arrays = [s for s in varying if s.out in needed]
    if not any(isinstance(s, ir.Op) or _gathered(s, inner.var) for s in varying) or len(arrays) * inner.size > limit:
        return [], [], list(body)
    walk = ir.Affine(((1, ir.Var(inner.var)),), 0)
    reads = [ir.Load(s.out, f"{s.out}_a", walk, getattr(s, "dtype", "int64")) for s in arrays]
    moved = {id(s) for s in varying}
    return pre, arrays, [*reads, *(s for s in body if id(s) not in moved)]


def transposed(k: ir.Kernel) -> bool:
    """Is pointwise ``k`` (its loops coalesced) a transposed walk: a load whose elements lie contiguously along the
    second-innermost loop ``y`` and scattered along the innermost ``x``, the loop every store walks contiguously
    (a copy of ``k.mT``: walked in the output's order, each lane of a warp reads its own sector)? Both loops at least
    :data:`TILE_MIN` long, ``x`` at most :data:`TILE_LANES` or a multiple of it, no gathered load, and neither loop
    under a ``//`` or ``%`` (:func:`tile` substitutes plain variables only)."""
    if k.kind != "pointwise" or len(k.loops) < 2 or k.checks_indices():
        return False
    y, x = k.loops[-2], k.loops[-1]
    if min(y.size, x.size) < TILE_MIN or (x.size > TILE_LANES and x.size % TILE_LANES):
        return False
    exprs = [e for s in k.statements() for e in _affines(s)]
    if any(not isinstance(a, ir.Var) and {x.var, y.var} & a.of.variables() for e in exprs for _, a in e.terms):
        return False
    loads = [s for s in k.statements() if isinstance(s, ir.Load)]
    return any(coef(s.offset, y.var) == 1 and coef(s.offset, x.var) > 1 for s in loads)


def tile(k: ir.Kernel) -> ir.Kernel:
    """Transposed walk ``k`` with its innermost loop ``x`` split as ``x = TILE_LANES * xb + xi`` and ``xb`` moved
    outside ``y``: loops ``(..., xb, y, xi)``. Walked as rows ``(..., xb, y)`` by lanes ``xi``, neighbouring rows are
    neighbouring ``y`` (the transposed load reads them contiguously) and a row's lanes neighbouring ``x`` (the stores
    write them contiguously). Every element is computed once, by the same expression: only the loops' shape
    changes. An ``x`` of at most TILE_LANES is one block already: ``k`` itself."""
    *outer, y, x = k.loops
    if x.size <= TILE_LANES:
        return k
    used = [int(lp.var[1:]) for lp in (*k.loops, *k.reduce_loops) if lp.var[1:].isdigit()]
    n = max(used, default=0) + 1
    xb, xi = f"x{n}", f"x{n + 1}"

    def split(e: ir.Affine) -> ir.Affine:
        terms: list = []
        for c, a in e.terms:
            terms += [(c * TILE_LANES, ir.Var(xb)), (c, ir.Var(xi))] if a == ir.Var(x.var) else [(c, a)]
        return ir.Affine(tuple(terms), e.const)

    def rewrite(s):
        if isinstance(s, (ir.Load, ir.Store)):
            return dataclasses.replace(s, offset=split(s.offset))
        if isinstance(s, ir.Index):
            return dataclasses.replace(s, expr=split(s.expr))
        return s

    loops = (*outer, ir.Loop(xb, x.size // TILE_LANES), y, ir.Loop(xi, TILE_LANES))
    return dataclasses.replace(k, loops=loops, body=tuple(rewrite(s) for s in k.body))
