"""Collapse every fusion region of an aten graph into one ``call_module`` node, and expand it back.

The collapsed graph shows the kernels a compiler would launch: one submodule per region, library calls between
them. It computes exactly what the original graph computes (the regions are convex: nothing is reordered).
"""

from __future__ import annotations

import copy
import operator

import torch.fx as fx

from fusion.aten.nodes import MissingMetaError, is_view_node, unique_regions
from fusion.aten.report import fmt_bytes
from fusion.common import FusionReport, attach_report, finish_rewrite, has_effect
from fusion.fxutils.rebuild import Group, group_module, rebuild

REGION_PREFIX = "fusion_region_"  # collapse_regions names each region submodule fusion_region_<i>


def collapse_regions(gm: fx.GraphModule, region_of: dict) -> fx.GraphModule:
    """A new GraphModule in which every region is one ``call_module`` node (``fusion_region_<i>``).

    Built by :func:`~fusion.fxutils.rebuild.rebuild`, the rebuild Phase 8's compiled graph uses too. Dead code is
    left out first, so a region whose result nobody uses (a dead fusible chain) is dropped rather than fused, and the
    report says so. A region with one output returns it, one with several a tuple (read by getitems). ``gm`` is not
    modified. The report (``report_of(result)``) lists each region fused or skipped.
    """
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(
            f"collapse_regions needs the torch.fx.GraphModule the regions were built on, got {type(gm).__name__}"
        )
    report = FusionReport("collapse_regions")
    regions = unique_regions(region_of)
    for region in regions:
        stranger = next((n for n in region.nodes if n.graph is not gm.graph), None)
        if stranger is not None:
            raise ValueError(
                f"region {region.index} contains node {stranger.name!r}, which is not in this graph. "
                "Fix: pass the region_of that build_fusion_regions returned for this same GraphModule"
            )

    live = _live_nodes(gm)
    groups: list[Group] = []
    modules: dict[str, fx.GraphModule] = {}
    for region in regions:
        kept = [n for n in region.nodes if n in live]
        if sum(not is_view_node(n) for n in kept) < 2:
            why = "dead code: nothing uses its result" if not kept else f"only {len(kept)} live node(s) after DCE"
            report.skip("region", [n.name for n in region.nodes], why)
            continue
        members = set(kept)
        inputs = dict.fromkeys(i for n in kept for i in n.all_input_nodes if i not in members)
        outputs = [n for n in kept if any(u in live and u not in members for u in n.users)]
        group = Group(f"{REGION_PREFIX}{len(groups)}", kept, list(inputs), outputs, returns_tuple=len(outputs) != 1)
        groups.append(group)
        modules[group.name] = group_module(gm, group)
        dropped = len(region.nodes) - len(kept)
        note = f"{fmt_bytes(region.total_bytes)} external" if _has_meta(region) else "not costed (no meta)"
        if dropped:
            note += f"; {dropped} dead member(s) removed first"
        report.fuse("region", [n.name for n in kept], replacement=group.name, reason=note)
    new = rebuild(gm, groups, _call_region, modules, dead=set(gm.graph.nodes) - live)
    new.meta.update({k: v for k, v in gm.meta.items() if k != "fusion_report"})
    finish_rewrite(new)
    new.meta["fusion_region_modules"] = list(modules)
    return attach_report(new, report)


def _live_nodes(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes dead-code elimination keeps (as :func:`finish_rewrite` runs it): those with an effect (placeholders,
    the output, mutating ops such as ``copy_``) and every node they read, directly or not."""
    modules = dict(gm.named_modules())
    live: set[fx.Node] = set()
    for node in reversed(gm.graph.nodes):
        if not live.isdisjoint(node.users) or has_effect(node, modules):
            live.add(node)
    return live


def _call_region(graph: fx.Graph, group: Group, args: tuple[fx.Node, ...]) -> fx.Node:
    call = graph.call_module(group.name, args)
    if group.returns_tuple:
        call.meta["val"] = tuple(n.meta.get("val") for n in group.outputs)
    return call


def _has_meta(region) -> bool:
    try:
        region.total_bytes  # noqa: B018
    except MissingMetaError:
        return False
    return True


def expand_regions(gm: fx.GraphModule) -> fx.GraphModule:
    """The inverse of :func:`collapse_regions`: inline every ``fusion_region_<i>`` submodule back into the graph.

    Node meta (``meta["val"]``) survives the round trip, so the result can be costed again. ``gm`` is not modified.
    """
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"expand_regions needs a torch.fx.GraphModule, got {type(gm).__name__}")
    graph = fx.Graph(tracer_cls=gm.graph._tracer_cls)
    graph._codegen = copy.deepcopy(gm.graph._codegen)
    env: dict[fx.Node, object] = {}
    report = FusionReport("expand_regions")

    def lookup(n: fx.Node) -> object:
        return env[n]

    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(node.target, str) and node.target.startswith(REGION_PREFIX):
            sub = gm.get_submodule(node.target)
            args = fx.node.map_arg(node.args, lookup)
            sub_env: dict[fx.Node, object] = {}
            placeholders = [p for p in sub.graph.nodes if p.op == "placeholder"]
            if len(placeholders) != len(args) or node.kwargs:
                raise ValueError(f"{node.name}: expected {len(placeholders)} positional inputs for {node.target}")
            sub_env.update(zip(placeholders, args, strict=True))
            for sub_node in sub.graph.nodes:
                if sub_node.op == "placeholder":
                    continue
                if sub_node.op == "output":
                    env[node] = fx.node.map_arg(sub_node.args[0], sub_env.__getitem__)
                    break
                sub_env[sub_node] = graph.node_copy(sub_node, sub_env.__getitem__)
            report.fuse("inline", [node.name], replacement=node.target, reason=f"{len(sub_env) - len(args)} nodes")
        elif (
            node.op == "call_function"
            and node.target is operator.getitem
            and isinstance(env.get(node.args[0]), (tuple, list))
        ):
            env[node] = env[node.args[0]][node.args[1]]  # a region's i-th output is now that node itself
        else:
            env[node] = graph.node_copy(node, lookup)
    new = fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    new.meta.update({k: v for k, v in gm.meta.items() if k not in ("fusion_report", "fusion_region_modules")})
    finish_rewrite(new)
    return attach_report(new, report)
