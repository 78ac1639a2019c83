"""Pass ``channels_last``: a CPU inference graph's 2-D convolutions read their images channels-last.

On a CPU, aten's convolution runs oneDNN (MKL-DNN), whose kernels want an image laid out (N, H, W, C): given an
NCHW image it reorders the image into its own layout and back around every call. Given a channels-last image it
reads it as it is and writes a channels-last output, which every pointwise op after it (the generated kernels too)
keeps, so the next convolution gets channels-last again. Inductor makes this choice for every CPU graph with a
convolution (``GraphLowering.decide_layout_opt``); we make it where it pays. The price: aten copies every weight
that is not already channels-last (a 3x3 one; a 1x1 or depthwise weight is both layouts) on every call, so a graph
whose convolutions' weights outweigh their images (ResNet at batch 1: 5x) stays NCHW (:data:`WEIGHT_SHARE`).

The rewrite: walk the graph in order; before each 4-D convolution whose image is not channels-last, one
``clone(memory_format=channels_last)`` (a copy kernel; after the first convolution the layout carries itself, so a
network gets one or two); every node after it gets its fake value again, so the stages after this pass read the new
strides. An output whose layout the rewrite changed is copied back to the layout eager returns (the caller sees
eager's strides). The values are the same up to the order oneDNN sums a window in (float32: ~1 ulp of a sum).

Refused, with the reason in the report: weights heavier than :data:`WEIGHT_SHARE` of the images, a graph on a GPU (cuDNN chooses per call; the GPU suite measured its own
layouts), float64 (oneDNN has no float64 kernels: aten's slow path), an output whose old layout is neither
contiguous nor channels-last (no one copy restores it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode

from fusion.compiler import passes
from fusion.fxutils.finish import relint
from fusion.fxutils.meta import tensor_val

aten = torch.ops.aten
CONV = aten.convolution.default
# Given a channels-last image, aten's convolution copies an NCHW weight to channels-last on every call (a 1x1 or
# depthwise weight is both layouts at once: no copy). Eager, one thread, batch 1, 2026-11-27: with weight bytes at
# 0-0.14 of the images' bytes (MobileNetV2, EfficientNet-B0, DenseNet-121) channels-last ran 1.10x faster; at 0.55
# (ConvNeXt-T) the same; at 1.06 (ResNet-50) 0.79x; at 5.0 (ResNet-18) 0.70-1.07x, moving with the allocator's state.
WEIGHT_SHARE = 0.25
DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # oneDNN's; float64 takes aten's slow path


def _bytes(node: object) -> int:
    v = tensor_val(node)
    return v.numel() * v.element_size() if v is not None else 0


def _channels_last(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last)


def _format_of(t: torch.Tensor) -> torch.memory_format | None:
    """The one memory format ``t`` is dense in (contiguous first), or None."""
    if t.is_contiguous():
        return torch.contiguous_format
    return torch.channels_last if t.dim() == 4 and _channels_last(t) else None


def refusal(node: fx.Node) -> str:
    """Why convolution ``node`` keeps its image's layout ("" when it may read it channels-last)."""
    x = tensor_val(node.args[0])
    if x is None or x.dim() != 4:
        return "not a 2-D convolution of a 4-D image"
    if x.device.type != "cpu":
        return f"on {x.device.type}: the pass is for oneDNN's CPU convolutions"
    if x.dtype not in DTYPES:
        return f"{x.dtype}: oneDNN has no such kernel (aten's slow path is layout-blind)"
    if not torch.backends.mkldnn.is_available():
        return "this torch has no oneDNN"
    return ""


class _Refused(Exception):
    """The rewrite would change what a node reads in a way no copy fixes; the message says which and why."""


def _layouts(gm: fx.GraphModule, taken: list[fx.Node]) -> tuple[dict[fx.Node, object], dict]:
    """The rewrite simulated on the fake values, the graph untouched: every node's new value where it changes, and
    the copies to insert, ``{(node, argument position): (memory format, the copy's value)}`` (a convolution's image
    to channels-last; an input a view cannot take in its new layout back to its old one). Raises :class:`_Refused`."""
    new: dict[fx.Node, object] = {}
    copies: dict[tuple[fx.Node, int], tuple[torch.memory_format, torch.Tensor]] = {}
    val = lambda n: new.get(n, n.meta.get("val"))  # noqa: E731
    mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")])
    with mode if mode is not None else contextlib.nullcontext():
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node in taken and not _channels_last(val(node.args[0])):
                copies[node, 0] = (torch.channels_last, val(node.args[0]).clone(memory_format=torch.channels_last))
            if not any(key[0] is node for key in copies) and not any(n in new for n in node.all_input_nodes):
                continue
            if "as_strided" in str(node.target) or "set_" in str(node.target):
                raise _Refused(f"{node.name} ({node.target}) reads its input's storage as it is laid out")
            try:
                new[node] = _run_on(node, val, copies)
            except Exception:  # noqa: BLE001 - a view the new layout does not allow: its inputs as they were
                for k, arg in enumerate(node.args):
                    if isinstance(arg, fx.Node) and arg in new and (node, k) not in copies:
                        fmt = _format_of(arg.meta["val"])
                        if fmt is None:
                            raise _Refused(f"{node.name} cannot read {arg.name} in another layout") from None
                        copies[node, k] = (fmt, val(arg).clone(memory_format=fmt))
                new[node] = _run_on(node, val, copies)
    return new, copies


def _run_on(node: fx.Node, val, copies: dict) -> object:
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), val)
    args = tuple(copies[node, k][1] if (node, k) in copies else a for k, a in enumerate(args))
    return node.target(*args, **kwargs)


def convolutions_channels_last(gm: fx.GraphModule, note: Callable[..., None]) -> list[str]:
    """The rewrite above on ``gm`` (in place); returns the names of the images it converted."""
    reasons = {n: refusal(n) for n in gm.graph.find_nodes(op="call_function", target=CONV)}
    taken = [n for n, reason in reasons.items() if not reason]
    why: dict[str, list[str]] = {}
    for n, reason in reasons.items():  # one note per reason; a GPU graph's convolutions are not this pass's business
        image = tensor_val(n.args[0])
        if reason and image is not None and image.device.type == "cpu":
            why.setdefault(reason, []).append(n.name)
    for reason, names in why.items():
        note("channels_last", names, "skipped", reason)
    if not taken:
        return []
    weights = sum(_bytes(c.args[1]) for c in taken if not _channels_last(tensor_val(c.args[1])))
    images = sum(_bytes(c.args[0]) for c in taken)
    if weights > WEIGHT_SHARE * images:
        why = (
            f"its convolutions' weights ({weights / 1e6:.1f} MB) would be copied channels-last every call, more "
            f"than {WEIGHT_SHARE:g} of their images' bytes ({images / 1e6:.1f} MB): slower, measured"
        )
        note("channels_last", [c.name for c in taken], "skipped", why)
        return []
    output = gm.graph.output_node()
    try:
        new, copies = _layouts(gm, taken)
        restore = {}  # output node -> the memory format eager returns it in
        for n in output.all_input_nodes:
            was, now = tensor_val(n), new.get(n)
            if isinstance(now, torch.Tensor) and was is not None and now.stride() != was.stride():
                restore[n] = (_format_of(was), was)
                if restore[n][0] is None:
                    raise _Refused(f"output {n.name} has strides {was.stride()}, which no one copy restores")
    except _Refused as e:
        note("channels_last", [c.name for c in taken], "skipped", str(e))
        return []
    if not any(fmt is torch.channels_last for fmt, _ in copies.values()):
        return []
    converted = []
    for (node, k), (fmt, v) in copies.items():
        with gm.graph.inserting_before(node):
            copy = gm.graph.call_function(aten.clone.default, (node.args[k],), {"memory_format": fmt})
        copy.meta["val"] = v
        converted += [node.args[k].name] if fmt is torch.channels_last else []
        node.update_arg(k, copy)
    for node, v in new.items():
        node.meta["val"] = v
    for n, (fmt, was) in restore.items():  # the caller gets eager's layout back
        _restore(gm, output, n, fmt, was)
    note("channels_last", converted, "channels-last", f"{len(taken)} convolution(s) read NHWC images (oneDNN)")
    relint(gm)
    return converted


def _restore(gm: fx.GraphModule, output: fx.Node, n: fx.Node, fmt: torch.memory_format, was: torch.Tensor) -> None:
    """Output ``n`` copied to ``fmt``, viewed with eager's strides (they differ at most in a size-1 dim's)."""
    with gm.graph.inserting_before(output):
        back = gm.graph.call_function(aten.clone.default, (n,), {"memory_format": fmt})
    back.meta["val"] = n.meta["val"].clone(memory_format=fmt)
    if back.meta["val"].stride() != was.stride():
        with gm.graph.inserting_before(output):
            exact = gm.graph.call_function(aten.as_strided.default, (back, list(was.shape), list(was.stride())))
        exact.meta["val"] = back.meta["val"].as_strided(was.shape, was.stride())
        back = exact
    output.replace_input_with(n, back)


CHANNELS_LAST = passes.Pass(
    "channels_last", passes.noted(convolutions_channels_last), kinds=("inference",),
    doc="a CPU graph's convolutions read channels-last images (oneDNN's layout), as Inductor's layout choice",
)  # fmt: skip
