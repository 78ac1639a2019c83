"""BatchNorms in a traced graph, in both spellings (a ``_BatchNorm`` module call, or ``F.batch_norm`` on attributes
of the model), with what a fold reads; the users of a node that read its values; a tracer that keeps BatchNorm
subclasses whole; and the clean-up of attributes nothing reads any more."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from fusion.common import copy_to_graph_module, mutates_an_input


@dataclass
class BatchNormCall:
    """One BatchNorm of the graph, module call or ``F.batch_norm``, with what a fold reads (``fold_module`` takes it
    like an ``nn.BatchNorm*d``: same attribute names)."""

    node: fx.Node
    input: object  # the node it normalizes
    kind: str  # the module's class name ("BatchNorm2d") or "F.batch_norm"
    running_mean: torch.Tensor | None
    running_var: torch.Tensor | None
    weight: torch.Tensor | None  # gamma; None = 1
    bias: torch.Tensor | None  # beta; None = 0
    eps: float
    key: tuple  # names these statistics: call sites with equal keys (and the same conv) share one folded module
    module: _BatchNorm | None = None  # the module, for a module call
    problem: str = ""  # why the statistics are not fixed constants of the model ("" when they are)


FUNCTIONAL_BATCH_NORMS = (F.batch_norm, torch.batch_norm)


def _attribute(gm: fx.GraphModule, user: fx.Node, name: str, arg: object) -> tuple[torch.Tensor | None, str]:
    """(tensor, "") for an F.batch_norm argument that is None or a ``get_attr`` nothing writes; else (None, why)."""
    if arg is None or not (isinstance(arg, fx.Node) and arg.op == "get_attr"):
        return None, "" if arg is None else f"{name} is computed by the graph, not an attribute of the model"
    others = [u for u in arg.users if u is not user]
    if others and any(mutates_an_input(u, dict(gm.named_modules())) for u in others):
        return None, f"{name} ({arg.target}) is written in place elsewhere in the graph"
    return functools.reduce(getattr, arg.target.split("."), gm), ""


def batch_norm_call(gm: fx.GraphModule, node: fx.Node) -> BatchNormCall | None:
    """The BatchNorm ``node`` computes: a ``_BatchNorm`` module call, or ``F.batch_norm``/``torch.batch_norm``
    (arguments normalized to keywords). None if ``node`` is no BatchNorm."""
    if node.op == "call_module" and isinstance(bn := gm.get_submodule(node.target), _BatchNorm):
        stats = (bn.running_mean, bn.running_var, bn.weight, bn.bias, bn.eps)
        return BatchNormCall(node, _first_input(node), type(bn).__name__, *stats, key=(node.target,), module=bn)
    if node.op != "call_function" or node.target not in FUNCTIONAL_BATCH_NORMS:
        return None
    normalized = node.normalized_arguments(gm, normalize_to_only_use_kwargs=True)
    if normalized is None:  # arguments that match no batch_norm signature: not one we can read
        return None
    kw = normalized.kwargs
    names = ("running_mean", "running_var", "weight", "bias")
    tensors, problems = zip(*(_attribute(gm, node, name, kw[name]) for name in names), strict=True)
    problems = [p for p in problems if p]
    if kw["training"] is not False:  # a Node, or True: batch statistics at run time
        problems.insert(0, "training=True: it normalizes each batch by its own statistics, which no fixed weights "
                        "reproduce (a BatchNorm module in training mode? call model.eval())")  # fmt: skip
    elif tensors[0] is None or tensors[1] is None:
        problems.append("no running stats")
    if not isinstance(kw["eps"], (int, float)):
        problems.append("eps is computed by the graph")
    key = ("F.batch_norm", *(getattr(kw[name], "target", None) for name in names), kw["eps"])
    problem = problems[0] if problems else ""
    return BatchNormCall(node, kw["input"], "F.batch_norm", *tensors, eps=kw["eps"], key=key, problem=problem)


def value_users(node: fx.Node) -> list[fx.Node]:
    """The users of ``node`` that read its *values*; ``y.shape``, ``y.ndim``, ``y.size(1)``, ``y.dim()`` ... read
    metadata only, which folding keeps (same shape, dtype, device), so they do not count."""

    def metadata_only(user: fx.Node) -> bool:
        if not user.args or user.args[0] is not node or node in [*user.args[1:], *user.kwargs.values()]:
            return False
        if user.op == "call_function" and user.target is getattr:
            return user.args[1] in ("shape", "ndim", "dtype", "device", "is_cuda", "layout")
        return user.op == "call_method" and user.target in ("size", "dim", "ndimension", "numel", "nelement")

    return [user for user in node.users if not metadata_only(user)]


def called_module(gm: fx.GraphModule, node: object) -> nn.Module | None:
    """The submodule a ``call_module`` node calls, else None."""
    return gm.get_submodule(node.target) if isinstance(node, fx.Node) and node.op == "call_module" else None


def _first_input(node: fx.Node) -> object:
    """The tensor argument of a one-input call: ``bn(x)`` or ``bn(input=x)``."""
    return node.args[0] if node.args else node.kwargs.get("input")


class BatchNormTracer(fx.Tracer):
    """``symbolic_trace``'s tracer, but a BatchNorm subclass keeping the standard forward stays one module call:
    traced through, that forward fails (its ``if input.dim() != 4: raise`` is control flow on a Proxy)."""

    def is_leaf_module(self, m: nn.Module, qualified_name: str) -> bool:
        standard = isinstance(m, _BatchNorm) and type(m).forward is _BatchNorm.forward
        return standard or super().is_leaf_module(m, qualified_name)


def traced_copy(model: nn.Module, what: str) -> fx.GraphModule:
    """A deep copy of ``model`` traced with ``BatchNormTracer``; an untraceable model gets common's one clear error
    (``what`` names the pass in it)."""
    root = copy.deepcopy(model)
    try:
        return fx.GraphModule(root, BatchNormTracer().trace(root), type(root).__name__)
    except Exception:  # noqa: BLE001 - traced again by common, which raises UntraceableModelError naming the line
        return copy_to_graph_module(model, what=what)


def batch_norms_in(gm: fx.GraphModule) -> int:
    """How many BatchNorms a traced model computes: module calls and F.batch_norm calls."""
    return sum(batch_norm_call(gm, node) is not None for node in gm.graph.nodes)


def delete_unused_attributes(gm: fx.GraphModule, targets: set[str]) -> None:
    """Delete each attribute of ``targets`` (dotted names) that no ``get_attr``/``call_module`` node reads any more,
    unless its module, or one above it, is still called (it may read the attribute itself)."""
    used = {node.target for node in gm.graph.nodes if node.op in ("get_attr", "call_module")}
    for target in targets - used:
        owner, _, name = target.rpartition(".")
        module = functools.reduce(lambda m, part: getattr(m, part, None), owner.split(".") if owner else [], gm)
        if hasattr(module, name) and not any(owner == u or owner.startswith(u + ".") for u in used):
            delattr(module, name)
