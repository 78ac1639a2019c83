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
from fusion.common import FusionReport, attach_report, finish_rewrite

REGION_PREFIX = "fusion_region_"  # collapse_regions names each region submodule fusion_region_<i>


def _copy_graph_module(gm: fx.GraphModule) -> tuple[fx.GraphModule, dict[fx.Node, fx.Node]]:
    """A new GraphModule over a copy of ``gm``'s graph (node meta kept) and the old→new node map.

    The copy shares parameters with ``gm`` but not its graph: rewriting it leaves ``gm`` untouched.
    """
    graph = fx.Graph(tracer_cls=gm.graph._tracer_cls)
    env: dict[fx.Node, fx.Node] = {}
    out, old_output = graph.graph_copy(gm.graph, env, return_output_node=True)
    new_output = graph.output(out, type_expr=getattr(old_output, "type", None))
    new_output.meta = copy.copy(old_output.meta)
    env[old_output] = new_output
    graph._codegen = copy.deepcopy(gm.graph._codegen)
    new = fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    new.meta.update({k: v for k, v in gm.meta.items() if k != "fusion_report"})
    return new, env


def collapse_regions(gm: fx.GraphModule, region_of: dict) -> fx.GraphModule:
    """A new GraphModule in which every region is one ``call_module`` node (``fusion_region_<i>``).

    Uses ``torch.fx.passes.utils.fuser_utils.fuse_by_partitions``. Dead code is removed first, so a region whose
    result nobody uses (a dead fusible chain) is dropped rather than fused, and the report says so. ``gm`` is not
    modified. The report (``report_of(result)``) lists each region fused or skipped.
    """
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    if not isinstance(gm, fx.GraphModule):
        raise TypeError(
            f"collapse_regions needs the torch.fx.GraphModule the regions were built on, got {type(gm).__name__}"
        )
    new, env = _copy_graph_module(gm)
    report = FusionReport("collapse_regions")
    regions = unique_regions(region_of)
    for region in regions:
        stranger = next((n for n in region.nodes if n not in env), None)
        if stranger is not None:
            raise ValueError(
                f"region {region.index} contains node {stranger.name!r}, which is not in this graph. "
                "Fix: pass the region_of that build_fusion_regions returned for this same GraphModule"
            )

    new.graph.eliminate_dead_code()  # mutating ops (copy_) are impure and stay
    alive = set(new.graph.nodes)
    partitions: list[dict[fx.Node, None]] = []
    names: list[str] = []
    for region in regions:
        kept = [env[n] for n in region.nodes if env[n] in alive]
        if sum(not is_view_node(n) for n in kept) < 2:
            why = "dead code: nothing uses its result" if not kept else f"only {len(kept)} live node(s) after DCE"
            report.skip("region", [n.name for n in region.nodes], why)
            continue
        name = f"{REGION_PREFIX}{len(partitions)}"
        partitions.append(dict.fromkeys(kept))
        names.append(name)
        dropped = len(region.nodes) - len(kept)
        note = f"{fmt_bytes(region.total_bytes)} external" if _has_meta(region) else "not costed (no meta)"
        if dropped:
            note += f"; {dropped} dead member(s) removed first"
        report.fuse("region", [n.name for n in kept], replacement=name, reason=note)
    if partitions:
        fuse_by_partitions(new, partitions, prefix=REGION_PREFIX)
    finish_rewrite(new)
    new.meta["fusion_region_modules"] = names
    return attach_report(new, report)


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
