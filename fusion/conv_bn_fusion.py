"""Phase 5 — Conv+BatchNorm folding: in eval mode a BatchNorm is arithmetic you can fold into the conv's weights.

Run it:   uv run python -m fusion.conv_bn_fusion
Test it:  uv run pytest -m phase5

What you learn
--------------
* *Algebraic* fusion: the previous phases fused kernels (two ops, one pass over memory); here an op disappears
  altogether. In eval mode BatchNorm uses fixed running statistics, so it is a per-channel affine map
  ``y -> s*y + t``, and an affine map after a linear map (conv, Linear) is just another linear map.
* The derivation (per output channel ``c``; ``*`` is the convolution, ``W_c`` the filters producing channel ``c``)::

      conv:   y_c  = W_c * x + b_c
      BN:     z_c  = gamma_c * (y_c - mu_c) / sqrt(var_c + eps) + beta_c
      let     s_c  = gamma_c / sqrt(var_c + eps)                       # one number per channel
      then    z_c  = s_c * (W_c * x + b_c - mu_c) + beta_c
                   = (s_c * W_c) * x + [(b_c - mu_c) * s_c + beta_c]   # convolution is linear in W
      so      W'_c = s_c * W_c        b'_c = (b_c - mu_c) * s_c + beta_c

  No conv bias means ``b = 0``; ``BatchNorm(affine=False)`` means ``gamma = 1, beta = 0``.
* Where the output channel lives in the weight: ``Conv``/``Linear`` weights are ``[C_out, C_in/groups, k...]``,
  so ``s`` scales dim 0. ``ConvTranspose`` weights are ``[C_in, C_out/groups, k...]``: output channel
  ``c = g*(C_out/groups) + j`` is column ``j`` of group ``g``'s rows. View the weight as
  ``[groups, C_in/groups, C_out/groups, k...]`` and scale by ``s`` viewed as ``[groups, 1, C_out/groups, 1...]``.
  (``torch.nn.utils.fusion.fuse_conv_bn_weights`` scales dim 1 by all ``C_out`` values, which is only right for
  ``groups=1``: pytorch issue 180995. The lesson below shows it.)
* Legality, the part compilers get wrong: fold only when (1) the conv output has exactly one user — the BN —
  or the other users would see BN'd values; (2) the BN uses running statistics (eval mode and
  ``track_running_stats=True``), otherwise it normalizes each batch by that batch's statistics, which no fixed
  weights reproduce; (3) the fold creates a *new* module: a conv called at two sites, each followed by its own BN,
  must not be edited in place (``torch.fx.experimental.optimization.fuse`` does, and both sites get the wrong
  weights: pytorch issue 104593).
* Precision: fold in float32 or wider, then cast back. Folding a bf16 model in bf16 rounds ``rsqrt``, the product
  and the bias arithmetic each to 8 bits of mantissa; folding in float32 rounds once.

The pass: ``fuse_conv_bn(model)`` traces a copy of the model, walks its BatchNorm nodes, and for each one fed by a
Conv/Linear it can fold, installs a new folded module, points the conv node at it and deletes the BN node.

    >>> import torch
    >>> from fusion import models
    >>> model = models.ConvBNNet().eval()
    >>> gm = fuse_conv_bn(model)
    >>> [d.nodes for d in report_of(gm).fused]
    [('stem_0', 'stem_1'), ('conv1', 'bn1'), ('conv2', 'bn2')]
    >>> (x,) = models.conv_inputs()
    >>> torch.testing.assert_close(gm(x), model(x), rtol=1e-4, atol=1e-5)
"""

from __future__ import annotations

import copy
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.passes.shape_prop import ShapeProp
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvTransposeNd
from torch.utils import benchmark

from fusion import models
from fusion.common import (
    FusionReport,
    attach_report,
    copy_to_graph_module,
    ensure_module,
    finish_rewrite,
    heading,
    lesson_cli,
    max_abs_diff,
    node_table,
    report_of,
    table,
    trace_module,
)

# The pairs this pass folds: the module before the BatchNorm (exact type) -> the BatchNorm it must be followed by.
FOLDABLE: dict[type[nn.Module], type[_BatchNorm]] = {
    nn.Conv1d: nn.BatchNorm1d,
    nn.Conv2d: nn.BatchNorm2d,
    nn.Conv3d: nn.BatchNorm3d,
    nn.ConvTranspose1d: nn.BatchNorm1d,
    nn.ConvTranspose2d: nn.BatchNorm2d,
    nn.ConvTranspose3d: nn.BatchNorm3d,
    nn.Linear: nn.BatchNorm1d,
}

__all__ = [
    "FOLDABLE",
    "fold_conv_bn_weights",
    "fold_linear_bn_weights",
    "fold_module",
    "fuse_conv_bn",
    "pair_problem",
    "run",
    "main",
    # On CUDA: the bias+ReLU epilogue (not an exercise)
    "CONV_PATHS",
    "GROUPED_REFUSAL",
    "ConvBiasReLU2d",
    "cudnn_epilogue_unavailable",
    "fuse_conv_relu_epilogue",
]


# ----------------------------------------------------------------------------------------------------------------------
# The math: fold one BatchNorm into one weight and bias


def _transposed_groups(conv_w: torch.Tensor, channels: int, groups: int | None) -> int:
    """The ``groups`` of a transposed conv weight ``[C_in, C_out/groups, k...]`` whose output has ``channels``."""
    per_group = conv_w.shape[1]
    if groups is None:
        if channels % per_group:
            raise ValueError(
                f"a transposed conv weight of shape {tuple(conv_w.shape)} ([C_in, C_out/groups, k...]) cannot "
                f"produce {channels} output channels: {channels} is not a multiple of {per_group}"
            )
        groups = channels // per_group
    if per_group * groups != channels or conv_w.shape[0] % groups:
        raise ValueError(
            f"transposed conv weight {tuple(conv_w.shape)} with groups={groups} has {per_group * groups} output "
            f"channels (C_in={conv_w.shape[0]} must divide by groups), but the BatchNorm has {channels}"
        )
    return groups


def fold_conv_bn_weights(
    conv_w: torch.Tensor,
    conv_b: torch.Tensor | None,
    bn_rm: torch.Tensor,
    bn_rv: torch.Tensor,
    bn_eps: float,
    bn_w: torch.Tensor | None,
    bn_b: torch.Tensor | None,
    *,
    transpose: bool = False,
    groups: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias of one conv computing ``bn(conv(x))`` with BN's running statistics (eval mode).

    ``W'_c = W_c * s_c`` and ``b'_c = (b_c - mu_c) * s_c + beta_c`` with ``s_c = gamma_c / sqrt(var_c + eps)``
    (derivation in the module docstring). ``conv_b=None`` is a bias-less conv (``b = 0``); ``bn_w``/``bn_b`` ``None``
    is ``BatchNorm(affine=False)`` (``gamma = 1``, ``beta = 0``). Works for Linear weights ``[out, in]`` too.

    ``transpose=True`` for ConvTranspose weights ``[C_in, C_out/groups, k...]``; ``groups`` is then inferred as
    ``C_out / weight.shape[1]`` (``C_out`` = the BN's channel count), or checked if you pass it. Ignored otherwise.

    Computes in float32 or wider (float64 stays float64) and returns plain tensors in the conv's dtypes
    (the bias in the weight's dtype when ``conv_b`` is None). Autograd flows through if the inputs require grad.

    >>> w, b = fold_conv_bn_weights(torch.ones(2, 1, 1), None, torch.tensor([1.0, 0.0]), torch.tensor([3.0, 0.0]),
    ...                             1.0, torch.tensor([4.0, 1.0]), torch.tensor([0.5, 0.0]))
    >>> w.flatten().tolist(), b.tolist()   # s = [4/sqrt(4), 1/sqrt(1)] = [2, 1]
    ([2.0, 1.0], [-1.5, 0.0])
    """
    channels = bn_rm.numel()
    if conv_w.dim() < 2:
        raise ValueError(f"expected a conv or linear weight (2 or more dims), got shape {tuple(conv_w.shape)}")
    if transpose:
        groups = _transposed_groups(conv_w, channels, groups)
    elif conv_w.shape[0] != channels:
        raise ValueError(
            f"weight {tuple(conv_w.shape)} has {conv_w.shape[0]} output channels (dim 0) but the BatchNorm has "
            f"{channels}{'; a ConvTranspose weight needs transpose=True' if conv_w.shape[1] == channels else ''}"
        )
    compute = torch.promote_types(conv_w.dtype, torch.float32)  # bf16/fp16/fp32 -> fp32, fp64 -> fp64
    bias_dtype = conv_b.dtype if conv_b is not None else conv_w.dtype
    # TODO(human): compute the folded weight w and bias b in the compute dtype (s = gamma / sqrt(var + eps) per output channel; transposed weights are [C_in, C_out/groups, k...]). Hint: None bias means 0 and None gamma/beta mean 1/0; for transpose, w.unflatten(0, (groups, -1)) then scale by s.reshape(groups, 1, -1, 1, ...)
    # BEGIN SOLUTION
    mean, var = bn_rm.to(compute), bn_rv.to(compute)  # (C_out,)
    gamma = bn_w.to(compute) if bn_w is not None else torch.ones_like(mean)  # affine=False: gamma = 1
    beta = bn_b.to(compute) if bn_b is not None else torch.zeros_like(mean)  # affine=False: beta = 0
    b = conv_b.to(compute) if conv_b is not None else torch.zeros_like(mean)  # no conv bias: b = 0
    s = gamma * torch.rsqrt(var + bn_eps)  # (C_out,)
    ones = [1] * (conv_w.dim() - 2)  # one per kernel dim (none for Linear)
    w = conv_w.to(compute)
    if transpose:
        w = w.unflatten(0, (groups, -1))  # (groups, C_in/groups, C_out/groups, k...)
        w = (w * s.reshape(groups, 1, -1, *ones)).flatten(0, 1)  # (C_in, C_out/groups, k...)
    else:
        w = w * s.reshape(-1, 1, *ones)  # (C_out, C_in/groups, k...)
    b = (b - mean) * s + beta  # (C_out,)
    # END SOLUTION
    return w.to(conv_w.dtype), b.to(bias_dtype)


def fold_linear_bn_weights(
    linear_w: torch.Tensor,
    linear_b: torch.Tensor | None,
    bn_rm: torch.Tensor,
    bn_rv: torch.Tensor,
    bn_eps: float,
    bn_w: torch.Tensor | None,
    bn_b: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear ``[out, in]`` + BatchNorm1d: the same fold, since a Linear is a 1x1 conv on ``(N, C)``."""
    return fold_conv_bn_weights(linear_w, linear_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b)


def fold_module(conv: nn.Module, bn: _BatchNorm) -> nn.Module:
    """A NEW Conv/ConvTranspose/Linear computing ``bn(conv(x))`` in eval mode; ``conv`` and ``bn`` are not touched."""
    with torch.no_grad():
        w, b = fold_conv_bn_weights(
            conv.weight,
            conv.bias,
            bn.running_mean,
            bn.running_var,
            bn.eps,
            bn.weight,  # None when affine=False
            bn.bias,
            transpose=isinstance(conv, _ConvTransposeNd),
            groups=getattr(conv, "groups", None),
        )
    folded = copy.deepcopy(conv)  # same type, hyper-parameters, device, training flag
    folded.weight = nn.Parameter(w, requires_grad=conv.weight.requires_grad)
    folded.bias = nn.Parameter(b, requires_grad=conv.weight.requires_grad)  # bias-less convs gain a bias
    return folded


# ----------------------------------------------------------------------------------------------------------------------
# Legality: when is a (conv node, BN node) pair foldable?


def _training_error(node: fx.Node, module: nn.Module) -> ValueError:
    return ValueError(
        f"fuse_conv_bn: {node.target!r} ({type(module).__name__}) is in training mode. A BatchNorm in training mode "
        "normalizes every batch with that batch's own mean and variance, which no fixed conv weights can reproduce. "
        "Fix: call model.eval() before fuse_conv_bn(model)"
    )


def _channels(conv: nn.Module) -> int:
    return conv.out_features if isinstance(conv, nn.Linear) else conv.out_channels


def pair_problem(gm: fx.GraphModule, conv_node: fx.Node, bn_node: fx.Node) -> str | None:
    """Why the pair ``conv_node -> bn_node`` cannot be folded (a reason for the report), or None if it can.

    Raises the training-mode ValueError (the fix is ``model.eval()``, not a skip). Checks everything about the two
    *modules* and the tensor layout; whether the conv output has other users is the caller's check.
    """
    conv, bn = gm.get_submodule(conv_node.target), gm.get_submodule(bn_node.target)
    for node, module in ((conv_node, conv), (bn_node, bn)):
        if module.training:
            raise _training_error(node, module)
    if type(bn) is not FOLDABLE[type(conv)]:
        return f"{type(conv).__name__} is followed by {type(bn).__name__}, not {FOLDABLE[type(conv)].__name__}"
    if bn.running_mean is None or bn.running_var is None:
        return (
            "BatchNorm has no running stats (track_running_stats=False): even in eval mode it normalizes each "
            "batch by its own statistics, so there is no fixed affine map to fold"
        )
    if bn.num_features != _channels(conv):
        return f"BatchNorm has {bn.num_features} features but {conv_node.target} outputs {_channels(conv)} channels"
    for node, module in ((conv_node, conv), (bn_node, bn)):
        if module._forward_hooks or module._forward_pre_hooks:
            return f"{node.target} has forward hooks, which would see different values after the fold"
    meta = conv_node.meta.get("tensor_meta")  # present when fuse_conv_bn was given example_inputs
    want = 2 if isinstance(conv, nn.Linear) else conv.weight.dim()  # (N, C) or (N, C, *spatial)
    if meta is not None and len(meta.shape) != want:
        return (
            f"{conv_node.name}'s output has shape {tuple(meta.shape)}: BatchNorm normalizes dim 1, which is not "
            f"the channel dim of {type(conv).__name__} here (it is only for {want}-d (N, C, ...) outputs)"
        )
    return None


def layout_note(conv: nn.Module, conv_node: fx.Node) -> str:
    """A note for the report when a fold rests on the usual (N, C, ...) layout and no shapes were there to check it.

    BatchNorm1d normalizes dim 1. After a Linear that is the feature dim only for 2-d ``(N, C)`` inputs, after a
    Conv1d only for batched ``(N, C, L)`` inputs; the 2-d/3-d BatchNorms refuse any other rank themselves.
    """
    if "tensor_meta" in conv_node.meta or not isinstance(conv, (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)):
        return ""
    return "assumed (N, C) / (N, C, L) input; pass example_inputs to check"


def _called_module(gm: fx.GraphModule, node: object) -> nn.Module | None:
    """The submodule a ``call_module`` node calls, else None."""
    if isinstance(node, fx.Node) and node.op == "call_module":
        return gm.get_submodule(node.target)
    return None


def _first_input(node: fx.Node) -> object:
    """The tensor argument of a one-input call: ``bn(x)`` or ``bn(input=x)``."""
    return node.args[0] if node.args else node.kwargs.get("input")


def _fresh_name(gm: fx.GraphModule, base: str) -> str:
    name, i = base, 1
    while hasattr(gm, name):
        name, i = f"{base}_{i}", i + 1
    return name


# ----------------------------------------------------------------------------------------------------------------------
# The pass


def fuse_conv_bn(model: nn.Module, example_inputs: tuple[torch.Tensor, ...] | None = None) -> fx.GraphModule:
    """Fold every eval-mode BatchNorm into the Conv/ConvTranspose (1d/2d/3d) or Linear before it.

    Returns a new GraphModule with the report attached (``report_of(gm)``); ``model`` is never modified. Each fold
    installs a new module (named ``<conv>_bn``) and points that one call site at it, so a conv called at several
    sites keeps its original weights everywhere else. A BatchNorm shared by several convs folds into each.

    Skipped, with the reason in the report: a conv output with more than one user, a BatchNorm without running
    stats, mismatched types/channels, modules with forward hooks, a functional ``F.batch_norm`` (this pass folds
    BatchNorm *modules* only), and — when ``example_inputs`` are given (ShapeProp records every node's shape) — a
    BatchNorm whose dim 1 is not the conv/linear's channel dim (e.g. BatchNorm1d after a Linear on 3-d input).

    Raises ValueError if the model, or a conv/BatchNorm it would fold, is in training mode (fix: ``model.eval()``).
    """
    ensure_module(model, "fuse_conv_bn")
    if model.training:
        raise ValueError(
            f"fuse_conv_bn: {type(model).__name__} is in training mode, where BatchNorm normalizes each batch by its "
            "own statistics and cannot be folded into fixed weights. Fix: call model.eval() before fuse_conv_bn(model)"
        )
    gm = copy_to_graph_module(model, what="fuse_conv_bn")  # a deep copy: the caller's model stays as it is
    if example_inputs is not None:
        ShapeProp(gm).propagate(*example_inputs)
    report = FusionReport("fuse_conv_bn")
    folded: dict[tuple[str, str], str] = {}  # (conv target, bn target) -> name of the folded module already made

    # TODO(human): for each BatchNorm node fed by a FOLDABLE module, fold the pair into a NEW module when the conv output has exactly one user and pair_problem() finds nothing, else report.skip with the reason. Hint: _called_module, _first_input, len(conv_node.users), fold_module, gm.add_submodule, then conv_node.target = new name and bn_node.replace_all_uses_with(conv_node)
    # BEGIN SOLUTION
    for bn_node in list(gm.graph.nodes):
        conv_node = _first_input(bn_node) if isinstance(_called_module(gm, bn_node), _BatchNorm) else None
        conv = _called_module(gm, conv_node)
        if type(conv) not in FOLDABLE:
            continue
        pattern = f"{type(conv).__name__}+{type(gm.get_submodule(bn_node.target)).__name__}"
        names = (conv_node.name, bn_node.name)
        if len(conv_node.users) != 1:
            users = ", ".join(u.name for u in conv_node.users)
            report.skip(pattern, names, f"{conv_node.name}'s output has {len(conv_node.users)} users ({users})")
            continue
        problem = pair_problem(gm, conv_node, bn_node)
        if problem:
            report.skip(pattern, names, problem)
            continue
        key = (conv_node.target, bn_node.target)
        if key not in folded:  # never edit the shared conv: make a new module (once per conv/BN pair)
            folded[key] = _fresh_name(gm, conv_node.target.replace(".", "_") + "_bn")
            gm.add_submodule(folded[key], fold_module(conv, gm.get_submodule(bn_node.target)))
        conv_node.target = folded[key]  # only this call site of the conv changes
        bn_node.replace_all_uses_with(conv_node)
        gm.graph.erase_node(bn_node)
        report.fuse(pattern, names, folded[key], layout_note(conv, conv_node))
    # END SOLUTION

    _report_functional_batch_norms(gm, report)
    finish_rewrite(gm)
    return attach_report(gm, report)


def _report_functional_batch_norms(gm: fx.GraphModule, report: FusionReport) -> None:
    """A conv feeding ``F.batch_norm`` is a candidate we chose not to fold; say so instead of staying silent."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (F.batch_norm, torch.batch_norm):
            conv = _called_module(gm, _first_input(node))
            if type(conv) in FOLDABLE:
                report.skip(
                    f"{type(conv).__name__}+F.batch_norm",
                    (_first_input(node).name, node.name),
                    "functional batch_norm: this pass folds BatchNorm modules only",
                )


# ----------------------------------------------------------------------------------------------------------------------
# On CUDA: the bias+ReLU epilogue (not an exercise: Phase 4's benchmark runs it after fuse_conv_bn)
#
# Folding removes BatchNorm's pass, but on cuDNN the folded conv's bias becomes a pass of its own: ATen runs
# cudnn_convolution, then output.add_(bias) as a separate kernel, with the bytes of the BN pass it replaced. cuDNN's
# runtime fusion (torch.cudnn_convolution_relu / cudnn_convolution_add_relu) applies the bias, the residual add and
# the ReLU in the convolution's epilogue, while the output tile is on chip, which removes that pass. Grouped convs are
# left out: legal, but the fused kernel measured slower than the conv plus the bias add (GROUPED_REFUSAL).

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

_CUDNN_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
GROUPED_REFUSAL = (
    "grouped/depthwise conv: cuDNN's runtime-fusion engine for it is a slow generic kernel (H100, torch 2.11, "
    "bf16 channels_last 64x128x56x56: 1.55 ms fused vs 52 µs for the plain depthwise conv + 79 µs bias add)"
)


def _any_autocast() -> bool:
    probe = getattr(torch._C, "_is_any_autocast_enabled", None)
    return True if probe is None else bool(probe())


def cudnn_epilogue_unavailable(device: str, dtype: torch.dtype) -> str | None:
    """Why the cuDNN epilogue variant cannot run on ``device``/``dtype`` (None: it can)."""
    if device != "cuda":
        return f"needs CUDA with cuDNN (torch.cudnn_convolution_relu is a cuDNN kernel); this run is on {device}"
    if not hasattr(torch, "cudnn_convolution_relu") or not hasattr(torch, "cudnn_convolution_add_relu"):
        return f"torch {torch.__version__} has no torch.cudnn_convolution_relu / cudnn_convolution_add_relu"
    if not (torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled):
        return "cuDNN is not available or torch.backends.cudnn.enabled is False"
    if dtype not in _CUDNN_DTYPES:
        return f"cuDNN runtime fusion takes float16, bfloat16 or float32, not {dtype}"
    return None


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
        if self.cudnn_error or not x.is_cuda or x.dim() != 4 or x.dtype not in _CUDNN_DTYPES or w.dtype != x.dtype:
            return False
        if (b is not None and b.dtype != x.dtype) or not torch.backends.cudnn.enabled or _any_autocast():
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
            args = (self.stride, self.padding, self.dilation, self.groups)
            try:
                if z is None:
                    return torch.cudnn_convolution_relu(x, self.weight, self.bias, *args)
                return torch.cudnn_convolution_add_relu(x, self.weight, z, 1.0, self.bias, *args)
            except RuntimeError as e:  # e.g. no cuDNN engine for this configuration: fall back, and say so
                self.cudnn_error = str(e).splitlines()[0][:200]
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


# ----------------------------------------------------------------------------------------------------------------------
# The lesson


class SharedConvNet(nn.Module):
    """One conv called at two sites, each followed by its own BatchNorm: ``bn1(conv(x)) + bn2(conv(x))``."""

    def __init__(self, ch: int = 4, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.conv = nn.Conv2d(ch, ch, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(ch)
            self.bn2 = nn.BatchNorm2d(ch)
        models.randomize_batchnorm_(self, seed)  # bn1 and bn2 get different statistics

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, ch, H, W)
        return self.bn1(self.conv(x)) + self.bn2(self.conv(x))


def _count(tensors) -> int:
    return sum(t.numel() for t in tensors)


def _median_seconds(
    modules: dict[str, nn.Module], x: torch.Tensor, min_run_time: float, rounds: int
) -> dict[str, float]:
    """Median seconds per forward of each module, timed round-robin (A, B, A, B, ...) so drift hits both alike."""
    times: dict[str, list[float]] = {name: [] for name in modules}
    for _ in range(rounds):
        for name, module in modules.items():
            timer = benchmark.Timer(
                stmt="with torch.no_grad(): m(x)",
                globals={"m": module, "x": x, "torch": torch},
                num_threads=torch.get_num_threads(),
            )
            times[name] += timer.blocked_autorange(min_run_time=min_run_time).times
    return {name: torch.tensor(t).median().item() for name, t in times.items()}


def _torch_grouped_transpose_demo() -> None:
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        conv, bn = nn.ConvTranspose2d(4, 6, 3, groups=2).double().eval(), nn.BatchNorm2d(6).double().eval()
    models.randomize_batchnorm_(bn)
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = bn(conv(x))
        ours = max_abs_diff(fold_module(conv, bn)(x), ref)
        try:
            theirs = f"max abs diff {max_abs_diff(fuse_conv_bn_eval(conv, bn, transpose=True)(x), ref):.3g}"
        except Exception as e:  # the shapes do not even line up for groups > 1
            theirs = f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"
    print("ConvTranspose2d(4, 6, 3, groups=2) + BatchNorm2d(6), weight [C_in, C_out/groups, k, k] = [4, 3, 3, 3]:")
    print(f"  torch.nn.utils.fusion.fuse_conv_bn_eval(transpose=True): {theirs}")
    print(f"  fold_module (scales [groups, C_in/groups, C_out/groups, ...]): max abs diff {ours:.3g} (float64)")


def _torch_shared_conv_demo() -> None:
    from torch.fx.experimental.optimization import fuse as torch_fx_fuse

    model = SharedConvNet().double().eval()
    x = torch.randn(2, 4, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(x)
        theirs = max_abs_diff(torch_fx_fuse(model)(x), ref)
        ours_gm = fuse_conv_bn(model)
        ours = max_abs_diff(ours_gm(x), ref)
    print("SharedConvNet: bn1(conv(x)) + bn2(conv(x)), one conv module called at two sites:")
    print(f"  torch.fx.experimental.optimization.fuse: max abs diff {theirs:.3g}", end="")
    print(
        "   (it edits the shared conv in place, then folds bn2 into the already-folded conv)" if theirs > 1e-9 else ""
    )
    print(
        f"  fuse_conv_bn: max abs diff {ours:.3g} (float64), new modules {[d.replacement for d in report_of(ours_gm).fused]}"
    )


def run(quick: bool = False) -> None:
    width, batch, size, min_run_time, rounds = (16, 2, 16, 0.05, 2) if quick else (32, 8, 32, 0.3, 3)
    model = models.ConvBNNet(width=width).eval()
    (x,) = models.conv_inputs(batch=batch, size=size)

    heading("Phase 5 — folding BatchNorm into Conv weights")
    print("ConvBNNet: stem conv(bias=False)→BN→ReLU; conv→BN→ReLU; depthwise conv→BN; + residual; pool; Linear")
    print("In eval mode BN is z = s·(y − μ) + β with s = γ/√(σ²+ε): fold it, W' = s·W, b' = (b − μ)·s + β.")

    heading("Before: the traced model", "-")
    print(node_table(trace_module(model)))  # traced as-is, only to look at it

    gm = fuse_conv_bn(model, example_inputs=(x,))
    heading("After fuse_conv_bn: no BatchNorm left", "-")
    print(node_table(gm))

    heading("The report", "-")
    print(report_of(gm).table())

    heading("Same outputs?", "-")
    with torch.no_grad():
        diff32 = max_abs_diff(gm(x), model(x))
        model64 = copy.deepcopy(model).double()
        diff64 = max_abs_diff(fuse_conv_bn(model64)(x.double()), model64(x.double()))
    print(
        table(
            [("float32", diff32), ("float64", diff64)],
            ["dtype", "max |folded − unfused|"],
        )
    )
    print("Folding is exact algebra; what is left is rounding (float64 ~1e-15, float32 ~1e-6).")

    heading("Parameters", "-")
    rows = [
        (name, _count(m.parameters()), _count(m.buffers()), sum(isinstance(s, _BatchNorm) for s in m.modules()))
        for name, m in (("unfused", model), ("folded", gm))
    ]
    print(table(rows, ["model", "parameters", "buffers (BN running stats)", "BatchNorm modules"]))
    print("Each BN's γ, β (and its running stats) are gone; bias-less convs gained a bias of C_out values.")

    heading(f"Time on CPU ({torch.get_num_threads()} threads, torch.utils.benchmark, median of {rounds} rounds)", "-")
    t = _median_seconds({"unfused": model, "folded": gm}, x, min_run_time, rounds)
    t_unfused, t_folded = t["unfused"], t["folded"]
    print(
        table(
            [("unfused", t_unfused * 1e6), ("folded", t_folded * 1e6)],
            ["model", f"median µs per forward, x {tuple(x.shape)}"],
            floatfmt=".1f",
        )
    )
    print(f"folded / unfused = {t_folded / t_unfused:.2f} (measured in this run; noisy on a busy machine)")
    print("Each BN is a full read+write of its activation; folding removes it at zero cost to the conv.")

    heading("Where torch's own folding goes wrong", "-")
    _torch_grouped_transpose_demo()
    print()
    _torch_shared_conv_demo()

    heading("Training mode is refused, with the fix", "-")
    try:
        fuse_conv_bn(models.ConvBNNet(width=4))  # a fresh module is in training mode
    except ValueError as e:
        print(f"ValueError: {e}")


def main(argv: list[str] | None = None) -> int:
    return lesson_cli(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
