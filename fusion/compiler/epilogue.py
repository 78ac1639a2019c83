"""Where a convolution's epilogue runs (Phase 9's passes ``epilogue`` and ``conv_bias``).

* :func:`install_epilogues` — ``relu(conv(x, w) + b [+ z])`` as one cuDNN runtime-fusion call
  (:func:`fusion.kernels.cudnn.cudnn_conv_bias_relu` / :func:`~fusion.kernels.cudnn.cudnn_conv_bias_add_relu`: the
  one implementation ``ConvBiasReLU2d`` of Phase 4 runs too), where cuDNN takes the convolution;
* :func:`split_conv_bias` — a conv's bias as a pointwise ``add`` the generated kernel after it takes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.fxutils.finish import relint
from fusion.fxutils.meta import call_with_meta
from fusion.kernels.cudnn import CUDNN_DTYPES, cudnn_conv_bias_add_relu, cudnn_conv_bias_relu

aten = torch.ops.aten


def epilogue_problem(conv: fx.Node, grouped_reason: str) -> str | None:
    """Why ``conv`` (an ``aten.convolution`` node) cannot take the cuDNN epilogue, or None."""
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = conv.args
    xv, wv, out = x.meta["val"], w.meta["val"], conv.meta["val"]
    if transposed:
        return "a transposed convolution: cuDNN's fused op is a forward convolution"
    if groups != 1:
        return grouped_reason
    if out.dim() != 4:
        return f"a {out.dim() - 2}-d convolution: the fused op is 2-d"
    if out.device.type != "cuda":
        return f"on {out.device.type}: cuDNN runs on CUDA"
    if xv.dtype not in CUDNN_DTYPES or wv.dtype != xv.dtype:
        return f"dtypes {xv.dtype}/{wv.dtype}: cuDNN's fused op takes one of float16, bfloat16, float32"
    if b is not None and b.meta["val"].dtype != xv.dtype:
        return "the bias has another dtype than the input"
    return None


def _relu_chain(relu: fx.Node) -> tuple[fx.Node, fx.Node | None, fx.Node | None] | None:
    """(conv, add or None, z or None) when ``relu`` is ``relu(conv)`` or ``relu(conv + z)``, each its only user."""
    (src,) = relu.args[:1] or (None,)
    if not isinstance(src, fx.Node) or len(src.users) != 1:
        return None
    if src.target is aten.convolution.default:
        return src, None, None
    if src.target is aten.add.Tensor and len(src.args) == 2 and not src.kwargs:
        for conv, z in (src.args, src.args[::-1]):
            if (
                isinstance(conv, fx.Node)
                and conv.target is aten.convolution.default
                and len(conv.users) == 1
                and isinstance(z, fx.Node)
                and z is not conv
            ):
                zv, out = z.meta.get("val"), conv.meta["val"]
                if isinstance(zv, torch.Tensor) and zv.shape == out.shape and zv.dtype == out.dtype:
                    return conv, src, z
    return None


def install_epilogues(gm: fx.GraphModule, grouped_reason: str, note: Callable[..., None]) -> int:
    """Replace every ``relu(conv(x, w, b))`` and ``relu(conv(x, w, b) + z)`` that cuDNN can fuse; returns the count.

    ``note(pass, nodes, action, why)`` receives every decision, fused or skipped.
    """
    graph, count = gm.graph, 0
    for relu in list(graph.nodes):
        if relu.op != "call_function" or relu.target is not aten.relu.default:
            continue
        chain = _relu_chain(relu)
        if chain is None:
            continue
        conv, add, z = chain
        names = [n.name for n in (conv, add, relu) if n is not None]
        why = epilogue_problem(conv, grouped_reason)
        if why:
            note("cudnn epilogue", names, "skipped", why)
            continue
        x, w, b, stride, padding, dilation, _t, _op, groups = conv.args
        with graph.inserting_before(relu):
            if z is None:
                fused = graph.call_function(cudnn_conv_bias_relu, (x, w, b, stride, padding, dilation, groups))
            else:
                fused = graph.call_function(cudnn_conv_bias_add_relu, (x, w, b, z, stride, padding, dilation, groups))
        fused.meta["val"] = relu.meta["val"]
        relu.replace_all_uses_with(fused)
        for dead in (relu, add, conv):
            if dead is not None:
                graph.erase_node(dead)
        note("cudnn epilogue", names, "fused", fused.target.__name__)
        count += 1
    relint(gm)
    return count


# ----------------------------------------------------------------------------------------------------------------------
# Conv bias as a pointwise add, where a generated kernel can take it (pass ``conv_bias``)


def _fusible_readers(node: fx.Node) -> bool:
    """Does ``node``'s value reach a pointwise op or a reduction, directly or through views (ConvNeXt's permute)?"""
    for u in node.users:
        if u.op == "call_function" and isinstance(u.target, torch._ops.OpOverload):
            if torch.Tag.pointwise in u.target.tags or torch.Tag.reduction in u.target.tags:
                return True
            if is_view_node(u, getitem=False) and _fusible_readers(u):
                return True
    return False


def split_conv_bias(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """``convolution(x, w, b)`` whose output reaches a pointwise op or a reduction (through views too: ConvNeXt's
    permute before its LayerNorm) → ``convolution(x, w, None) + b.view(1, C, 1, …)``.

    ATen's cuDNN convolution adds its bias in a separate elementwise kernel (one more pass over the output). Split
    out as an aten ``add``, the bias joins the pointwise ops after the conv in one generated kernel (a depthwise
    conv's folded BatchNorm and its ReLU6, a projection conv's residual add): what Inductor does with conv biases.
    Convolutions already in the cuDNN epilogue are other nodes and stay as they are. Returns how many were split.
    """
    count = 0
    for conv in list(gm.graph.nodes):
        if conv.op != "call_function" or conv.target is not aten.convolution.default or conv.args[2] is None:
            continue
        if not _fusible_readers(conv):
            continue
        val, bias = conv.meta.get("val"), conv.args[2]
        bias_val = bias.meta.get("val") if isinstance(bias, fx.Node) else None
        if val is None or bias_val is None:
            continue
        shape = [1, -1] + [1] * (val.dim() - 2)
        with gm.graph.inserting_after(conv):
            view = call_with_meta(gm.graph, aten.view.default, (bias, shape))
        with gm.graph.inserting_after(view):
            add = call_with_meta(gm.graph, aten.add.Tensor, (conv, view))
        conv.replace_all_uses_with(add, delete_user_cb=lambda u, add=add: u is not add)
        conv.args = (conv.args[0], conv.args[1], None, *conv.args[3:])
        note("conv bias", [conv.name, add.name], "split", "the bias add joins the generated kernel after the conv")
        count += 1
    if count:
        relint(gm)
    return count
