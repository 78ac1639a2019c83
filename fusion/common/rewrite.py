"""What every rewrite ends with (:func:`finish_rewrite`: lint, dead-code elimination that keeps in-place
statements, recompile), and the test it rests on: does a node have an effect although nobody reads it?"""

from __future__ import annotations

import inspect

import torch
import torch.fx as fx


def mutates_an_input(node: fx.Node, modules: dict[str, torch.nn.Module]) -> bool:
    """Does ``node`` write into one of its inputs (``h.relu_()``, ``torch.relu_(h)``, ``F.relu(h, inplace=True)``,
    ``nn.ReLU(inplace=True)``, a mutable aten op)? Then it has an effect even when nobody reads its result."""
    target = node.target
    if node.op == "call_method":
        return target.endswith("_") and not target.startswith("_")
    if node.op == "call_module":
        return getattr(modules.get(target), "inplace", False) is True
    if node.op != "call_function":
        return False
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    name = getattr(target, "__name__", "")
    if name.endswith("_") and not name.startswith("_"):
        return True
    try:
        bound = inspect.signature(target).bind(*node.args, **node.kwargs)
    except (TypeError, ValueError):  # a builtin without a signature, or arguments that do not bind
        return False
    return bound.arguments.get("inplace", False) is True


def has_effect(node: fx.Node, modules: dict[str, torch.nn.Module]) -> bool:
    """Must ``node`` stay although nobody reads its result? fx's impure nodes (placeholders, the output, random
    ops, ...) and every node that writes into one of its inputs (:func:`mutates_an_input`)."""
    return node.is_impure() or mutates_an_input(node, modules)


def finish_rewrite(gm: fx.GraphModule) -> fx.GraphModule:
    """The clean-up every rewrite ends with: lint, dead-code elimination, drop unused submodules, recompile.

    Dead-code elimination keeps in-place statements: fx's default would delete ``h.relu_()`` whose result nobody
    reads, although it changes ``h`` for everyone who reads ``h`` later.
    """
    gm.graph.lint()
    modules = dict(gm.named_modules())
    gm.graph.eliminate_dead_code(is_impure_node=lambda n: has_effect(n, modules))
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm
