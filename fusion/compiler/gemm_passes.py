"""GEMM rewrites behind ``fusion.backend``: the same products as fewer, larger or better-placed library calls.

* :func:`bmm_as_mm` (pass ``bmm_as_mm``): a ``bmm`` whose weight is one matrix expanded over the batch is one ``mm``.
* :func:`gemm_per_head` (pass ``gemm_heads``): a GEMM whose columns are split into heads and copied head-major (the
  ``.contiguous()`` of ``nn.MultiheadAttention``'s packed in-projection) is one GEMM per head, each writing its head
  where the copy would have put it: the copy is gone, and each head's bias is in its GEMM's epilogue.
* :func:`bias_after_gemm` (pass ``gemm_bias``, CPU): ``addmm(b, x, w)`` read only by pointwise ops is ``mm(x, w) + b``,
  the add a load of the kernel after it.
* :func:`conv1x1_as_mm` (passes ``conv1x1`` and, opt-in, ``conv1x1_forward``): the backward of a 1x1 convolution of
  a channels-last image is two ``mm`` (the forward one): the same products through cuBLAS, for less CPU per call
  than cuDNN's backward. The forward stays cuDNN's by default: measured slower as a GEMM in whole models.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.aten.nodes import same_layout as _same  # strides equal but for dims of size 1
from fusion.compiler.graph_passes import cheap_and_pure
from fusion.fxutils.finish import relint
from fusion.fxutils.meta import call_with_meta, refresh_meta

aten = torch.ops.aten


def bmm_as_mm(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """``bmm(a, w expanded over the batch)`` -> one ``mm`` over every row of ``a``: the same products, one GEMM.

    ``nn.MultiheadAttention(batch_first=True)``'s inference path (frozen parameters, as ViT runs it in the suite)
    projects its input transposed to (S, B, E), a layout that is not one (S·B, E) matrix, as a ``bmm`` with the
    weight expanded to (S, E, 3E) at batch stride 0. cuBLAS runs that as S small GEMMs: 76 µs per
    ViT-B/16 layer on an H100 against 34 µs for the same FLOPs as one GEMM (eager's linear folds it; Inductor does
    not: ``scripts/results/h100-2026-11-24-r2-profile_vit.log``). Rewritten: ``a`` copied in row order when it is
    not contiguous (a memory-bound copy the next kernel may absorb), one ``mm`` with the 2-D weight, a view back to
    the bmm's own (contiguous) shape. Returns the number rewritten."""
    count = 0
    for bmm in list(gm.graph.find_nodes(op="call_function", target=aten.bmm.default)):
        a, b = bmm.args
        av, bv = a.meta.get("val"), b.meta.get("val")
        if not isinstance(av, torch.Tensor) or not isinstance(bv, torch.Tensor) or bv.shape[0] < 2 or bv.stride(0):
            continue
        (batch, m, k), n = av.shape, bv.shape[2]
        g = gm.graph
        add = functools.partial(call_with_meta, g)
        with g.inserting_before(bmm):
            weight = add(aten.select.int, (b, 0, 0))  # (K, N): the one matrix every batch reads
            rows = (
                a if av.is_contiguous() else add(aten.clone.default, (a,), {"memory_format": torch.contiguous_format})
            )
            out = add(aten.view.default, (add(aten.mm.default, (add(aten.view.default, (rows, [batch * m, k])), weight)),
                                          [batch, m, n]))  # fmt: skip
        bmm.replace_all_uses_with(out)
        g.erase_node(bmm)
        note("bmm as mm", [bmm.name, out.name], "rewritten", f"one ({batch * m}, {k}) x ({k}, {n}) GEMM, not {batch}")
        count += 1
    if count:
        relint(gm)
    return count


def bias_after_gemm(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """On a CPU, ``addmm(b, x, w)`` whose every reader is a pointwise op (through views) -> ``add(mm(x, w), b)``: the
    add then joins the generated kernel of its readers (pass ``reorder`` puts it beside them).

    aten's CPU ``addmm`` copies the bias into every row of its output, then runs the GEMM with beta = 1, which reads
    that output back before it writes it: two passes over the output that ``mm`` does not make. The bias is one more
    (small) load of the kernel that reads the GEMM's output anyway: BERT's feed-forward and output projections, GPT-2's
    ``Conv1D``, ViT's MLP. The sum is the same, the bias added once at the end; float32 and float64 only: a half-type
    ``mm`` rounds its output before the add (a second rounding: 1-ulp bf16 differences from eager, measured).
    Inductor makes this rewrite on GPUs (``unfuse_bias_add_to_pointwise``); there cuBLAS adds the bias in its
    epilogue, so ours stays CPU-only. Kept where any reader is not pointwise (a GEMM, attention, the graph's output):
    the add would be a kernel of its own. Returns the number rewritten."""
    g, done = gm.graph, []
    for node in list(g.find_nodes(op="call_function", target=aten.addmm.default)):
        val, bias = node.meta.get("val"), node.args[0]
        bval = bias.meta.get("val") if isinstance(bias, fx.Node) else None
        if node.kwargs or not isinstance(val, torch.Tensor) or val.device.type != "cpu":
            continue  # scaled (alpha, beta), or on a GPU: cuBLAS's epilogue adds the bias
        if (
            val.dtype not in (torch.float32, torch.float64)
            or not isinstance(bval, torch.Tensor)
            or bval.dtype != val.dtype
        ):
            continue  # a half type: mm's output is rounded to it before the add, a second rounding addmm does not make
        if not _pointwise_readers(node):
            continue
        with g.inserting_after(node):
            mm = call_with_meta(g, aten.mm.default, tuple(node.args[1:]))
        with g.inserting_after(mm):
            out = call_with_meta(g, aten.add.Tensor, (mm, bias))
        if out.meta["val"].shape != val.shape or out.meta["val"].stride() != val.stride():
            g.erase_node(out)
            g.erase_node(mm)
            continue
        node.replace_all_uses_with(out)
        g.erase_node(node)
        done.append(node.name)
    if done:
        relint(gm)
        note(
            "gemm bias", done, "rewritten", "the bias added by the kernel reading the GEMM (CPU addmm copies it first)"
        )
    return len(done)


def _pointwise_readers(node: fx.Node) -> bool:
    """Is every reader of ``node`` a pointwise op (or a gathered read), through views, and is there one?"""
    stack, found = list(node.users), False
    while stack:
        user = stack.pop()
        if user.op != "call_function" or not cheap_and_pure(user):
            return False
        if is_view_node(user, getitem=False):
            if not user.users:
                return False
            stack += user.users
        else:
            found = True
    return found


def gemm_per_head(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """A GEMM's output split into ``k`` heads along its columns and copied head-major -> ``k`` GEMMs, one per head.

    ``nn.MultiheadAttention`` projects q, k and v with one packed weight (3E, E), then ``.contiguous()`` copies the
    result head-major, (S, B, 3E) -> (3, S, B, E), and reads q, k, v as ``[0]``, ``[1]``, ``[2]`` (its
    ``_in_projection_packed``). That copy is a whole read and write of the projection: on ViT-B/16 (H100, bf16, batch
    32) our bias-add-and-copy kernel took 29.6 µs a layer, 355 µs a call, while eager's fast path reads q, k and v as
    strided views and copies nothing. Rewritten: head ``i`` is ``addmm(bias[i], x, W[:, i])`` (``mm`` without a bias),
    whose output is laid out exactly as ``clone[i]`` (rows in the same order, contiguous): each ``select(clone, 0,
    i)`` reads it instead. The same products and FLOPs; the bias rounds once, in the GEMM's epilogue.

    Taken where the copy's only readers are those selects, the GEMM (``mm``, ``addmm``, or ``mm`` + a bias ``add`` over
    its last dim, through views) feeds nothing but the copy, and the copy's layout is head-major over the GEMM's
    rows: the head dim of stride E outermost, the rows in the GEMM's order, the E columns innermost. Returns the
    number rewritten."""
    count = 0
    for clone in list(gm.graph.find_nodes(op="call_function", target=aten.clone.default)):
        found = _heads_of_one_gemm(clone)
        if found is None:
            continue
        chain, a, w, bias, n = found
        g, add = gm.graph, functools.partial(call_with_meta, gm.graph)
        selects = list(clone.users)
        with g.inserting_before(clone):  # a, w and bias come before the copy's input chain
            for select in selects:
                i = select.args[2] % (w.meta["val"].shape[1] // n)
                w_i = add(aten.slice.Tensor, (w, 1, i * n, (i + 1) * n))
                out = (add(aten.addmm.default, (add(aten.slice.Tensor, (bias, 0, i * n, (i + 1) * n)), a, w_i))
                       if bias is not None else add(aten.mm.default, (a, w_i)))  # fmt: skip
                head = add(aten.view.default, (out, list(select.meta["val"].shape)))
                select.replace_all_uses_with(head)
                _refresh_views(head)  # the views after it: same strides, another storage (offset 0, not clone[i]'s)
        for dead in [*selects, clone, *chain]:  # the copy and the views and GEMM that only fed it
            g.erase_node(dead)
        note("gemm per head", [clone.name], "rewritten", f"{len(selects)} GEMMs write the heads: the copy is gone")
        count += 1
    if count:
        relint(gm)
    return count


def _refresh_views(node: fx.Node) -> None:
    """Recompute ``meta["val"]`` of the views that read ``node`` (and the views of those): a later stage turns a view
    chain into strides and an offset into its base, read off these fake values."""
    stack = [u for u in node.users if is_view_node(u, getitem=False)]
    while stack:
        view = stack.pop()
        refresh_meta(view)
        stack += [u for u in view.users if is_view_node(u, getitem=False)]


def _heads_of_one_gemm(clone: fx.Node):
    """``(chain, a, w, bias, n)`` when ``clone`` is a head-major copy of one GEMM ``a @ w (+ bias)`` that
    :func:`gemm_per_head` can rewrite (``chain``: the views and the GEMM that only feed the copy, dead once it is gone;
    ``n``: a head's width); None otherwise."""
    val = clone.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.is_contiguous():
        return None
    if clone.kwargs.get("memory_format") not in (None, torch.contiguous_format):
        return None
    if not clone.users or any(u.target is not aten.select.int or u.args[1] != 0 for u in clone.users):
        return None
    chain, node = _views_back(clone.args[0])
    gemm = _gemm(node)
    if gemm is None:
        return None
    covered, a, w, bias = gemm
    out, src = node.meta["val"], clone.args[0].meta["val"]
    (m, _), big_n = a.meta["val"].shape, w.meta["val"].shape[1]
    if not out.is_contiguous() or out.numel() != m * big_n or src.storage_offset() != out.storage_offset():
        return None
    dims = [(size, stride) for size, stride in zip(src.shape, src.stride(), strict=True) if size != 1]
    if len(dims) < 3 or dims[-1][1] != 1:
        return None
    (k, n), rows = dims[0], dims[1:-1]
    if k < 2 or k * n != big_n or dims[-1][0] != n:
        return None
    expected = big_n  # the rows in the GEMM's order: the innermost row dim of stride N, each outer one the product
    for size, stride in reversed(rows):
        if stride != expected:
            return None
        expected *= size
    return ([*chain, *covered], a, w, bias, n) if expected == m * big_n else None


def _views_back(node: object) -> tuple[list[fx.Node], object]:
    """The views from ``node`` back to the first node that is not a view, each read by nothing else; and that node."""
    chain = []
    while isinstance(node, fx.Node) and is_view_node(node, getitem=False) and len(node.users) == 1:
        chain.append(node)
        node = node.args[0]
    return chain, node


def _gemm(node: object):
    """``(nodes, a, w, bias or None)`` for ``mm(a, w)``, ``addmm(bias, a, w)`` (no scaling) or ``add(views of
    mm(a, w), bias)``, read by one node, with a bias of the output's last size, all of one dtype (``nodes``: the GEMM,
    and the add and views); None otherwise."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or len(node.users) != 1 or node.kwargs:
        return None
    dtype = node.meta["val"].dtype
    if node.target is aten.mm.default:
        return [node], *node.args, None
    if node.target is aten.addmm.default and _is_row_bias(node.args[0], node, dtype):
        return [node], node.args[1], node.args[2], node.args[0]
    if node.target is aten.add.Tensor:
        for x, bias in (node.args, node.args[::-1]):
            views, mm = _views_back(x)
            if (isinstance(mm, fx.Node) and mm.target is aten.mm.default and len(mm.users) == 1 and not mm.kwargs
                    and mm.meta["val"].dtype == dtype and _is_row_bias(bias, node, dtype)):  # fmt: skip
                return [node, *views, mm], *mm.args, bias
    return None


def _is_row_bias(bias: object, out: fx.Node, dtype) -> bool:
    """A 1-D tensor of the output's last size and dtype (what a GEMM's epilogue adds to every row)."""
    val = bias.meta.get("val") if isinstance(bias, fx.Node) else None
    last = out.meta["val"].shape[-1]
    return isinstance(val, torch.Tensor) and tuple(val.shape) == (last,) and val.dtype == dtype


def conv1x1_as_mm(gm: fx.GraphModule, note: Callable[..., None], *, forward: bool = True, backward: bool = True) -> int:
    """A 1x1 convolution (stride 1, no padding, one group) of a channels-last image -> one GEMM (``forward``), and
    its ``convolution_backward`` -> two GEMMs and a ``sum`` for the bias (``backward``).

    In channels-last memory an (N, C, H, W) image is the (N·H·W, C) matrix ``X``, row-major; a 1x1 convolution with
    weight (K, C, 1, 1) is ``X @ W.T``, written as the (N·H·W, K) matrix that *is* the (N, K, H, W) channels-last
    output. Backward: ``dX = dY @ W``, ``dW = dY.T @ X``, ``db = dY.sum(0)``. The same products, only views around
    them. Why: a CPU-bound graph pays per library call. Measured on an H100 host (``scripts/archive/gpu_probe_conv1x1.py``,
    bf16, the suite's shapes): the forward 19-32 µs of CPU a call against cuDNN's 26-35, the backward's two GEMMs
    37-72 µs against ``convolution_backward``'s 49-97, GPU time the same within a few µs either way. EfficientNet-B0
    has 65 such convolutions a call, ResNet-50 33 (and as many in its backward). Inductor has the same rewrite
    behind ``torch._inductor.config.conv_1x1_as_mm`` (off by default).

    The backend runs the backward half by default (pass ``conv1x1``) and the forward half only on request (pass
    ``conv1x1_forward``): in whole models the forward GEMMs lost what the probe said they would save. Three CPU-bound
    inference rows, 25 interleaved rounds in one process each (H100, ``scripts/results/…-am-…``): ResNet-50
    2.449 ms with the forward rewrite against 2.286 without, MobileNetV2 2.277 vs 2.096, EfficientNet-B0 3.722 vs
    3.409. The probe timed a bare ``mm`` against a bare convolution (0-5 µs less CPU); in a graph each GEMM also
    brings the views around it into the call, and the profiled ResNet-50 call with its 33 GEMMs issued 16 memsets
    against 7 for Inductor's all-cuDNN call: more than the probe's few µs.

    Taken only where the views are exact: the input (and the gradient) channels-last dense, the output laid out as
    the GEMM writes it. On a GPU a float32 convolution stays cuDNN's unless float32 matmuls may use TF32 as cuDNN's
    convolutions do (``torch.set_float32_matmul_precision("high")``): a full-precision GEMM would be several times
    slower. Returns the number rewritten."""
    count = 0
    g = gm.graph
    add = functools.partial(call_with_meta, g)
    for conv in list(g.nodes):
        shapes = _conv1x1_shapes(conv)
        if shapes is None or not (forward if shapes[0] else backward):
            continue
        is_forward, x, w, (n, c, h, wd, k) = shapes
        with g.inserting_before(conv):
            weight = add(aten.select.int, (add(aten.select.int, (w, 3, 0)), 2, 0))  # (K, C)
            rows = add(aten.view.default, (add(aten.permute.default, (x, [0, 2, 3, 1])), [n * h * wd, c]))  # (NHW, C)
            if is_forward:  # y = X @ W.T (+ b)
                bias, wt = conv.args[2], add(aten.permute.default, (weight, [1, 0]))
                mm = add(aten.addmm.default, (bias, rows, wt)) if bias is not None else add(aten.mm.default, (rows, wt))
                conv.replace_all_uses_with(_as_image(add, mm, n, h, wd, k))
            else:  # dX = dY @ W, dW = dY.T @ X, db = dY.sum(0)
                dy = add(aten.view.default, (add(aten.permute.default, (conv.args[0], [0, 2, 3, 1])), [n * h * wd, k]))
                for item in list(conv.users):
                    i = item.args[1] if item.users else None  # None: a getitem nothing reads
                    if i is None:
                        g.erase_node(item)
                        continue
                    if i == 0:
                        out = _as_image(add, add(aten.mm.default, (dy, weight)), n, h, wd, c)
                    elif i == 1:
                        dw = add(aten.mm.default, (add(aten.permute.default, (dy, [1, 0])), rows))
                        out = add(aten.view.default, (dw, [k, c, 1, 1]))
                    else:
                        out = add(aten.sum.dim_IntList, (dy, [0]))
                    item.replace_all_uses_with(out)
                    g.erase_node(item)
        g.erase_node(conv)
        what = "one GEMM" if is_forward else "backward: GEMMs"
        note("conv1x1 as mm", [conv.name], "rewritten", f"({n * h * wd}, {c}) x ({c}, {k}), {what}")
        count += 1
    if count:
        relint(gm)
    return count


def conv1x1_backward_as_mm(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """Pass ``conv1x1``: :func:`conv1x1_as_mm` on the backward convolutions only."""
    return conv1x1_as_mm(gm, note, forward=False)


def conv1x1_forward_as_mm(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """Pass ``conv1x1_forward`` (opt-in): :func:`conv1x1_as_mm` on the forward convolutions only."""
    return conv1x1_as_mm(gm, note, backward=False)


def _conv1x1_shapes(conv: fx.Node):
    """``(forward, x, w, (N, C, H, W, K))`` for a convolution or its backward that :func:`conv1x1_as_mm` can
    rewrite; None otherwise."""
    if conv.op != "call_function" or conv.target not in (aten.convolution.default, aten.convolution_backward.default):
        return None
    forward = conv.target is aten.convolution.default
    x, w = conv.args[:2] if forward else conv.args[1:3]
    stride, padding, dilation, transposed, _, groups = conv.args[3:9] if forward else conv.args[4:10]
    xv, wv = (a.meta.get("val") if isinstance(a, fx.Node) else None for a in (x, w))
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor) or xv.dim() != 4 or wv.dim() != 4:
        return None
    if tuple(wv.shape[2:]) != (1, 1) or transposed or groups != 1 or xv.dtype != wv.dtype:
        return None
    if any(s != 1 for s in (*stride, *dilation)) or any(p != 0 for p in padding):
        return None
    if xv.dtype == torch.float32 and xv.device.type == "cuda" and torch.get_float32_matmul_precision() == "highest":
        return None  # cuDNN's float32 convolution may use TF32; a float32 GEMM here would not: several times slower
    (n, c, h, wd), k = xv.shape, wv.shape[0]
    if not xv.numel() or not _channels_last(xv):
        return None
    image = lambda ch: (h * wd * ch, 1, wd * ch, ch)  # noqa: E731 - the strides of the GEMM's output as an image
    if forward:
        out = conv.meta.get("val")
        ok = isinstance(out, torch.Tensor) and _same(out, image(k))
        ok = ok and (conv.args[2] is None or conv.args[2].meta["val"].dtype == out.dtype)
    else:
        dy, vals = conv.args[0].meta.get("val"), conv.meta.get("val")
        want = {0: image(c), 1: (c, 1, 1, 1), 2: (1,)}
        ok = isinstance(dy, torch.Tensor) and _channels_last(dy) and dy.dtype == xv.dtype
        read = [u for u in conv.users if u.users or u.target is not operator.getitem]
        ok = ok and bool(read) and all(u.target is operator.getitem and isinstance(vals[u.args[1]], torch.Tensor)
                                       and _same(vals[u.args[1]], want[u.args[1]]) for u in read)  # fmt: skip
    return (forward, x, w, (n, c, h, wd, k)) if ok else None


def _channels_last(val: torch.Tensor) -> bool:
    """Is a 4-D (N, C, H, W) tensor the dense (N·H·W, C) matrix, row-major (size-1 dims' strides aside)?"""
    n, c, h, w = val.shape
    return _same(val, (h * w * c, 1, w * c, c))


def _as_image(add: Callable, mm: fx.Node, n: int, h: int, w: int, k: int) -> fx.Node:
    """The (N·H·W, K) GEMM output as the (N, K, H, W) channels-last image it is."""
    return add(aten.permute.default, (add(aten.view.default, (mm, [n, h, w, k])), [0, 3, 1, 2]))
