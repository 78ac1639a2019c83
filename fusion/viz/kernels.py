"""Phase 9's picture: what one call of a compiled model runs (``python -m fusion.backend --plot backend.png``).

One lane per aten graph the backend compiled (a graph break starts another Dynamo graph: another lane), its
launches in call order, one box each, not to scale (no time is measured here): a generated Triton kernel (blue:
pointwise, orange: a reduction) with the ops it computes, a library call (grey: matmul, convolution), and what the
generator left to aten (red outline) with its reason. The lanes read the backend's reports (``fusion.backend.reports``
: ``GraphReport`` / ``PartReport``) and the compiled graph each part runs, nothing else.
"""

from __future__ import annotations

import operator
import textwrap
from types import ModuleType

import torch

from fusion.aten.nodes import is_view_node
from fusion.viz import pyplot

KIND = {"pointwise": ("#4c9be8", "pointwise kernel"), "reduction": ("#f39c4a", "reduction kernel")}
LIBRARY, LEFT = "#d9d9d9", "#c0392b"
SHORT = {
    "convolution": "conv",
    "convert_element_type": "to dtype",
    "_scaled_dot_product_flash_attention_for_cpu": "sdpa",
}
AN_ATEN_CALL = "runs as an aten call: "


def left_to_aten(part) -> dict[str, str]:
    """node name -> why the generator left it to aten: its fallbacks (``op: x``, ``region: a → b``) and a window
    sum pass ``depthwise`` noted that ran as ``torch.convolution`` (``fusion.compiler.report``)."""
    why: dict[str, str] = {}
    for what, reason in part.fallbacks:
        kind, _, names = what.partition(": ")
        for name in names.split(" → ") if kind in ("op", "region") else ():
            why[name] = reason.removeprefix(AN_ATEN_CALL)
    for _, nodes, action, note in part.passes:
        if action == "torch.convolution":
            why[nodes] = note
    return why


def op_of(line: str) -> str:
    """``mul`` for a kernel's body line ``mul_1 = aten.mul.Tensor`` (``Kernel.ops``), ``convert_element_type`` for
    ``prims.convert_element_type.default``."""
    target = line.split(" = ")[-1].split(".")
    return target[1] if len(target) > 1 else target[0]


def _op(name: str) -> str:
    return SHORT.get(name, name)


def launches(part) -> list[tuple[str, str, str]]:
    """(kind, label, detail) per launch of one call of ``part``'s compiled graph, in order: ``kernel`` (detail: its
    kind), ``library`` and ``aten`` (detail: why the generator left it); one ``aten`` row when it was not compiled."""
    graph = getattr(part.graph, "graph_module", None)
    if graph is None:
        why = next((w for what, w in part.fallbacks if what == "the whole graph"), "not compiled")
        return [("aten", "the whole graph", why)]
    why, rows = left_to_aten(part), []
    for n in graph.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem or is_view_node(n):
            continue
        owner = getattr(n.target, "owner", None)  # a generated kernel's Launcher
        if owner is not None:
            k = owner.kernel
            ops = list(dict.fromkeys(_op(op_of(line)) for line in k.ops))
            text = " ".join(ops[:5]) + (f" +{len(ops) - 5}" if len(ops) > 5 else "")
            rows.append(("kernel", text, k.kind))
            continue
        t = n.target
        name = t.overloadpacket.__name__ if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", str(t))
        if name == "as_traced":  # a stride check, not a launch (fusion.aten.nodes)
            continue
        rows.append(("aten", _op(name), why[n.name]) if n.name in why else ("library", _op(name), ""))
    return rows


def draw_lanes(ax, lanes: list[tuple[str, list[tuple[str, str, str]]]]) -> None:
    """One row of boxes per (title, launches) lane."""
    from matplotlib.patches import FancyBboxPatch, Patch

    w, h, step, gap = 1.3, 0.5, 1.5, 1.7
    for row, (title, items) in enumerate(lanes):
        y = row * gap
        ax.text(-0.75, y, title, ha="right", va="center", fontsize=7)
        for i, (kind, text, detail) in enumerate(items):
            x = i * step
            face = {"kernel": KIND.get(detail, KIND["pointwise"])[0], "aten": "white"}.get(kind, LIBRARY)
            edge = LEFT if kind == "aten" else "#333333"
            ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                        fc=face, ec=edge, lw=1.4 if kind == "aten" else 0.8, zorder=2))  # fmt: skip
            ax.text(x, y, "\n".join(textwrap.wrap(text, 17)[:2]), ha="center", va="center", fontsize=6, zorder=3)
            if kind == "aten":
                lines = textwrap.wrap(detail, 30)
                why = "\n".join(lines[:4]) + ("…" if len(lines) > 4 else "")
                ax.text(x, y + h / 2 + 0.08, why, ha="center", va="top", fontsize=5, color=LEFT, zorder=3)
            if i:
                ax.annotate("", (x - w / 2, y), (x - step + w / 2, y), arrowprops={"arrowstyle": "-|>", "lw": 0.7})
    longest = max(len(items) for _, items in lanes)
    ax.set_xlim(-0.75, (longest - 1) * step + w)
    ax.set_ylim((len(lanes) - 1) * gap + 1.1, -0.6)
    ax.axis("off")
    handles = [Patch(fc=c, ec="#333333", label=f"generated {what}") for c, what in KIND.values()]
    handles += [Patch(fc=LIBRARY, ec="#333333", label="library call (cuBLAS, cuDNN, aten)")]
    handles += [Patch(fc="white", ec=LEFT, label="left to aten by the generator, and why")]
    ax.legend(handles=handles, fontsize=6.5, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def lanes_of(title: str, reports) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """The lanes of every part of every report: ``title · graph i (kind)``."""
    out = []
    for r in reports:
        for p in r.parts:
            name = f"{title} · graph {r.index} ({p.kind})"
            out.append((name, [("aten", "Dynamo's graph", r.error)] if r.error else launches(p)))
    return out


def draw_lesson(lesson: ModuleType, path: str, quick: bool = False) -> None:
    """The lesson's small models through its own backend (``backend="fusion"``, reports in ``lesson.reports``):
    DataDependentBlock (a graph break: two graphs) and ConvBNNet (eval), in float32 on the GPU where there is one
    (its library calls are then cuBLAS's and cuDNN's), else on the CPU (the kernels in Triton's interpreter)."""
    plt = pyplot(lesson.__spec__.name if getattr(lesson, "__spec__", None) else "fusion.backend")
    models = lesson.models
    cases = (
        ("DataDependentBlock", models.DataDependentBlock(d=32).eval(), models.data_dependent_inputs(batch=4, d=32)),
        ("ConvBNNet (eval)", models.ConvBNNet(width=8).eval(), models.conv_inputs(batch=2, size=8)),
    )
    device, lanes = "cuda" if torch.cuda.is_available() else "cpu", []
    for title, model, inputs in cases:
        lesson.reset()
        with torch.no_grad():
            torch.compile(model.to(device), backend="fusion")(*(x.to(device) for x in inputs))
        lanes += lanes_of(title, lesson.reports)
    lesson.reset()
    longest = max(len(items) for _, items in lanes)
    width = 1.15 * longest + 4.6  # the boxes, the lane titles (left) and the legend (right), in inches
    fig, ax = plt.subplots(figsize=(width, 0.8 * len(lanes) + 0.6))
    fig.subplots_adjust(left=2.3 / width, right=1 - 2.3 / width)
    draw_lanes(ax, lanes)
    ax.set_title('Phase 9: what one call runs, in order (not to scale), torch.compile(model, backend="fusion")',
                 fontsize=8.5, loc="left")  # fmt: skip
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
