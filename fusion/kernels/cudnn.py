"""cuDNN's conv+bias(+add)+ReLU epilogue: the folded conv's bias, a residual add and the ReLU in one kernel on CUDA.

Not an exercise: Phase 4's benchmark runs :func:`fuse_conv_relu_epilogue` after Phase 5's ``fuse_conv_bn``, and
``fusion.conv_bn_fusion`` re-exports everything here for the code that imports it from there.

Folding removes BatchNorm's pass, but on cuDNN the folded conv's bias becomes a pass of its own: ATen runs
cudnn_convolution, then output.add_(bias) as a separate kernel, with the bytes of the BN pass it replaced. cuDNN's
runtime fusion (torch.cudnn_convolution_relu / cudnn_convolution_add_relu) applies the bias, the residual add and
the ReLU in the convolution's epilogue, while the output tile is on chip, which removes that pass. Grouped convs are
left out: legal, but the fused kernel measured slower than the conv plus the bias add (GROUPED_REFUSAL).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from fusion.common import FusionReport, attach_report, copy_to_graph_module, finish_rewrite
from fusion.kernels.cublaslt import any_autocast

__all__ = [
    "CONV_PATHS",
    "CONV_THEN_ADD_RELU",
    "CONV_THEN_RELU",
    "CUDNN_CONV_THEN_BIAS",
    "CUDNN_EPILOGUE",
    "GROUPED_REFUSAL",
    "ConvBiasReLU2d",
    "cudnn_epilogue_unavailable",
    "fuse_conv_relu_epilogue",
]

# What the kernels of a conv really do on CUDA (the benchmark counts the passes; its report prints these).
CUDNN_CONV_THEN_BIAS = "cudnn-conv+bias-add"
CUDNN_EPILOGUE = "cudnn-epilogue"
CONV_THEN_RELU = "conv+relu"
CONV_THEN_ADD_RELU = "conv+add+relu"
CONV_PATHS = {
    CUDNN_CONV_THEN_BIAS: "cuDNN convolution, then the bias in a separate add_ kernel (ATen's Convolution.cpp: "
    "cuDNN convolutions do not handle bias): one more read+write pass over the output",
    CUDNN_EPILOGUE: "one cuDNN runtime-fusion kernel: conv, bias, (residual add,) ReLU in its epilogue",
    CONV_THEN_RELU: "the unfused fallback: conv (bias add), then ReLU",
    CONV_THEN_ADD_RELU: "the unfused fallback: conv (bias add), then the residual add, then ReLU",
}

CUDNN_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what cuDNN's runtime fusion takes
GROUPED_REFUSAL = (
    "grouped/depthwise conv: cuDNN's runtime-fusion engine for it is a slow generic kernel (H100, torch 2.11, "
    "bf16 channels_last 64x128x56x56: 1.55 ms fused vs 52 µs for the plain depthwise conv + 79 µs bias add)"
)


def cudnn_epilogue_unavailable(device: str, dtype: torch.dtype) -> str | None:
    """Why the cuDNN epilogue variant cannot run on ``device``/``dtype`` (None: it can)."""
    if device != "cuda":
        return f"needs CUDA with cuDNN (torch.cudnn_convolution_relu is a cuDNN kernel); this run is on {device}"
    if not hasattr(torch, "cudnn_convolution_relu") or not hasattr(torch, "cudnn_convolution_add_relu"):
        return f"torch {torch.__version__} has no torch.cudnn_convolution_relu / cudnn_convolution_add_relu"
    if not (torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled):
        return "cuDNN is not available or torch.backends.cudnn.enabled is False"
    if dtype not in CUDNN_DTYPES:
        return f"cuDNN runtime fusion takes float16, bfloat16 or float32, not {dtype}"
    return None


# ----------------------------------------------------------------------------------------------------------------------
# The one implementation: ConvBiasReLU2d (Phase 4's module) and the compiled graph's epilogue calls
# (fusion.compiler.epilogue) both run conv_bias_relu.

# What cuDNN refused at run time (no engine for that configuration): {call key: cuDNN's error}. Such a call runs the
# unfused ops, then and from then on: one dict lookup, nothing else on the hot path.
_refused: dict[tuple, str] = {}


def _key(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor | None) -> tuple:
    return (x.shape, x.stride(), w.shape, x.dtype, None if z is None else z.stride())


def refusal(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor | None = None) -> str:
    """cuDNN's error for a call of these tensors' configuration, if it refused one ("": none refused)."""
    return _refused.get(_key(x, w, z), "")


def conv_bias_relu(x, w, b, stride, padding, dilation, groups, z=None):
    """``relu(conv(x, w) + b)``, or ``relu(conv(x, w) + b + z)``, in cuDNN's epilogue; the unfused ops where cuDNN
    has no engine for the call. The caller checked device, rank, dtypes, zero padding and that no gradient is needed."""
    key = _key(x, w, z)
    if key not in _refused:
        try:
            if z is None:
                return torch.cudnn_convolution_relu(x, w, b, stride, padding, dilation, groups)
            return torch.cudnn_convolution_add_relu(x, w, z, 1.0, b, stride, padding, dilation, groups)
        except RuntimeError as e:  # correct anyway: this configuration runs unfused from now on
            _refused[key] = str(e).splitlines()[0][:200]
    y = torch.convolution(x, w, b, stride, padding, dilation, False, [0] * len(stride), groups)
    return torch.relu(y if z is None else y + z)


def cudnn_conv_bias_relu(x, w, b, stride, padding, dilation, groups):
    """``relu(conv(x, w) + b)`` (:func:`conv_bias_relu`): the call a compiled graph's epilogue makes."""
    return conv_bias_relu(x, w, b, stride, padding, dilation, groups)


def cudnn_conv_bias_add_relu(x, w, b, z, stride, padding, dilation, groups):
    """``relu(conv(x, w) + b + z)`` (:func:`conv_bias_relu`): a residual block's last conv in a compiled graph."""
    return conv_bias_relu(x, w, b, stride, padding, dilation, groups, z)


class ConvBiasReLU2d(nn.Conv2d):
    """``relu(conv(x) + bias)``, or with ``add=True`` ``relu(conv(x) + bias + z)``, as one cuDNN kernel on CUDA.

    It shares the Conv2d's Parameters. Where cuDNN cannot take the call (CPU, autograd needs a gradient — the fused
    ops have no backward —, autocast, mixed dtypes, a ``z`` of another shape) it runs the unfused ops, so its
    result is eager's everywhere. If cuDNN refuses a configuration once (no engine for it), it says so in
    ``kernel_path(x, explain=True)`` and uses the unfused ops from then on.
    """

    def __init__(self, conv: nn.Conv2d, add: bool = False):
        super().__init__(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,
            conv.stride,
            conv.padding,
            conv.dilation,
            conv.groups,
            bias=conv.bias is not None,
            padding_mode=conv.padding_mode,
            device="meta",  # placeholders, replaced by the conv's own Parameters just below
        )
        self.weight = conv.weight  # (C_out, C_in/groups, kh, kw): the same Parameter object
        self.bias = conv.bias  # (C_out,) or None
        self.train(conv.training)
        self.add = add
        self.epilogue_flops_per_output = 2 if add else 1  # read by the benchmark's FLOP count
        self.cudnn_error = ""  # set when cuDNN refused a call: the module then stays on the unfused ops

    def _cudnn_ok(self, x: torch.Tensor, z: torch.Tensor | None) -> bool:
        w, b = self.weight, self.bias
        if self.cudnn_error or not x.is_cuda or x.dim() != 4 or x.dtype not in CUDNN_DTYPES or w.dtype != x.dtype:
            return False
        if self.padding_mode != "zeros" or isinstance(self.padding, str):  # the fused op pads with zeros, by numbers
            return False
        if (b is not None and b.dtype != x.dtype) or not torch.backends.cudnn.enabled or any_autocast():
            return False
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
            return False
        if z is not None:
            if z.dtype != x.dtype or not z.is_cuda or (torch.is_grad_enabled() and z.requires_grad):
                return False
            if tuple(z.shape) != self.output_shape(x):  # cuDNN's z must match the output exactly: no broadcasting
                return False
        return True

    def output_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        spatial = [
            (size + 2 * p - d * (k - 1) - 1) // s + 1
            for size, p, d, k, s in zip(
                x.shape[2:], self.padding, self.dilation, self.kernel_size, self.stride, strict=True
            )
        ]
        return (x.shape[0], self.out_channels, *spatial)

    def forward(
        self, x: torch.Tensor, z: torch.Tensor | None = None
    ) -> torch.Tensor:  # (B, C, H, W) -> (B, C', H', W')
        if self._cudnn_ok(x, z):
            y = conv_bias_relu(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups, z)
            self.cudnn_error = refusal(x, self.weight, z)  # cuDNN had no engine for it: unfused from now on, said so
            return y
        y = self._conv_forward(x, self.weight, self.bias)
        return torch.relu(y if z is None else y + z)

    def kernel_path(self, x: torch.Tensor, explain: bool = False) -> str:
        if self._cudnn_ok(x, None):
            path, why = CUDNN_EPILOGUE, "CUDA, cuDNN, supported dtype: conv+bias+ReLU in one kernel"
        else:
            path = CONV_THEN_ADD_RELU if self.add else CONV_THEN_RELU
            why = f"cuDNN refused it: {self.cudnn_error}" if self.cudnn_error else "not a cuDNN-fusable call here"
        return f"{path}: {why}" if explain else path

    def extra_repr(self) -> str:
        return super().extra_repr() + f", epilogue={'add+relu' if self.add else 'relu'}"


_RELU_FUNCTIONS = (F.relu, torch.relu, torch.relu_, torch.Tensor.relu, torch.Tensor.relu_)
_ADD_FUNCTIONS = (operator.add, torch.add, torch.Tensor.add)


def _is_relu_of(node: fx.Node, value: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Is ``node`` a ReLU (any spelling, in place or not, no hooks) of exactly ``value``?"""
    arg = node.args[0] if node.args else node.kwargs.get("input")
    if arg is not value:
        return False
    if node.op == "call_module":
        m = modules.get(node.target)
        plain = type(m) is nn.ReLU and not (m._forward_hooks or m._forward_pre_hooks)
        return plain
    if node.op == "call_function":
        return node.target in _RELU_FUNCTIONS
    return node.op == "call_method" and node.target in ("relu", "relu_")


def _residual_of(add: fx.Node, conv: fx.Node) -> fx.Node | None:
    """The other operand ``z`` if ``add`` is ``conv + z`` or ``z + conv`` (tensors, no alpha, no out=), else None."""
    is_add = (add.op == "call_function" and add.target in _ADD_FUNCTIONS) or (
        add.op == "call_method" and add.target == "add"
    )
    if not is_add or add.kwargs or len(add.args) != 2 or conv not in add.args:
        return None
    z = add.args[1] if add.args[0] is conv else add.args[0]
    return z if isinstance(z, fx.Node) and z is not conv else None


def fuse_conv_relu_epilogue(model: nn.Module) -> fx.GraphModule:
    """Replace every ``relu(conv(x))`` and ``relu(conv(x) + z)`` (plain ``nn.Conv2d``, its only user the ReLU or
    the add, the add's only user the ReLU) with a :class:`ConvBiasReLU2d`. Meant to run after phase 5's
    ``fuse_conv_bn``: the folded conv's bias, the residual add and the ReLU then ride in cuDNN's epilogue.
    Grouped convs are left alone: legal, but measured far slower fused (see GROUPED_REFUSAL) — speed, not
    legality, is the reason, and the report says so.

    Never mutates ``model``; every Conv2d looked at is in ``report_of(gm)``, fused or skipped with why.
    """
    gm = copy_to_graph_module(model, what="fuse_conv_relu_epilogue")
    graph, report = gm.graph, FusionReport("fuse_conv_relu_epilogue")
    modules = dict(gm.named_modules())
    for node in list(graph.nodes):
        if node.op != "call_module" or not isinstance(modules[node.target], nn.Conv2d):
            continue
        conv = modules[node.target]
        why = ""
        if type(conv) is not nn.Conv2d:
            why = f"{type(conv).__name__} is not a plain nn.Conv2d"
        elif conv.groups != 1:
            why = GROUPED_REFUSAL
        elif conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            why = f"padding {conv.padding!r} / padding_mode {conv.padding_mode!r}: cuDNN's fused op takes zero padding"
        elif conv._forward_hooks or conv._forward_pre_hooks:
            why = "it has forward hooks, which the fused module would not run"
        elif len(node.args) != 1 or node.kwargs:
            why = "called with keyword or extra arguments"
        elif len(node.users) != 1:
            why = f"its output has {len(node.users)} users: the epilogue would hide the value the others read"
        if why:
            report.skip("Conv+bias+ReLU", [node.name], why)
            continue
        (user,) = node.users
        z, relu = None, user
        if not _is_relu_of(user, node, modules):
            z = _residual_of(user, node)
            relus = list(user.users)
            if z is None or len(relus) != 1 or not _is_relu_of(relus[0], user, modules):
                report.skip(
                    "Conv+bias+ReLU", [node.name, user.name], "not followed by a ReLU, or by an add then a ReLU"
                )
                continue
            relu = relus[0]
        name = node.target.replace(".", "_") + ("_add_relu" if z is not None else "_relu")
        while hasattr(gm, name):
            name += "_"
        gm.add_submodule(name, ConvBiasReLU2d(conv, add=z is not None))
        with graph.inserting_before(relu):
            args = (node.args[0],) if z is None else (node.args[0], z)
            fused = graph.call_module(name, args)
        fused.meta.update(relu.meta)
        relu.replace_all_uses_with(fused)
        chain = [node, relu] if z is None else [node, user, relu]
        for dead in reversed(chain):
            graph.erase_node(dead)
        pattern = "Conv+bias+add+ReLU" if z is not None else "Conv+bias+ReLU"
        report.fuse(pattern, [n.name for n in chain], replacement=name, reason="cuDNN runtime-fusion epilogue")
    finish_rewrite(gm)
    return attach_report(gm, report)
