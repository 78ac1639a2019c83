"""Depthwise convolutions as window sums a generated kernel computes (pass ``depthwise``, Phase 9).

A depthwise convolution (``groups`` = input channels = output channels) gives each output element a weighted sum of
a small window of *one* input channel: ``out[n, c, i, j] = sum_{a, b} x[n, c, i*s - p + a*d, j*s - p + b*d] *
w[c, 0, a, b]``, zero outside the input. That is a max-pool with weights and a sum: no reduction loop, a few loads
at shifted indices, so the code generator computes it the way it computes a max-pool (``fusion.compiler.lower_windows``:
a window sum beside the max), inside the kernel of the pointwise ops around it. An inverted-residual block (MobileNetV2,
EfficientNet) then runs its expansion's BatchNorm and ReLU6, the depthwise convolution, and its BatchNorm and ReLU6
as one generated kernel where eager runs a cuDNN convolution and two elementwise kernels: two launches fewer per
block, and the expanded tensor is read once instead of written and read twice.

The pass renames each such ``aten.convolution`` to :data:`DEPTHWISE` (``fusion::depthwise_conv2d``), an op Phase 6
counts among the pooling ops (``regions.POOLING_OPS``): fusible. Run on its own (a region the generator refuses, or
a graph it does not compile), the op is ``torch.convolution`` again: the same values as before the pass.

What is renamed: 2-d, not transposed, no bias (pass ``conv_bias`` moves a bias into the next kernel first), every
input channel its own group with one output channel, a window of at most :data:`MAX_TAPS` taps (3x3 and 5x5:
MobileNet, EfficientNet; ConvNeXt's 7x7 stays cuDNN's, 49 loads an output element and not measured), floating
point. Inference graphs only: a training forward's BatchNorm reduces the convolution's output over (N, H, W), a
reduction kernel that would compute each window again in each pass over its rows. Off by default under CUDA graphs
(``fusion.compiler.driver.PASSES``): replayed, a launch costs no CPU, and cuDNN's kernel is the faster one on the GPU.

The generator still leaves a renamed window to ``torch.convolution`` where it would cost more than it saves
(``fusion.kernels.window_rules``): inside a reduction kernel, or over a chain it would have to compute again at
each tap that holds a transcendental function (EfficientNet's SiLU) or more than a dozen ops. Measured on
MobileNetV2, EfficientNet-B0 and MobileNetV3: README, "Depthwise convolutions inside the generated kernels".
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.aten.nodes import DEPTHWISE_CONV
from fusion.fxutils.finish import relint

aten = torch.ops.aten
MAX_TAPS = 25  # a window of at most 5x5: each output element loads this many inputs (and as many weights)
_SCHEMA = "depthwise_conv2d(Tensor x, Tensor weight, int[] stride, int[] padding, int[] dilation) -> Tensor"


def depthwise_conv2d(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation) -> torch.Tensor:
    """The op's values outside a generated kernel: the convolution it replaced (every channel its own group)."""
    return torch.convolution(x, weight, None, stride, padding, dilation, False, [0, 0], x.shape[1])


def _register() -> torch._ops.OpOverload:
    """Define ``fusion::depthwise_conv2d`` once per process (a second import of this module finds it)."""
    namespace = torch.ops.fusion
    if not hasattr(namespace, "depthwise_conv2d"):
        lib = torch.library.Library("fusion", "FRAGMENT")
        lib.define(_SCHEMA)
        lib.impl("depthwise_conv2d", depthwise_conv2d, "CompositeExplicitAutograd")  # CPU, CUDA, ...
        # Fake tensors: aten's meta function, which keeps a channels-last input's layout (the default would not).
        torch.library.register_fake("fusion::depthwise_conv2d", depthwise_conv2d, lib=lib)
        _register.lib = lib  # the registration lives as long as the Library object
    return namespace.depthwise_conv2d.default


DEPTHWISE = _register()
assert DEPTHWISE._schema.name == DEPTHWISE_CONV


def is_depthwise_conv(conv: fx.Node) -> bool:
    """Is ``conv`` an ``aten.convolution`` of every input channel by its own filter (groups = channels, one output
    channel per group), 2-d and not transposed?"""
    if conv.op != "call_function" or conv.target is not aten.convolution.default:
        return False
    x, w, *_, transposed, _, groups = conv.args
    xv, wv = (getattr(n, "meta", {}).get("val") for n in (x, w))
    if transposed or not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor) or wv.dim() != 4:
        return False
    return groups == xv.shape[1] == wv.shape[0] and wv.shape[1] == 1


def refusal(conv: fx.Node) -> str | None:
    """Why the depthwise convolution ``conv`` is not renamed, or None: the generator takes it."""
    x, w, bias = conv.args[:3]
    xv, wv, out = x.meta["val"], w.meta["val"], conv.meta.get("val")
    if bias is not None:
        return "has a bias (pass conv_bias moves it into the next kernel)"
    if (taps := wv.shape[2] * wv.shape[3]) > MAX_TAPS:
        return f"a {wv.shape[2]}x{wv.shape[3]} window: {taps} taps > {MAX_TAPS} (stays cuDNN's)"
    if not isinstance(out, torch.Tensor) or not out.dtype.is_floating_point or xv.dtype != wv.dtype:
        return f"{xv.dtype} input, {wv.dtype} weight: not one floating-point dtype"
    return None


def depthwise_as_window_sums(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """The pass ``depthwise``: every depthwise convolution (:func:`is_depthwise_conv`) the generator takes
    (:func:`refusal` is None) becomes :data:`DEPTHWISE` with the same input, weight, stride, padding and dilation
    and the same ``meta["val"]``. Returns how many were renamed; each renamed or refused one is noted."""
    count = 0
    for conv in gm.graph.nodes:
        if not is_depthwise_conv(conv):
            continue  # a dense or grouped convolution: not this pass's business
        if why := refusal(conv):
            note("depthwise conv", [conv.name], "skipped", why)
            continue
        x, w, _, stride, padding, dilation = conv.args[:6]
        conv.target, conv.args = DEPTHWISE, (x, w, list(stride), list(padding), list(dilation))
        note("depthwise conv", [conv.name], "window sum", "computed by the generated kernel around it")
        count += 1
    if count:
        relint(gm)
    return count
