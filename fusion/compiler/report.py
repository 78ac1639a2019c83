"""What the ``fusion`` backend did to each graph Dynamo handed it, as data and as printable tables.

One :class:`GraphReport` per Dynamo graph (one ``fusion_backend`` call). AOTAutograd turns that graph into one
aten graph for inference, or a forward and a backward graph for training: each is one :class:`PartReport`. The
backward part is filled in when autograd first needs it (AOTAutograd compiles the backward lazily).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from fusion.aten.nodes import DEPTHWISE_CONV, is_view_node
from fusion.common import shorten, table


def op_name(node: fx.Node) -> str:
    """``convolution``, ``addmm``, ``cudnn_conv_bias_relu``: the short name of what a node calls."""
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return t.overloadpacket.__name__
    return getattr(t, "__name__", str(t))


def is_window_sum(node: fx.Node) -> bool:
    """A depthwise convolution pass ``depthwise`` renamed ``fusion::depthwise_conv2d`` (a window sum for a kernel)."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.name == DEPTHWISE_CONV


def library_name(node: fx.Node) -> str:
    """The library call a node outside every generated kernel runs: its op's name, except a window sum the generator
    left out, which runs as ``torch.convolution`` (``fusion.compiler.bindings``; its op's Python implementation
    calls the same): ``convolution``."""
    return "convolution" if is_window_sum(node) else op_name(node)


# Pass ``depthwise``'s note on a convolution it renamed: a claim that a generated kernel computes the window
WINDOW_SUM = ("depthwise conv", "window sum")
AN_ATEN_CALL = "runs as an aten call: "  # how the code generator's report begins the reason for a node it cut out


@dataclass
class PartReport:
    """One aten graph the backend compiled: ``inference``, ``forward`` or ``backward``."""

    kind: str
    aten_ops: int = 0  # non-view call_function nodes of the graph given to the code generator
    regions: int = 0
    kernels: list = field(default_factory=list)  # GeneratedKernel objects (name, source, region)
    library_calls: Counter = field(default_factory=Counter)  # op -> count: ops left to aten (matmul, conv, ...)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)  # (what, why): ran as aten instead
    passes: list[tuple[str, str, str, str]] = field(default_factory=list)  # (pass, nodes, action, note)
    compiled: bool = True  # False: the whole graph runs as its aten ops (the reason is in fallbacks)
    folded: int = 0  # convolutions reading weights folded at run time (graph inputs marked by install_folds)
    # Functions args -> list of tensors, appended to each call's args in order (a pass's new inputs: folded weights)
    extra_inputs: list[Callable] = field(default_factory=list)
    graph: object = None  # the CompiledGraph a call runs (None: not compiled); .launchers, .code

    def launchers(self) -> list:
        return list(getattr(self.graph, "launchers", ()))

    def renderers(self) -> dict[str, str]:
        """Kernel name -> what ran it ("c", "triton-interpreter" or "triton"), for kernels launched so far."""
        return {lch.__name__: lch.owner.ran for lch in self.launchers() if getattr(lch.owner, "ran", "")}

    def note_pass(self, name: str, nodes: Iterable[str], action: str, note: str = "") -> None:
        self.passes.append((name, " → ".join(nodes), action, note))

    def fallback(self, what: str, why: str) -> None:
        self.fallbacks.append((what, why))

    def note_prims(self, changed: list[str]) -> None:
        """Record the prims calls outside kernels that were mapped to aten ops (``wrapper_passes.map_prims``: passes
        ``prims_to_aten`` and ``max_pool_as_aten``)."""
        if changed:  # a prims op run eagerly is a Python reference implementation: ~10-20 µs of CPU each
            self.note_pass("prims to aten", [f"{len(changed)} prims call(s)"], "mapped", "outside kernels: aten ops")

    def count_folds(self, gm: fx.GraphModule) -> None:
        """How many folds the passes installed: the folded weights among the graph's inputs."""
        self.folded = sum(n.op == "placeholder" and n.meta.get("folded") == "weight" for n in gm.graph.nodes)

    def count_library_calls(self, gm: fx.GraphModule, kernels: Sequence) -> None:
        """Every op outside the generated kernels: a library call (or an op of a region that fell back), named by
        what runs (:func:`library_name`); a window sum left out is then reported once (:meth:`_window_left_to_aten`)."""
        covered = {n.name for k in kernels for n in getattr(getattr(k, "region", None), "nodes", ())}
        ops = [n for n in gm.graph.nodes if n.op == "call_function" and not is_view_node(n)]
        self.aten_ops = len(ops)
        self.library_calls = Counter(library_name(n) for n in ops if n.name not in covered)
        for n in ops:
            if is_window_sum(n) and n.name not in covered:
                self._window_left_to_aten(n.name)

    def _window_left_to_aten(self, name: str) -> None:
        """One row, saying what ran, for a window sum no generated kernel computes (the generator refused it, or the
        graph was not compiled): pass ``depthwise``'s "window sum" note becomes "torch.convolution" with the generator's
        reason, which leaves the fallbacks (it was there as ``op: <name>``); a refused region keeps its row."""
        at = next((i for i, p in enumerate(self.passes) if (p[0], p[2]) == WINDOW_SUM and p[1] == name), None)
        if at is None:  # no pass note to correct: the generator's fallback row is the node's one row
            return
        why = next((w for what, w in self.fallbacks if what == f"op: {name}"), None)
        if why is not None:
            self.fallbacks.remove((f"op: {name}", why))
            why = f"the generator refused the window: {why.removeprefix(AN_ATEN_CALL)}"
        elif not self.compiled:
            why = "the graph runs as its aten ops (see 'the whole graph')"
        else:
            why = "its region runs as aten ops (see 'ran as aten')"
        self.passes[at] = (self.passes[at][0], name, "torch.convolution", why)

    def kernel_launches(self) -> int:
        """Kernels one call launches: one per generated kernel plus one per library call."""
        return len(self.kernels) + sum(self.library_calls.values())


@dataclass
class GraphReport:
    """What became of one Dynamo graph: its parts (aten graphs) and everything they run."""

    index: int  # 0, 1, ... since fusion.backend.reset()
    compile_id: str  # Dynamo's "frame/recompile", e.g. "0/0"
    dynamo_ops: int  # call_function/call_method/call_module nodes Dynamo captured
    parts: list[PartReport] = field(default_factory=list)
    error: str = ""  # set when lowering itself failed and the Dynamo graph runs as it is

    @property
    def kernels(self) -> list:
        return [k for p in self.parts for k in p.kernels]

    @property
    def fallbacks(self) -> list[tuple[str, str]]:
        return [f for p in self.parts for f in p.fallbacks]

    def part(self, kind: str) -> PartReport | None:
        return next((p for p in self.parts if p.kind == kind), None)

    def table(self) -> str:
        head = f"graph {self.index} (Dynamo compile id {self.compile_id}): {self.dynamo_ops} ops captured"
        if self.error:
            return f"{head}\n  not lowered, runs as Dynamo captured it: {self.error}"
        rows = []
        for p in self.parts:
            libs = ", ".join(f"{op}×{c}" if c > 1 else op for op, c in sorted(p.library_calls.items())) or "-"
            ran = p.renderers()
            kernels = ", ".join(f"{k.name}[{ran[k.name]}]" if k.name in ran else k.name for k in p.kernels) or "-"
            rows.append((p.kind, p.aten_ops, p.regions, len(p.kernels), shorten(kernels, 60), shorten(libs, 60)))
        lines = [head, table(rows, ["graph", "aten ops", "regions", "kernels", "generated", "library calls"])]
        passes = [(p.kind, *row) for p in self.parts for row in p.passes]
        if passes:
            lines.append(table(passes, ["graph", "pass", "nodes", "action", "why"]))
        falls = [(p.kind, what, why) for p in self.parts for what, why in p.fallbacks]
        if falls:
            lines.append(table(falls, ["graph", "ran as aten", "why"]))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def graph_break_reasons() -> Counter:
    """Dynamo's graph-break counter (reason -> count) since the last ``torch._dynamo.utils.counters.clear()``."""
    from torch._dynamo.utils import counters

    return Counter(dict(counters["graph_break"]))


def summary(reports: Sequence[GraphReport]) -> str:
    """One row per compiled graph, then the graph breaks Dynamo recorded."""
    rows = []
    for r in reports:
        launches = sum(p.kernel_launches() for p in r.parts if p.kind != "backward")
        rows.append(
            (
                r.index,
                r.compile_id,
                r.dynamo_ops,
                "not lowered: see its table" if r.error else "+".join(p.kind for p in r.parts) or "-",
                sum(p.regions for p in r.parts),
                len(r.kernels),
                sum(sum(p.library_calls.values()) for p in r.parts),
                len(r.fallbacks),
                launches,
            )
        )
    headers = ["graph", "id", "Dynamo ops", "aten graphs", "regions", "kernels", "library", "fallbacks", "launches"]
    text = table(rows, headers)
    breaks = graph_break_reasons()
    if len(reports) > 1:
        text += f"\n{len(reports)} graphs: one per graph break, recompilation or separately compiled function"
    for why, count in breaks.items():
        text += f"\n  graph break ×{count}: {shorten(why, 100)}"
    return text


def fallbacks_from(codegen_report: object) -> list[tuple[str, str]]:
    """(what, why) pairs from the code generator's report: a FusionReport's skipped decisions, or a list of pairs."""
    if codegen_report is None:
        return []
    skipped = getattr(codegen_report, "skipped", None)
    if skipped is not None:
        return [(f"{d.pattern}: {' → '.join(d.nodes)}", d.reason) for d in skipped]
    items = getattr(codegen_report, "fallbacks", codegen_report)
    out = []
    for item in items if isinstance(items, (list, tuple)) else []:
        if isinstance(item, (tuple, list)) and len(item) >= 2:
            out.append((str(item[0]), str(item[-1])))
        else:
            out.append((str(getattr(item, "what", item)), str(getattr(item, "reason", ""))))
    return out
