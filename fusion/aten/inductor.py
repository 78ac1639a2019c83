"""Our fusion regions next to Inductor's (``torch._inductor.fx_passes.fusion_regions``) on the same aten graph.

Both group the same way (contiguous spans of fusible nodes, connected pieces with >= 2 non-view ops); they can only
differ where the two *fusibility rules* disagree. Inductor's rule asks its lowering table (an op with a lowering that
is no eager fallback and has no FLOP formula); ours asks the op's tags and a few named families. The differences
kept on purpose are listed in :data:`KNOWN_DIFFERENCES`; :func:`fusibility_differences` finds every other one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.aten.nodes import short_target, unique_regions

# op (as short_target names it) -> why our rule deliberately differs from Inductor's on it.
KNOWN_DIFFERENCES: dict[str, str] = {
    "getitem": (
        "ours gives operator.getitem its producer's verdict, so var_mean's (var, mean) and max-pool's values stay "
        "inside their region; Inductor's rule accepts only aten OpOverloads, so a getitem ends its span"
    ),
}


def inductor_fusion_regions() -> Callable | None:
    """Inductor's ``build_fusion_regions`` when this torch ships it (2.15 does), else None."""
    try:
        from torch._inductor.fx_passes import fusion_regions
    except Exception:
        return None
    return getattr(fusion_regions, "build_fusion_regions", None)


def inductor_verdict(node: fx.Node) -> tuple[bool, str]:
    """Inductor's is_fusible_node, with the rule that decided it (mirrors its checks, for explanations only)."""
    from torch._inductor.fx_passes import fusion_regions

    fusible = bool(fusion_regions.is_fusible_node(node))
    target = node.target
    if node.op != "call_function":
        return fusible, f"{node.op}"
    if not isinstance(target, torch._ops.OpOverload):
        return fusible, f"{getattr(target, '__name__', target)} is not an aten OpOverload"
    try:
        from torch._inductor.lowering import fallbacks, lowerings
        from torch.utils.flop_counter import flop_registry
    except Exception:
        return fusible, "its lowering table"
    if target not in lowerings:
        return fusible, "no Inductor lowering"
    if target in fallbacks:
        return fusible, "an eager fallback"
    if target.overloadpacket in flop_registry:
        return fusible, "has a FLOP formula (compute-bound)"
    if target._schema.name == "aten::cat" and not fusible:
        return fusible, f"cat of {len(node.args[0])} > max_pointwise_cat_inputs inputs"
    return fusible, "has a fusible lowering"


def compare_with_inductor(
    gm: fx.GraphModule,
    region_of: dict,
    is_fusible: Callable[[fx.Node], bool],
    reason: Callable[[fx.Node], str],
) -> list[tuple] | None:
    """Rows (verdict, ours, Inductor's, why) matching our regions with Inductor's on the same graph; None without it.

    Regions that share nodes are grouped; a group is ``same`` (identical node sets), ``merged`` (ours is larger:
    one of ours covers several of Inductor's, or nodes it leaves out), ``split`` (ours is smaller), ``different``
    (both). The reason names the nodes on whose fusibility the two rules disagree (``is_fusible`` is our rule,
    ``reason`` says why it decided), and marks the differences kept on purpose: :data:`KNOWN_DIFFERENCES`.
    """
    theirs_fn = inductor_fusion_regions()
    if theirs_fn is None:
        return None
    theirs_of = theirs_fn(gm)
    ours = unique_regions(region_of)
    theirs = list({id(s): s for s in theirs_of.values()}.values())
    their_index = {id(s): i for i, s in enumerate(theirs)}

    # Union the two families of regions into groups of overlapping regions (small: a handful per model).
    groups: list[tuple[set[int], set[int]]] = []  # (our indices, their indices)
    owner: dict[fx.Node, int] = {}
    for i, r in enumerate(ours):  # by position, not r.index: a region built by hand may leave index at -1
        gid = len(groups)
        groups.append(({i}, set()))
        for n in r.nodes:
            owner[n] = gid
    for s in theirs:
        hits = {owner[n] for n in s if n in owner}
        if not hits:
            gid = len(groups)
            groups.append((set(), {their_index[id(s)]}))
        else:
            gid = min(hits)
            for other in hits - {gid}:
                groups[gid][0].update(groups[other][0])
                groups[gid][1].update(groups[other][1])
                for n, g in owner.items():
                    if g == other:
                        owner[n] = gid
                groups[other] = (set(), set())
            groups[gid][1].add(their_index[id(s)])
        for n in s:
            owner[n] = gid

    nodes = list(gm.graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    rows = []
    for our_ids, their_ids in groups:
        if not our_ids and not their_ids:
            continue
        ours_nodes = {n for i in our_ids for n in ours[i].nodes}
        their_nodes = {n for i in their_ids for n in theirs[i]}
        if ours_nodes == their_nodes and len(our_ids) == len(their_ids) == 1:
            verdict = "same"
        elif ours_nodes >= their_nodes and len(our_ids) <= len(their_ids):
            verdict = "merged" if their_ids else "ours only"
        elif ours_nodes <= their_nodes and len(our_ids) >= len(their_ids):
            verdict = "split" if our_ids else "Inductor only"
        else:
            verdict = "different"
        reasons: list[str] = []
        if verdict != "same":
            # Where the two rules disagree between the group's first and last node: those nodes moved a boundary.
            group = ours_nodes | their_nodes
            lo = min(position[n] for n in group)
            hi = max(position[n] for n in group)
            disagree: dict[str, list[str]] = {}  # one line per op and verdict pair, naming its nodes
            for n in nodes[max(lo - 1, 0) : hi + 2]:
                mine = is_fusible(n)
                their_fusible, their_why = inductor_verdict(n)
                if mine != their_fusible:
                    why = (
                        f"ours {'fusible' if mine else 'not fusible'} ({reason(n)}), "
                        f"Inductor {'fusible' if their_fusible else 'not fusible'} ({their_why})"
                    )
                    if short_target(n) in KNOWN_DIFFERENCES:
                        why += " [known difference]"
                    disagree.setdefault(f"{short_target(n)}: {why}", []).append(n.name)
            reasons = [f"{', '.join(names)} = {why}" for why, names in disagree.items()]
            if not reasons:
                reasons.append("the same fusibility verdicts: a region dropped by the >= 2 non-view rule")
        ours_text = ", ".join(f"#{i} ({len(ours[i].nodes)})" for i in sorted(our_ids)) or "-"
        theirs_text = ", ".join(f"#{i} ({len(theirs[i])})" for i in sorted(their_ids)) or "-"
        rows.append((verdict, ours_text, theirs_text, "; ".join(dict.fromkeys(reasons)) or "-"))
    return rows


def fusibility_differences(gm: fx.GraphModule, is_fusible: Callable[[fx.Node], bool]) -> dict[str, list[str]]:
    """Nodes on whose fusibility our rule and Inductor's disagree: ``{"op: ours X, Inductor Y": [node names]}``.

    Empty when this torch has no Inductor region builder.
    """
    if inductor_fusion_regions() is None:
        return {}
    found: dict[str, list[str]] = {}
    for n in gm.graph.nodes:
        mine = is_fusible(n)
        theirs, _ = inductor_verdict(n)
        if mine != theirs:
            key = f"{short_target(n)}: ours {'fusible' if mine else 'not'}, Inductor {'fusible' if theirs else 'not'}"
            found.setdefault(key, []).append(n.name)
    return found
