"""One graph rebuild for every pass that replaces groups of nodes by one call each (a region's submodule, a kernel's
launch): the other nodes are copied, each group's call sits where its first member was, its outputs are read back."""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx


@dataclass(eq=False)
class Group:
    """Nodes that become one call: ``nodes`` in graph order, ``inputs`` (nodes outside the group they read) in
    argument order, ``outputs`` (members read after the group) in the order the call returns them."""

    name: str
    nodes: Sequence[fx.Node]
    inputs: Sequence[fx.Node]
    outputs: Sequence[fx.Node]
    returns_tuple: bool = True  # False: the call's value is its one output itself (no getitem)
    at: fx.Node | None = None  # the member where the call sits (None: the first); later when it reads another group


Emit = Callable[[fx.Graph, Group, tuple[fx.Node, ...]], fx.Node]  # writes the group's call into the new graph


def rebuild(
    gm: fx.GraphModule,
    groups: Sequence[Group],
    emit: Emit,
    modules: Mapping[str, torch.nn.Module] | None = None,
    class_name: str | None = None,
    dead: Collection[fx.Node] = (),
) -> fx.GraphModule:
    """A new GraphModule computing what ``gm`` computes, each group replaced by the one call ``emit`` writes.

    Every other node is copied (meta kept). Each output is read back through ``operator.getitem`` (meta copied from
    the output), or is the call itself when the group does not return a tuple. A group's call sits where its first
    member was (or at ``group.at``), so the group must be convex: an input defined after that point raises a ValueError. ``modules``
    (the submodules the calls use, or keep to inspect) join the attributes of ``gm`` the new graph names. ``dead``:
    nodes left out (dead code the caller found; no group member may be one). ``gm`` is not modified.
    """
    modules = dict(modules or {})
    group_of: dict[fx.Node, Group] = {}
    for group in groups:
        for node in group.nodes:
            if node.graph is not gm.graph:
                raise ValueError(f"group {group.name}: node {node.name!r} is not in this graph")
            group_of[node] = group
    graph = fx.Graph(tracer_cls=gm.graph._tracer_cls)
    graph._codegen = copy.deepcopy(gm.graph._codegen)
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        group = group_of.get(node)
        if group is None:
            if node in dead:
                continue
            env[node] = graph.node_copy(node, functools.partial(_defined, env, node))
        elif node is (group.at or group.nodes[0]):
            call = emit(graph, group, tuple(_defined(env, group, n) for n in group.inputs))
            if not group.returns_tuple:
                (out,) = group.outputs
                call.meta = {**copy.copy(out.meta), **call.meta}
                env[out] = call
                continue
            for i, out in enumerate(group.outputs):
                item = graph.call_function(operator.getitem, (call, i))
                item.meta = copy.copy(out.meta)
                env[out] = item
    named = (n.target for n in graph.nodes if n.op in ("get_attr", "call_module") and n.target not in modules)
    new = fx.GraphModule(
        {**{t: operator.attrgetter(t)(gm) for t in named}, **modules}, graph, class_name=class_name or type(gm).__name__
    )
    new.training = gm.training
    for name, mod in modules.items():  # a module no node names (a kernel launched by a function call) is kept too
        if not hasattr(new, name):
            new.add_submodule(name, mod)
    return new


def _defined(env: dict[fx.Node, fx.Node], reader: fx.Node | Group, node: fx.Node) -> fx.Node:
    """The new graph's ``node``, or a ValueError naming who reads it before it is defined there."""
    new = env.get(node)
    if new is None:
        where = (
            f"group {reader.name} (at its first member {reader.nodes[0].name!r})"
            if isinstance(reader, Group)
            else f"node {reader.name!r}"
        )
        raise ValueError(
            f"{where} reads {node.name!r}, which is not defined at that point: it comes later in the graph (the group "
            "is not convex: a path leaves it and comes back) or it is a member that its group does not return"
        )
    return new


def group_module(gm: fx.GraphModule, group: Group) -> fx.GraphModule:
    """The group's nodes as a GraphModule of their own: one placeholder per input (meta kept), returning its outputs
    (a tuple, or the one output itself when the group does not return a tuple). Attributes are taken from ``gm``."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for inp in group.inputs:
        env[inp] = graph.placeholder(inp.name, type_expr=inp.type)
        env[inp].meta = copy.copy(inp.meta)
    for node in group.nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    outs = tuple(env[n] for n in group.outputs)
    graph.output(outs if group.returns_tuple else outs[0])
    return fx.GraphModule(gm, graph, class_name=group.name)
