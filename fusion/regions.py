"""Phase 6 — fusion regions: group fusible aten ops into bandwidth-costed regions, the way Inductor does.

Run it:   uv run python -m fusion.regions          (``--quick`` for the small version CI runs)
Draw it:  uv run --extra plot python -m fusion.regions --plot regions.png   (two graphs, coloured by region)
Test it:  uv run pytest -m phase6
Bench it: uv run python scripts/bench_regions.py  (ours vs Inductor's region builder on a ~100k-node graph)

What you learn
--------------
* A compiler does not fuse *modules*, it fuses *aten ops*. ``capture_aten`` (machinery: ``fusion/aten/``) traces a
  model below autograd into aten ops on fake tensors (shapes, dtypes and strides, no memory), parameters included,
  and — as Inductor does before lowering — decomposes composites: ``native_layer_norm`` becomes ``var_mean, add,
  rsqrt, sub, mul, …``, ``gelu`` becomes ``mul, erf, add, mul``. Only then can a LayerNorm share a kernel.
* Which ops can share a kernel (:func:`is_fusible_node`): elementwise (``torch.Tag.pointwise``), reductions
  (``torch.Tag.reduction``), views (free: they only change metadata), indexing, pooling and a short ``cat``. Pooling
  and concatenation look like exceptions but are not: for a code generator each output element of a pooling window
  is a few loads at shifted indices combined pointwise, and each element of a ``cat`` is one load from the input its
  index falls in. Matmuls and convolutions are compute-bound library calls; they end a region.
* A *fusion region* (:func:`build_fusion_regions`): walk the nodes in order, cut them into contiguous *spans* of
  fusible nodes, and inside a span join every producer with its consumers (union-find). Each connected piece with at
  least two real (non-view) ops is one kernel. Because a region never reaches past a non-fusible node, collapsing it
  to one node can never create a cycle — no reordering across a matmul, nothing to prove.
* What a region is worth (:class:`FusionRegion`): a fused kernel reads its external inputs once and writes its
  external outputs once; everything in between stays in registers. Unfused, every op reads and writes DRAM.
  Memory-bound kernels cost ``bytes / bandwidth`` — the model Inductor uses to decide what to overlap.

The idea in one picture (TransformerMLP, decomposed)::

    x ─[var_mean·rsqrt·sub·mul·mul·add]─ addmm ─[mul·mul·erf·add·mul]─ addmm ─[add]─ out
         region 0: LayerNorm, 1 kernel           region 1: GELU, 1 kernel        (1 op: no region)
"""

from __future__ import annotations

import operator
from collections import Counter
from functools import cached_property

import torch
import torch.fx as fx

from fusion import models
from fusion.aten import inductor
from fusion.aten.bandwidth import BANDWIDTH_PROFILES_GBPS, bandwidth_gbps, measure_bandwidth_gbps
from fusion.aten.capture import aten_inputs, capture_aten
from fusion.aten.collapse import REGION_PREFIX, collapse_regions, expand_regions
from fusion.aten.inductor import inductor_fusion_regions
from fusion.aten.lesson import histogram_table, show_bandwidth, show_known_differences, show_regions
from fusion.aten.nodes import (
    DEPTHWISE_CONV,  # Phase 9's depthwise convolution as a window sum: a pooling op
    MissingMetaError,
    is_view_node,
    kernel_counts,
    short_target,
    unique_regions,
)
from fusion.aten.report import region_table
from fusion.common import heading, lesson_cli, table
from fusion.compiler import registry
from fusion.ir.plan import Region

__all__ = [  # the lesson's API, and what it re-exports from its machinery in fusion/aten/
    "BANDWIDTH_PROFILES_GBPS", "REGION_PREFIX", "MissingMetaError", "aten_inputs", "bandwidth_gbps", "capture_aten",
    "collapse_regions", "expand_regions", "inductor_fusion_regions", "is_view_node", "kernel_counts",
    "measure_bandwidth_gbps", "region_table", "unique_regions", "Region", "FusionRegion", "build_fusion_regions",
    "compare_with_inductor", "fusible_reason", "fusible_spans", "is_fusible_node", "node_bytes", "value_bytes",
]  # fmt: skip

aten = torch.ops.aten

# The named families of fusible ops that carry no pointwise/reduction tag, by ``op._schema.name``.
# Indexing: a load at a computed index (slice and select are views as well; listing them keeps the rule readable).
INDEXING_OPS = frozenset({"aten::slice", "aten::select", "aten::gather", "aten::index_select", "aten::embedding",
                          "aten::index"})  # fmt: skip
# Pooling: every output element combines a small window of its input (max, or sum / count) — a few loads at shifted
# indices, combined pointwise, with no reduction loop of its own. Inductor decomposes max-pool into the prims below
# (it registers them; older torch spells them ..._max_pool2d_...). A depthwise convolution is one too, a window sum
# with weights: Phase 9's pass ``depthwise`` names the ones the generator takes DEPTHWISE_CONV.
POOLING_OPS = frozenset(
    {"aten::avg_pool2d", "aten::avg_pool3d", "aten::_adaptive_avg_pool2d", "aten::adaptive_max_pool2d", DEPTHWISE_CONV}
    | {"aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices"}
    | {f"prims::_low_memory_max_pool{d}_{s}" for d in ("", "2d") for s in ("with_offsets", "offsets_to_indices")}
)
# In-place views: they mutate only sizes/strides (capture_aten meets as_strided_ in decomposed means), never data.
INPLACE_VIEW_OPS = frozenset(
    {"aten::as_strided_", "aten::t_", "aten::transpose_", "aten::squeeze_", "aten::unsqueeze_", "aten::detach_"}
)
# cat: each output element is one load from the input its index falls in — one select per input. Past a few inputs
# the selects cost more than separate copies: Inductor's torch._inductor.config.max_pointwise_cat_inputs (default 8).
MAX_POINTWISE_CAT_INPUTS = 8
# Collectives and their waits are scheduled on their own, never fused (torch.distributed's functional ops).
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional", "_dtensor"})


# ----------------------------------------------------------------------------------------------------------------------
# 1. Which nodes can share a kernel


def is_fusible_node(node: fx.Node) -> bool:
    """Can this node live inside a fused kernel?

    Fusible: pointwise ops (``torch.Tag.pointwise``), reductions (``torch.Tag.reduction``), views and in-place views
    (``INPLACE_VIEW_OPS``), indexing (``INDEXING_OPS``), pooling (``POOLING_OPS``), ``aten.cat`` of at most
    ``MAX_POINTWISE_CAT_INPUTS`` tensors, and ``operator.getitem`` taking one result out of a fusible multi-output op
    (``var_mean`` → mean, var). Not fusible: placeholders, get_attr, the output, matmul/conv and other compute-heavy
    library calls, collectives and waits, ops that mutate data (``copy_``, ``add_``), and anything else.

    >>> gm = capture_aten(models.MatmulAddReLU(), models.matmul_inputs())
    >>> [(n.name, is_fusible_node(n)) for n in gm.graph.nodes if n.op == "call_function"]
    [('mm', False), ('add', True), ('relu', True)]
    """
    # TODO(human): decide whether one node can live in a fused kernel: pointwise or reduction ops, views, in-place views, indexing, pooling, a cat of few inputs, a getitem of a fusible op; never a collective or an op that mutates data. Hint: node.target is a torch._ops.OpOverload (or operator.getitem); the tables above name each family by op._schema.name. More: read target.tags, .is_view, .namespace, ._schema.name and ._schema.is_mutable; an in-place view is mutable yet fusible, so test it first; cat's tensors are the list node.args[0]; a getitem takes the verdict of its producer node.args[0]
    # BEGIN SOLUTION
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:  # one output of a multi-output op: fusible exactly when its producer is
        source = node.args[0]
        return isinstance(source, fx.Node) and is_fusible_node(source)
    if not isinstance(target, torch._ops.OpOverload) or target.namespace in COLLECTIVE_NAMESPACES:
        return False
    name = target._schema.name  # "aten::add", "prims::_low_memory_max_pool_with_offsets"
    if name in INPLACE_VIEW_OPS:
        return True  # restrides its tensor: metadata only
    if target._schema.is_mutable:
        return False
    if name == "aten::cat":
        return len(node.args[0]) <= MAX_POINTWISE_CAT_INPUTS
    if target.is_view or name in INDEXING_OPS or name in POOLING_OPS:
        return True
    tags = target.tags
    return torch.Tag.pointwise in tags or torch.Tag.reduction in tags
    # END SOLUTION


def fusible_reason(node: fx.Node) -> str:
    """Which part of the rule decides ``node`` (for the lesson's tables and the comparison with Inductor)."""
    target = node.target
    if node.op != "call_function":
        return node.op
    if target is operator.getitem:
        return "getitem of a fusible op" if is_fusible_node(node) else "getitem of a non-fusible op"
    if not isinstance(target, torch._ops.OpOverload):
        return "not an aten op"
    name, tags = target._schema.name, target.tags
    if name == "aten::cat" and not target._schema.is_mutable:
        return f"cat of {len(node.args[0])} tensors (fusible up to {MAX_POINTWISE_CAT_INPUTS})"
    checks = {
        "a collective": target.namespace in COLLECTIVE_NAMESPACES,
        "an in-place view": name in INPLACE_VIEW_OPS,
        "mutates its input": target._schema.is_mutable,
        "a view": target.is_view,
        "indexing": name in INDEXING_OPS,
        "pooling": name in POOLING_OPS,
        "tagged pointwise": torch.Tag.pointwise in tags,
        "tagged reduction": torch.Tag.reduction in tags,
    }
    return next((because for because, applies in checks.items() if applies), "neither pointwise nor reduction")


# ----------------------------------------------------------------------------------------------------------------------
# 2. Bytes: what a kernel reads and writes


def value_bytes(val: object) -> int:
    """Bytes of memory a value occupies: what a kernel must read (or write) to use it.

    A tensor counts the storage its strides actually span, so an expanded (broadcast) tensor counts its real
    storage, not its logical size: ``torch.ones(4).expand(1000, 4)`` is 16 bytes, not 16000. A tuple counts its
    tensors; Python scalars, SymInts and None count 0 (they travel as kernel arguments, not through memory).

    >>> value_bytes(torch.ones(4).expand(1000, 4)), value_bytes(torch.ones(2, 3)), value_bytes(2.0)
    (16, 24, 0)
    """
    # TODO(human): return the bytes a value occupies in memory: a tensor by the storage its strides span, a tuple or list by its parts, anything else 0. Hint: a tensor's shape, stride() and element_size(); a broadcast dim has stride 0. More: the last element sits at offset sum((size-1)*stride) elements from the first, so the span is that + 1 elements times element_size(); numel() == 0 is 0 bytes; recurse into tuples and lists
    # BEGIN SOLUTION
    if isinstance(val, torch.Tensor):
        if val.numel() == 0:
            return 0
        span = 1  # elements from the first to the last one the strides reach
        for size, stride in zip(val.shape, val.stride(), strict=True):
            span += (size - 1) * stride
        return int(span) * val.element_size()
    if isinstance(val, (tuple, list)):
        return sum(value_bytes(v) for v in val)
    return 0
    # END SOLUTION


def node_bytes(node: fx.Node) -> int:
    """:func:`value_bytes` of a node's value (``meta["val"]``, or ShapeProp's ``meta["tensor_meta"]``)."""
    meta = node.meta
    if "val" in meta:
        return value_bytes(meta["val"])
    tm = meta.get("tensor_meta")
    if tm is not None and hasattr(tm, "shape"):
        if not all(tm.shape):
            return 0
        last = sum((size - 1) * stride for size, stride in zip(tm.shape, tm.stride, strict=True))
        return (last + 1) * torch.empty((), dtype=tm.dtype).element_size()
    raise MissingMetaError(
        f"node {node.name!r} ({node.op} {node.target}) has no meta['val'], so its bytes cannot be counted. "
        "Fix: build the graph with fusion.regions.capture_aten(model, inputs), or run "
        "torch.fx.passes.fake_tensor_prop.FakeTensorProp(gm).propagate(*inputs) first"
    )


# ----------------------------------------------------------------------------------------------------------------------
# 3. Regions


class FusionRegion(Region):
    """A :class:`~fusion.ir.plan.Region` (nodes in graph order, members, external inputs and outputs: the
    compiler's type, in machinery) with what this phase adds: its DRAM traffic, fused and unfused."""

    def bytes_of(self, node: fx.Node) -> int:
        """:func:`node_bytes`, remembered in ``byte_cache``."""
        size = self.byte_cache.get(node)
        if size is None:
            size = self.byte_cache[node] = node_bytes(node)
        return size

    @cached_property
    def total_bytes(self) -> int:
        """DRAM traffic of the fused kernel: external inputs (each once, at real storage size) + external outputs.

        An external output that is a view writes the value it aliases (once), or nothing when it aliases an input.
        An input read only through a slice is charged the storage it spans, not just the slice: an upper bound.
        """
        # TODO(human): count the fused kernel's bytes: each external input once, plus each external output it must write. Hint: self.external_inputs, self.external_outputs and self.bytes_of(n); a view writes no data of its own. More: for an escaping aten view (is_view_node(n) and not a getitem) follow n.args[0] while it stays a member; count the member it reaches once (keep a set), or nothing if the chain leaves the region (it aliases an input)
        # BEGIN SOLUTION
        bytes_of = self.bytes_of
        members = self.members
        fused = 0
        for node in self.external_inputs:  # already deduplicated: a tensor read by several members counts once
            fused += bytes_of(node)
        written: set[fx.Node] = set()
        for node in self.external_outputs:
            # An escaping aten view is metadata over another value: the kernel writes that value (once), or
            # nothing at all when the view aliases an external input. (getitem is a real output of its op.)
            while node in members and node.target is not operator.getitem and is_view_node(node):
                node = node.args[0]
            if node in members and node not in written:
                written.add(node)
                fused += bytes_of(node)
        return fused
        # END SOLUTION

    @cached_property
    def unfused_bytes(self) -> int:
        """DRAM traffic if every member ran as its own kernel: each op reads its inputs and writes its output."""
        # TODO(human): count the bytes if every non-view member ran as its own kernel: it reads each of its inputs once and writes its output. Hint: self.nodes, is_view_node(n) marks the free ops, self.bytes_of(n) gives one value. More: n.all_input_nodes lists each input once (x * x reads x once), which is what an unfused kernel reads; a view is free: it neither reads nor writes
        # BEGIN SOLUTION
        bytes_of = self.bytes_of
        unfused = 0
        for node in self.nodes:
            if is_view_node(node):
                continue  # a view as its own "kernel" moves nothing
            for inp in node.all_input_nodes:  # deduplicated already: x * x reads x once
                unfused += bytes_of(inp)
            unfused += bytes_of(node)
        return unfused
        # END SOLUTION

    def cost_ms(self, bandwidth_gbps: float) -> float:
        """Predicted time of the fused kernel if it is memory-bound: total_bytes / bandwidth, in milliseconds."""
        return self.total_bytes / (bandwidth_gbps * 1e9) * 1e3

    def unfused_cost_ms(self, bandwidth_gbps: float) -> float:
        return self.unfused_bytes / (bandwidth_gbps * 1e9) * 1e3


def fusible_spans(gm: fx.GraphModule | fx.Graph) -> list[list[fx.Node]]:
    """The graph's nodes in order, cut at every non-fusible node that reads a value (a constant such as
    ``scalar_tensor`` does not cut): the maximal runs of consecutive fusible nodes."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    spans: list[list[fx.Node]] = []
    current: list[fx.Node] = []
    verdict: dict[object, bool] = {}  # an op's verdict depends only on the op (cat: on its inputs): ask once
    for node in graph.nodes:
        target = node.target
        if (
            node.op == "call_function"
            and isinstance(target, torch._ops.OpOverload)
            and target.overloadpacket != aten.cat
        ):
            fusible = verdict.get(target)
            if fusible is None:
                fusible = verdict[target] = is_fusible_node(node)
        else:
            fusible = is_fusible_node(node)
        if fusible:
            current.append(node)
        elif node.op == "call_function" and not node.all_input_nodes:
            continue  # a constant (scalar_tensor, full): nothing of a span feeds it, so it cannot close a cycle
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    return spans


def build_fusion_regions(gm: fx.GraphModule | fx.Graph) -> dict[fx.Node, FusionRegion]:
    """Group the graph's fusible nodes into regions; map every member node to its (shared) region.

    Inside each span of consecutive fusible nodes, a producer and its consumer belong together; the connected
    pieces with at least two non-view nodes become regions. Near-linear time: one pass over nodes and edges,
    union-find with union by size and path halving, members collected in graph order (so no sorting).

    >>> gm = capture_aten(models.ElementwiseChain(), models.elementwise_inputs())
    >>> regions = unique_regions(build_fusion_regions(gm))
    >>> [r.summary() for r in regions]
    ['mul→add→relu→mul_1→add_1 (5 nodes)']
    """
    region_of: dict[fx.Node, FusionRegion] = {}
    byte_cache: dict[fx.Node, int] = {}  # shared by the regions: each node's bytes are measured once

    # TODO(human): in each span, join every node with its inputs from the same span (union-find), then make one FusionRegion per connected piece with at least 2 non-view nodes and map each member to it. Hint: fusible_spans(gm) gives the spans; a union-find over positions in one span joins producers and consumers. More: a union-find over positions in the span: a parent per position, find with path halving, union by size (the docstring's near-linear time); an input outside the span has no position and joins nothing; collecting members by their root while walking the span in order keeps each region topologically sorted; FusionRegion takes the nodes, an index and the shared byte_cache
    # BEGIN SOLUTION
    def find(parent: list[int], i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving
            i = parent[i]
        return i

    count = 0
    for span in fusible_spans(gm):
        if len(span) < 2:
            continue
        index = {node: i for i, node in enumerate(span)}
        parent = list(range(len(span)))
        size = [1] * len(span)
        for i, node in enumerate(span):
            for inp in node.all_input_nodes:
                j = index.get(inp)
                if j is None:
                    continue  # produced outside the span: an external input, not an edge to join
                a, b = find(parent, i), find(parent, j)
                if a != b:
                    if size[a] < size[b]:
                        a, b = b, a
                    parent[b] = a  # union by size
                    size[a] += size[b]

        pieces: dict[int, list[fx.Node]] = {}
        costly: Counter[int] = Counter()
        for i, node in enumerate(span):  # span order is graph order: every piece comes out topologically sorted
            root = find(parent, i)
            pieces.setdefault(root, []).append(node)
            if not is_view_node(node):
                costly[root] += 1
        for root, nodes in pieces.items():
            if costly[root] < 2:
                continue  # a lone op (plus views) gains nothing from fusion
            region = FusionRegion(nodes, index=count, byte_cache=byte_cache)
            count += 1
            for node in nodes:
                region_of[node] = region
    # END SOLUTION
    return region_of


def compare_with_inductor(gm: fx.GraphModule, region_of: dict[fx.Node, FusionRegion]) -> list[tuple] | None:
    """Rows (verdict, ours, Inductor's, why) matching our regions with Inductor's on the same graph; None without it.
    ``why`` names the nodes whose verdicts differ, and marks those kept on purpose (``fusion/aten/inductor.py``)."""
    return inductor.compare_with_inductor(gm, region_of, is_fusible_node, fusible_reason)


# ----------------------------------------------------------------------------------------------------------------------
# The lesson


def run(quick: bool = False) -> None:
    heading("Phase 6 — fusion regions on the aten graph")
    print(
        "A compiler fuses aten ops, not modules. Capture the graph on fake tensors, decompose composites, cut it at\n"
        "every non-fusible op (matmul, conv), group producer and consumer inside each span: one region = one kernel."
    )

    heading("Decomposition: what Inductor sees before lowering", "-")
    model, inputs = models.TransformerMLP(), models.transformer_inputs(batch=2, seq=8)
    plain, decomposed = capture_aten(model, inputs, decompose=False), capture_aten(model, inputs)
    print(histogram_table(plain, decomposed))
    for label, g in (("decompose=False", plain), ("decompose=True", decomposed)):
        r = unique_regions(build_fusion_regions(g))
        print(f"{label}: {len(r)} region(s)" + "".join(f"\n  {x.summary(100)}" for x in r))
    print(
        "Undecomposed, native_layer_norm and gelu are opaque single ops: neither tagged pointwise nor reduction,\n"
        "so LayerNorm cannot fuse with its neighbours. Decomposed, they are chains of pointwise ops and reductions."
    )

    size = 16 if quick else 56
    resnet, resnet_in = models.resnet18_block(), (torch.randn(1, 3, 2 * size, 2 * size),)
    heading("Fusible or not: the rule per op (TransformerMLP, ResNet-18 stem)", "-")
    seen = {short_target(n): n for g in (decomposed, capture_aten(resnet, resnet_in)) for n in g.graph.nodes}
    rows = [(op, "yes" if is_fusible_node(n) else "no", fusible_reason(n)) for op, n in seen.items()]
    print(table([row for row in rows if row[2] not in ("placeholder", "output")], ["aten op", "fusible", "because"]))

    # Importing Inductor's lowerings for the comparison takes ~10 s: --quick leaves it out.
    compare = None if quick else compare_with_inductor
    batch, seq = (2, 64) if quick else (8, 512)
    mobilenet_in = (torch.randn(1, 32, size, size),)
    for title, m, x in (
        ("TransformerMLP: x + fc2(gelu(fc1(layer_norm(x))))", model, models.transformer_inputs(batch=batch, seq=seq)),
        ("ConvBNNet (eval mode)", models.ConvBNNet().eval(), models.conv_inputs(batch=2 if quick else 8, size=size)),
        ("torchvision ResNet-18 stem + first BasicBlock", resnet, resnet_in),
        ("torchvision MobileNetV2 InvertedResidual (expand 6×)", models.mobilenet_v2_block(), mobilenet_in),
    ):
        gm, region_of = show_regions(title, m, x, "H100", build_fusion_regions, compare)
        pools = [n for n in region_of if "max_pool" in str(n.target)]
        for r in unique_regions({n: region_of[n] for n in pools}):  # the stem's BatchNorm, ReLU and max-pool
            print(f"the max-pool ends region {r.index}: …→{'→'.join(n.name for n in r.nodes[-4:])}")
    show_known_differences(compare is not None)
    show_bandwidth(quick)


def main(argv: list[str] | None = None) -> int:
    return lesson_cli(run, __doc__, argv)


registry.register(
    6, build_fusion_regions=build_fusion_regions
)  # code generation's regions (fusion/compiler/generate.py)
if __name__ == "__main__":
    raise SystemExit(main())
