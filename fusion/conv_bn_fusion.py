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
* Two spellings of a BatchNorm in a graph: a module call (``nn.BatchNorm2d``), or — where tracing went *into* a
  BatchNorm subclass such as timm's ``BatchNormAct2d`` — ``F.batch_norm(y, running_mean, running_var, weight, bias,
  training=False)`` on ``get_attr`` reads of the model's buffers, with the activation after it. Both are the same
  affine map. ``torch.fx.experimental.optimization.fuse`` folds only the first: none of timm's EfficientNet.
* Legality, the part compilers get wrong: fold only when (1) the conv output has exactly one user that reads its
  values — the BN — or the others would see BN'd values (``y.shape``/``y.ndim`` read metadata, which folding keeps);
  (2) the BN uses fixed running statistics (eval mode, ``track_running_stats=True``, ``training=False``), otherwise it
  normalizes each batch by that batch's statistics, which no fixed weights reproduce; (3) it normalizes the conv's
  channel dim (dim 1 of ``(N, C, ...)``); (4) the fold makes a *new* module: a conv called at two sites, each followed
  by its own BN, must not be edited in place (``torch.fx.experimental.optimization.fuse`` does: pytorch issue 104593).
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

import contextlib
import copy
import functools
import textwrap

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.experimental.optimization import fuse as torch_fx_fuse  # torch's own folds, to compare with
from torch.fx.passes.shape_prop import ShapeProp
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvTransposeNd
from torch.nn.utils.fusion import fuse_conv_bn_eval
from torch.utils import benchmark

from fusion import models
from fusion.common import (
    FusionReport,
    attach_report,
    ensure_module,
    finish_rewrite,
    heading,
    lesson_cli,
    max_abs_diff,
    node_table,
    report_of,
    shorten,
    table,
    trace_module,
)
from fusion.compiler import registry
from fusion.fxutils.batchnorm import (  # reading the graph: BatchNorms in both spellings, the users that read values
    BatchNormCall,
    batch_norm_call,
    batch_norms_in,
    called_module,
    delete_unused_attributes,
    traced_copy,
    value_users,
)
from fusion.fxutils.names import fresh_name
from fusion.kernels.cudnn import *  # noqa: F403  (re-exported: Phase 4 runs the cuDNN epilogue after this pass)

# The pairs this pass folds: the module before the BatchNorm (exact type) -> the BatchNorm module it must be followed
# by (that class, or a subclass keeping its forward). An F.batch_norm may follow any of them.
FOLDABLE: dict[type[nn.Module], type[_BatchNorm]] = {
    nn.Conv1d: nn.BatchNorm1d, nn.Conv2d: nn.BatchNorm2d, nn.Conv3d: nn.BatchNorm3d,
    nn.ConvTranspose1d: nn.BatchNorm1d, nn.ConvTranspose2d: nn.BatchNorm2d, nn.ConvTranspose3d: nn.BatchNorm3d,
    nn.Linear: nn.BatchNorm1d,
}  # fmt: skip

# ----------------------------------------------------------------------------------------------------------------------
# The math: fold one BatchNorm into one weight and bias


def _transposed_groups(conv_w: torch.Tensor, channels: int, groups: int | None) -> int:
    """The ``groups`` of a transposed conv weight ``[C_in, C_out/groups, k...]`` whose output has ``channels``."""
    per_group, inferred = conv_w.shape[1], groups is None
    groups = channels // per_group if inferred else groups  # C_out = groups * (C_out/groups)
    if per_group * groups != channels or conv_w.shape[0] % groups:
        raise ValueError(
            f"a transposed conv weight {tuple(conv_w.shape)} ([C_in, C_out/groups, k...]) with groups={groups}"
            f"{' (inferred)' if inferred else ''} has {per_group * groups} output channels, but the BatchNorm has "
            f"{channels} ({channels} must be a multiple of {per_group}, and C_in={conv_w.shape[0]} divide by groups)"
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

    ``conv_b=None`` is a bias-less conv (``b = 0``); ``bn_w``/``bn_b`` ``None`` is ``BatchNorm(affine=False)``.
    Works for Linear weights ``[out, in]`` too. ``transpose=True`` for ConvTranspose weights ``[C_in, C_out/groups,
    k...]``; ``groups`` is then inferred as ``C_out / weight.shape[1]``, or checked if you pass it. Computes in
    float32 or wider and returns tensors in the conv's dtypes (the bias in the weight's dtype when ``conv_b`` is None).

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
    # TODO(human): compute the folded weight w and bias b in the compute dtype: s = gamma / sqrt(var + eps) per output channel, w = the weight scaled by s along its output channels, b = (conv bias - mean) * s + beta. Hint: a None conv bias means 0 and None gamma/beta mean 1/0; Conv/Linear weights hold the output channel in dim 0, ConvTranspose weights [C_in, C_out/groups, k...] in dim 1 of each group. More: the scale must broadcast along a weight's output channels and nothing else: reshape s so that its channels line up with that dim and every other dim has size 1; a ConvTranspose weight stacks its groups along dim 0, so view it with the groups split out first (Tensor.unflatten) and merge them back after (Tensor.flatten); torch.rsqrt and Tensor.to for the dtype
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


fold_linear_bn_weights = fold_conv_bn_weights  # Linear [out, in] + BatchNorm1d: the same fold (a 1x1 conv on (N, C))


def fold_module(conv: nn.Module, bn: _BatchNorm | BatchNormCall) -> nn.Module:
    """A NEW Conv/ConvTranspose/Linear computing ``bn(conv(x))`` in eval mode; ``conv`` and ``bn`` are not touched."""
    stats = (bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)  # weight, bias: None when affine=False
    transpose, groups = isinstance(conv, _ConvTransposeNd), getattr(conv, "groups", None)
    with torch.no_grad():
        w, b = fold_conv_bn_weights(conv.weight, conv.bias, *stats, transpose=transpose, groups=groups)
    folded = copy.deepcopy(conv)  # same type, hyper-parameters, device, training flag
    folded.weight = nn.Parameter(w, requires_grad=conv.weight.requires_grad)
    folded.bias = nn.Parameter(b, requires_grad=conv.weight.requires_grad)  # bias-less convs gain a bias
    return folded


# ----------------------------------------------------------------------------------------------------------------------
# Legality: when is a (conv node, BatchNorm) pair foldable?


_IN_TRAINING = (
    "is in training mode. A BatchNorm in training mode normalizes every batch with that batch's own mean and variance, "
    "which no fixed conv weights can reproduce. Fix: call model.eval() before fuse_conv_bn(model)"
)


def pair_problem(gm: fx.GraphModule, conv_node: fx.Node, bn: BatchNormCall) -> str | None:
    """Why the conv at ``conv_node`` and the BatchNorm ``bn`` after it cannot be folded (for the report), or None.
    Raises the training-mode ValueError for a module (the fix is ``model.eval()``, not a skip). Checks the modules,
    the statistics and the layout; whether the conv output has other users is the caller's check."""
    conv = gm.get_submodule(conv_node.target)
    for name, module in ((conv_node.target, conv), (bn.node.target, bn.module)):
        if module is not None and module.training:
            raise ValueError(f"fuse_conv_bn: {name!r} ({type(module).__name__}) {_IN_TRAINING}")
    want, channels = FOLDABLE[type(conv)], conv.out_features if isinstance(conv, nn.Linear) else conv.out_channels
    if bn.problem:
        return bn.problem
    if bn.module is not None and not (isinstance(bn.module, want) and type(bn.module).forward is _BatchNorm.forward):
        return f"{type(conv).__name__} is followed by {bn.kind}, not a {want.__name__} (with its standard forward)"
    if bn.running_mean is None or bn.running_var is None:
        return "BatchNorm without running stats (track_running_stats=False) normalizes each batch by its own statistics"
    if bn.running_mean.numel() != channels:
        return f"BatchNorm has {bn.running_mean.numel()} channels but {conv_node.target} outputs {channels}"
    for name, module in ((conv_node.target, conv), (bn.node.target, bn.module)):
        if module is not None and (module._forward_hooks or module._forward_pre_hooks):
            return f"{name} has forward hooks, which would see different values after the fold"
    meta = conv_node.meta.get("tensor_meta")  # present when fuse_conv_bn was given example_inputs
    rank = 2 if isinstance(conv, nn.Linear) else conv.weight.dim()  # (N, C) or (N, C, *spatial)
    if meta is not None and len(meta.shape) != rank:
        return (
            f"{conv_node.name}'s output has shape {tuple(meta.shape)}: BatchNorm normalizes dim 1, which is not "
            f"the channel dim of {type(conv).__name__} here (it is only for {rank}-d (N, C, ...) outputs)"
        )
    return None


# ----------------------------------------------------------------------------------------------------------------------
# The pass


def fuse_conv_bn(model: nn.Module, example_inputs: tuple[torch.Tensor, ...] | None = None) -> fx.GraphModule:
    """Fold every eval-mode BatchNorm into the Conv/ConvTranspose (1d/2d/3d) or Linear before it.

    A BatchNorm is a module call or an ``F.batch_norm(..., training=False)`` on attributes of the model (timm's
    ``BatchNormAct2d``; its activation stays). Returns a new GraphModule with the report attached
    (``report_of(gm)``); ``model`` is never modified. Each fold installs a new module (``<conv>_bn``) and points that
    call site at it, so a conv called at several sites keeps its weights everywhere else.

    Skipped, with the reason in the report: a conv output that something else reads too, batch statistics
    (``training=True``, no running stats), statistics computed by the graph, mismatched types/channels, forward
    hooks, and — given ``example_inputs`` (ShapeProp records every shape) — a BatchNorm whose dim 1 is not the
    conv's channel dim. Raises ValueError if the model, or a conv/BatchNorm module to fold, is in training mode.
    """
    ensure_module(model, "fuse_conv_bn")
    if model.training:
        raise ValueError(f"fuse_conv_bn: the model ({type(model).__name__}) {_IN_TRAINING}")
    gm = traced_copy(model, "fuse_conv_bn")  # a deep copy: the caller's model stays as it is
    if example_inputs is not None:
        ShapeProp(gm).propagate(*example_inputs)
    report = FusionReport("fuse_conv_bn")
    folded: dict[tuple, str] = {}  # (conv target, bn.key) -> name of the folded module already made
    functional = {n.name: bn for n in gm.graph.nodes if (bn := batch_norm_call(gm, n)) and bn.module is None}

    # TODO(human): fold each BatchNorm fed by a FOLDABLE module into a NEW module (one per conv target and bn.key, shared by the call sites having both) when the conv output has exactly one value user and pair_problem() finds nothing; report every such pair, fused with the new module's name as replacement or skipped with why, its nodes being (conv node name, BatchNorm node name). Hint: batch_norm_call(gm, node) finds BatchNorms of both spellings, .input is what it normalizes; value_users(conv_node) leaves out metadata reads. More: a fold is a new submodule (fold_module builds it, gm.add_submodule installs it under a fresh_name) that the conv's call site points at through its node.target; the BatchNorm node then has no work left: its users read the conv node instead (Node.replace_all_uses_with) and it leaves the graph (Graph.erase_node); the folded dict remembers the modules already made; report.fuse(pattern, nodes, replacement) and report.skip(pattern, nodes, why)
    # BEGIN SOLUTION
    for node in list(gm.graph.nodes):
        bn = batch_norm_call(gm, node)
        conv_node = bn.input if bn is not None else None
        conv = called_module(gm, conv_node)
        if type(conv) not in FOLDABLE:
            continue
        pattern, names = f"{type(conv).__name__}+{bn.kind}", (conv_node.name, node.name)
        users = value_users(conv_node)  # y.shape / y.ndim read no values: they do not count
        if len(users) != 1:
            report.skip(pattern, names, f"{conv_node.name}'s output has {len(users)} users: {[u.name for u in users]}")
            continue
        problem = pair_problem(gm, conv_node, bn)
        if problem:
            report.skip(pattern, names, problem)
            continue
        key = (conv_node.target, bn.key)
        if key not in folded:  # never edit the shared conv: make a new module (once per conv/BN pair)
            folded[key] = fresh_name(gm, conv_node.target.replace(".", "_") + "_bn")
            gm.add_submodule(folded[key], fold_module(conv, bn))
        conv_node.target = folded[key]  # only this call site of the conv changes
        node.replace_all_uses_with(conv_node)
        gm.graph.erase_node(node)
        report.fuse(pattern, names, folded[key])
    # END SOLUTION

    _after_the_folds(gm, report, functional)
    return attach_report(gm, report)


def _after_the_folds(gm: fx.GraphModule, report: FusionReport, functional: dict[str, BatchNormCall]) -> None:
    """Note each fold that rests on the (N, C, ...) layout with no shapes to check it: BatchNorm normalizes dim 1, the
    channel dim only of batched inputs (and for a Linear, 2-d ones); the 2-d/3-d BatchNorm modules refuse other ranks
    themselves, BatchNorm1d and F.batch_norm do not. Clean up; delete the tensors of folded F.batch_norm calls (a
    traced-through BatchNormAct2d's module stays for its activation, and would keep them)."""
    nodes, bn1d_kinds = {node.name: node for node in gm.graph.nodes}, (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)
    for decision in report.fused:
        conv_node = nodes.get(decision.nodes[0])
        if conv_node is None or conv_node.op != "call_module" or "tensor_meta" in conv_node.meta:
            continue
        if decision.nodes[-1] in functional or isinstance(gm.get_submodule(conv_node.target), bn1d_kinds):
            note = "assumed (N, C, ...) input; pass example_inputs to check"
            decision.reason = "; ".join(filter(None, (decision.reason, note)))
    tensors = {target for bn in functional.values() for target in bn.key[1:5] if target}
    delete_unused_attributes(finish_rewrite(gm), tensors)  # those an unfolded F.batch_norm reads stay


# ----------------------------------------------------------------------------------------------------------------------
# The lesson


def _real_model_rows(quick: bool, size: int) -> list[tuple]:
    """Fold real models (random init: nothing is downloaded) in float64; count, exactness, the pass's time."""
    import torchvision

    arch = "resnet18" if quick else "resnet50"
    builders = [(f"torchvision {arch}", getattr(torchvision.models, arch))]
    with contextlib.suppress(ImportError):  # timm is in the dev dependency group
        import timm

        name = "mobilenetv3_small_100" if quick else "efficientnet_b0"
        builders.append((f"timm {name}", functools.partial(timm.create_model, name, pretrained=False)))
    x = torch.randn(1, 3, size, size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rows = []
    for name, build in builders:
        with torch.random.fork_rng(devices=[]):
            model = models.randomize_batchnorm_(build()).double().eval()
        seconds = benchmark.Timer("fold(model)", globals={"fold": fuse_conv_bn, "model": model}).timeit(1).median
        gm, total = fuse_conv_bn(model), batch_norms_in(trace_module(model))
        with torch.no_grad():
            want, theirs = model(x), total - batch_norms_in(trace_module(torch_fx_fuse(model)))
            diff, top = max_abs_diff(gm(x), want), want.abs().max()
        rows.append((name, total, len(report_of(gm).fused), theirs, batch_norms_in(gm), diff, top, seconds))
    return rows


def _where_torch_goes_wrong() -> list[tuple[str, str, str]]:
    """torch's two folds and ours, in float64, on the two cases the docstring names: max abs diff or the error."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        conv, bn = nn.ConvTranspose2d(4, 6, 3, groups=2).double().eval(), nn.BatchNorm2d(6).double().eval()
    models.randomize_batchnorm_(bn)
    convt, shared = nn.Sequential(conv, bn).eval(), models.SharedConvNet().double().eval()
    x, y = (torch.randn(2, 4, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n)) for n in (5, 8))
    cases = [
        ("ConvTranspose2d(4, 6, 3, groups=2)+BN", "torch.nn.utils.fusion.fuse_conv_bn_eval", convt, x,
         lambda: fuse_conv_bn_eval(conv, bn, transpose=True)),
        ("", "fuse_conv_bn", convt, x, lambda: fuse_conv_bn(convt)),
        ("SharedConvNet (conv at 2 sites)", "torch.fx.experimental.optimization.fuse", shared, y,
         lambda: torch_fx_fuse(shared)),
        ("", "fuse_conv_bn", shared, y, lambda: fuse_conv_bn(shared)),
    ]  # fmt: skip
    rows = []
    for case, fold, model, inp, make in cases:
        with torch.no_grad():
            try:
                rows.append((case, fold, f"{max_abs_diff(make()(inp), model(inp)):.3g}"))
            except Exception as e:  # torch's transposed fold: the shapes do not even line up for groups > 1
                rows.append((case, fold, shorten(f"{type(e).__name__}: {str(e).splitlines()[0]}", 36)))
    return rows


def run(quick: bool = False) -> None:
    width, batch, size, min_run_time, rounds = (16, 2, 16, 0.05, 2) if quick else (32, 8, 32, 0.3, 3)
    model = models.ConvBNNet(width=width).eval()
    (x,) = models.conv_inputs(batch=batch, size=size)

    heading("Phase 5 — folding BatchNorm into Conv weights")
    print("ConvBNNet: stem conv(bias=False)→BN→ReLU; conv→BN→ReLU; depthwise conv→BN; + residual; pool; Linear")
    print("In eval mode BN is z = s·(y − μ) + β with s = γ/√(σ²+ε): fold it, W' = s·W, b' = (b − μ)·s + β.")
    stats = {"μ": [1.0, 0.0], "σ²": [3.0, 0.0], "γ": [4.0, 1.0], "β": [0.5, 0.0]}  # 2 channels
    mu, var, gamma, beta = map(torch.tensor, stats.values())
    w, b = fold_conv_bn_weights(torch.ones(2, 1, 1), None, mu, var, 1.0, gamma, beta)  # 1x1, no bias, ε = 1
    print("e.g. W = 1, b = 0, ε = 1, " + ", ".join(f"{k} = {v}" for k, v in stats.items()))
    print(f"     → W' = {w.flatten().tolist()}, b' = {b.tolist()}")

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
    print(table([("float32", diff32), ("float64", diff64)], ["dtype", "max |folded − unfused|"]))
    print("Folding is exact algebra; what is left is rounding (float64 ~1e-15, float32 ~1e-6).")

    heading("Parameters", "-")
    rows = [
        (name, sum(p.numel() for p in m.parameters()), sum(b.numel() for b in m.buffers()), batch_norms_in(m))
        for name, m in (("unfused", trace_module(model)), ("folded", gm))
    ]
    print(table(rows, ["model", "parameters", "buffers (BN running stats)", "BatchNorms"]))
    print("Each BN's γ, β (and its running stats) are gone; bias-less convs gained a bias of C_out values.")

    heading(f"Time on CPU ({torch.get_num_threads()} threads, torch.utils.benchmark, median of {rounds} rounds)", "-")
    times: dict[str, list[float]] = {"unfused": [], "folded": []}
    for _ in range(rounds):  # round-robin (A, B, A, B, ...) so drift hits both alike
        for name, m in (("unfused", model), ("folded", gm)):
            timer = benchmark.Timer("with torch.no_grad(): m(x)", globals={"m": m, "x": x, "torch": torch})
            times[name] += timer.blocked_autorange(min_run_time=min_run_time).times
    t_unfused, t_folded = (torch.tensor(t).median().item() for t in times.values())  # seconds per forward
    rows = [("unfused", t_unfused * 1e6), ("folded", t_folded * 1e6)]
    print(table(rows, ["model", f"median µs per forward, x {tuple(x.shape)}"], floatfmt=".1f"))
    print(f"folded / unfused = {t_folded / t_unfused:.2f} (measured in this run; noisy on a busy machine)")
    print("Each BN is a full read+write of its activation; folding removes it at zero cost to the conv.")

    real = 64 if quick else 224
    heading(f"Real models: every BatchNorm (random init, eval, float64, x (1, 3, {real}, {real}))", "-")
    headers = ["model", "BatchNorms", "folded", "torch's fuse", "left", "max |diff|", "max |out|", "pass (s)"]
    print(table(_real_model_rows(quick, real), headers))
    print("timm's BatchNormAct2d traces to F.batch_norm(..., training=False) on get_attr buffers, then its activation:")
    print("torch.fx.experimental.optimization.fuse matches BatchNorm modules only; fuse_conv_bn folds both spellings.")

    heading("Where torch's own folding goes wrong (float64, max abs diff against the unfused model)", "-")
    print(table(_where_torch_goes_wrong(), ["case", "fold", "max abs diff"]))
    print("torch's weight fold scales dim 1 of [C_in, C_out/groups, k...] by all C_out factors (issue 180995); its fx")
    print("fuse edits the shared conv in place, then folds bn2 into the already-folded conv (issue 104593).")

    heading("Training mode is refused, with the fix", "-")
    try:
        fuse_conv_bn(models.ConvBNNet(width=4))  # a fresh module is in training mode
    except ValueError as e:
        print(textwrap.fill(f"ValueError: {e}", 118, subsequent_indent="  "))


def main(argv: list[str] | None = None) -> int:
    return lesson_cli(run, __doc__, argv)


registry.register(5, fuse_conv_bn=fuse_conv_bn)  # what Phase 4 measures (fusion/compiler/registry.py)
if __name__ == "__main__":
    raise SystemExit(main())
