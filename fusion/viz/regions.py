"""Phase 6's picture: an aten graph with its fusion regions (``python -m fusion.regions --plot regions.png``).

Each op is a box in data-flow order (left to right, each op as late as its users allow, so a BatchNorm's per-channel
constants sit beside the op that reads them), filled with its region's colour: one colour, one kernel. An op that
cuts a span (matmul, convolution: not fusible) is grey with a red outline, and a short label says why it is not
fusible; a fusible op that stays alone (one op is no region) is white. Views and ``getitem`` move no bytes and are
not drawn (an edge goes through them); parameters and buffers are not drawn either.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from types import ModuleType

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node, unique_regions
from fusion.viz import palette, pyplot

SHORT = {"convert_element_type": "to dtype", "_native_batch_norm_legit_no_training": "batch_norm", "clamp_min": "clamp≥",
         "clamp_max": "clamp≤", "convolution": "conv", "_low_memory_max_pool_with_offsets": "max_pool",
         "_low_memory_max_pool2d_with_offsets": "max_pool", "max_pool2d_with_indices": "max_pool"}  # fmt: skip
GREY, CUT = "#d9d9d9", "#c0392b"


def label(node: fx.Node) -> str:
    """The op's short name (``add``, ``rsqrt``, ``conv``), or the input's own name."""
    if node.op != "call_function":
        return node.name if node.op == "placeholder" else node.op
    t = node.target
    name = t.overloadpacket.__name__ if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", str(t))
    return SHORT.get(name, name)


def drawn_graph(gm: fx.GraphModule, hidden: set[fx.Node]) -> tuple[list[fx.Node], dict[fx.Node, list[fx.Node]]]:
    """The nodes drawn (not hidden, not views) in graph order, and each one's drawn inputs (through views)."""
    skip = {n for n in gm.graph.nodes if n in hidden or (n.op == "call_function" and is_view_node(n))}

    def sources(n: fx.Node) -> list[fx.Node]:
        if n in hidden:
            return []
        if n not in skip:
            return [n]
        return [s for i in n.all_input_nodes for s in sources(i)]

    nodes = [n for n in gm.graph.nodes if n not in skip]
    inputs = {n: list(dict.fromkeys(s for i in n.all_input_nodes for s in sources(i))) for n in nodes}
    return nodes, inputs


def spine(nodes: Sequence[fx.Node], inputs: dict[fx.Node, list[fx.Node]]) -> list[fx.Node]:
    """The longest chain of drawn nodes ending at the last one (the output): the row everything else hangs off."""
    longest: dict[fx.Node, tuple[int, fx.Node | None]] = {}
    for n in nodes:
        best = max(inputs[n], key=lambda i: longest[i][0], default=None)
        longest[n] = (1 + (longest[best][0] if best is not None else 0), best)
    chain, n = [], nodes[-1]
    while n is not None:
        chain.append(n)
        n = longest[n][1]
    return chain[::-1]


def layout(nodes: Sequence[fx.Node], inputs: dict[fx.Node, list[fx.Node]]) -> dict[fx.Node, tuple[float, float]]:
    """(column, row) per node. Each node as late as its users allow (one column before its first user), the
    longest chain (:func:`spine`) on row 0, every other node on the free row nearest the mean row of its neighbours
    (a few sweeps each way), above the spine where it can: the row below a cut on the spine keeps its label."""
    users: dict[fx.Node, list[fx.Node]] = {n: [] for n in nodes}
    for n in nodes:
        for i in inputs[n]:
            users[i].append(n)
    to_end: dict[fx.Node, int] = {}
    for n in reversed(nodes):
        to_end[n] = 1 + max((to_end[u] for u in users[n]), default=-1)
    last = max(to_end.values())
    column = {n: last - to_end[n] for n in nodes}
    columns: list[list[fx.Node]] = [[] for _ in range(last + 1)]
    for n in nodes:
        columns[column[n]].append(n)
    main = set(spine(nodes, inputs))
    row = {n: 0.0 if n in main else -1.0 for n in nodes}

    def place(col: list[fx.Node], neighbours: Callable[[fx.Node], list[fx.Node]]) -> None:
        taken = {0.0, 1.0} if any(n in main for n in col) else set()  # the spine, and the row for its label
        side = [n for n in col if n not in main]
        keys = {n: sum(row[m] for m in neighbours(n)) / len(neighbours(n)) if neighbours(n) else row[n] for n in side}
        for n in sorted(side, key=lambda n: (abs(keys[n]), keys[n])):
            want = float(round(keys[n])) or -1.0
            free = sorted((r for r in range(-len(col) - 2, len(col) + 3) if r not in taken),
                          key=lambda r: (abs(r - want), r > 0))  # fmt: skip
            row[n] = float(free[0])
            taken.add(row[n])

    for _ in range(3):
        for col in columns:
            place(col, lambda n: inputs[n])
        for col in reversed(columns):
            place(col, lambda n: users[n] or inputs[n])
    low = min(row.values())
    return {n: (float(column[n]), row[n] - low) for n in nodes}


def draw_regions(
    ax,
    gm: fx.GraphModule,
    region_of: dict,
    *,
    is_fusible: Callable[[fx.Node], bool],
    reason: Callable[[fx.Node], str],
    hidden: set[fx.Node] = frozenset(),
    title: str = "",
) -> tuple[float, float]:
    """Draw ``gm``'s ops on ``ax``, coloured by ``region_of`` (node -> region with ``.index``); a not-fusible op
    next to a region gets ``reason(node)`` as its label. Returns the drawing's (width, height) in boxes."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

    nodes, inputs = drawn_graph(gm, set(hidden))
    at = layout(nodes, inputs)
    regions = unique_regions(region_of)
    colours = dict(zip((r.index for r in regions), palette(len(regions)), strict=True))
    w, h = 0.78, 0.42
    for n in nodes:
        for i in inputs[n]:
            (x0, y0), (x1, y1) = at[i], at[n]
            if x1 - x0 > 1 and y0 == y1:  # over the boxes between: up, across, down
                ends, style = ((x0, y0 - h / 2), (x1 - w / 4, y1 - h / 2)), "arc,angleA=90,angleB=90,armA=9,armB=9"
            else:
                ends, style = ((x0 + w / 2, y0), (x1 - w / 2, y1)), "arc3,rad=0"
            ax.add_patch(FancyArrowPatch(*ends, arrowstyle="-|>", mutation_scale=7, connectionstyle=style,
                                         color="#555555", lw=0.7, zorder=1))  # fmt: skip
    near_region = {i for n in nodes if n in region_of for i in inputs[n]}
    near_region |= {n for n in nodes if any(i in region_of for i in inputs[n])}
    for n in nodes:
        x, y = at[n]
        region = region_of.get(n)
        cut = n.op == "call_function" and region is None and not is_fusible(n)
        if region is not None:
            face, edge = colours[region.index], "#333333"
        elif n.op != "call_function":
            face, edge = "#f5f5f5", "#999999"
        else:
            face, edge = (GREY, CUT) if cut else ("white", "#333333")
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                    fc=face, ec=edge, lw=1.4 if cut else 0.8, alpha=0.9, zorder=2))  # fmt: skip
        ax.text(x, y, label(n), ha="center", va="center", fontsize=6.5, zorder=3)
        if cut and n in near_region:
            why = "\n".join(textwrap.wrap(f"cut: {reason(n)}", 16))
            ax.text(x, y + h / 2 + 0.06, why, ha="center", va="top", fontsize=5.5, color=CUT, zorder=3)
        elif n.op == "call_function" and region is None and not is_view_node(n):
            ax.text(x, y + h / 2 + 0.06, "alone:\nno region", ha="center", va="top", fontsize=5.5, color="#666666")
    width = max(x for x, _ in at.values()) + 1
    height = max(y for _, y in at.values()) + 1
    ax.set_xlim(-0.6, width - 0.4)
    ax.set_ylim(height + 0.3, -0.8)  # rows grow downwards, room for the labels under the last row
    ax.axis("off")
    handles = [Patch(fc=colours[r.index], ec="#333333", label=f"region {r.index}: {sum(not is_view_node(m) for m in r.nodes)} ops, 1 kernel")
               for r in regions]  # fmt: skip
    handles.append(Patch(fc=GREY, ec=CUT, label="not fusible: cuts the span"))
    ax.legend(handles=handles, fontsize=6.5, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    if title:
        ax.set_title(title, fontsize=8.5, loc="left")
    return width, height


def draw_lesson(lesson: ModuleType, path: str, quick: bool = False) -> None:
    """The lesson's two small models, captured and grouped by the lesson's own functions: TransformerMLP (LayerNorm
    and GELU regions cut by the matmuls) and a MobileNetV2 inverted residual (BatchNorm+ReLU6 regions cut by the
    convolutions)."""
    plt = pyplot(lesson.__spec__.name if getattr(lesson, "__spec__", None) else "fusion.regions")
    models = lesson.models
    cases = (
        ("TransformerMLP: x + fc2(gelu(fc1(layer_norm(x))))", models.TransformerMLP(), models.transformer_inputs(batch=2, seq=8)),
        ("MobileNetV2 inverted residual (eval): 1×1 conv → BN → ReLU6 → 3×3 depthwise → BN → ReLU6 → 1×1 → BN, + x",
         models.mobilenet_v2_block().eval(), (torch.randn(1, 32, 8, 8),)),
    )  # fmt: skip
    graphs = []
    for title, model, inputs in cases:
        gm = lesson.capture_aten(model, inputs)
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        params = set(placeholders[: len(placeholders) - len(inputs)])  # parameters and buffers come first
        graphs.append((title, gm, lesson.build_fusion_regions(gm), params))
    sizes = [layout(*drawn_graph(gm, params)) for _, gm, _, params in graphs]
    widths = [max(x for x, _ in s.values()) + 1 for s in sizes]
    heights = [max(y for _, y in s.values()) + 2 for s in sizes]
    fig, axes = plt.subplots(len(graphs), 1, figsize=(0.62 * max(widths) + 2.2, 0.55 * sum(heights) + 0.6),
                             gridspec_kw={"height_ratios": heights})  # fmt: skip
    for ax, (title, gm, region_of, params) in zip(axes, graphs, strict=True):
        draw_regions(ax, gm, region_of, is_fusible=lesson.is_fusible_node, reason=lesson.fusible_reason,
                     hidden=params, title=title)  # fmt: skip
        ax.set_xlim(-0.6, max(widths) - 0.4)  # one scale for both
    fig.suptitle("Phase 6: fusion regions on the aten graph (one colour = one generated kernel; views not drawn)",
                 fontsize=9, x=0.01, ha="left")  # fmt: skip
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
