"""The partition stage: an aten graph + its regions' kernels -> one callable graph (one launch per kernel).

* :class:`Worklist` — the cut-and-retry loop, driven by Phase 8's ``compile_graph``::

      work = Worklist(gm, regions)
      for region in work:
          try:
              work.done(generate_kernel(region))
          except Exception as e:
              work.refuse(region, e)
      compiled = work.compiled()

  A region the generator refuses (:class:`~fusion.ir.plan.Unsupported`) at one of its nodes is cut there: that
  node runs as an aten call and the pieces around it come back into the loop. Any other exception is a generator
  bug: raised in tests and practice workspaces (``fusion.common.fallback_reason``), a fallback reason otherwise.
* :func:`build_compiled_graph` — the original graph with every kernel's region replaced by one call of its
  :class:`~fusion.kernels.triton_runtime.Launcher` (the :class:`~fusion.kernels.triton_runtime.RegionKernel` stays a
  submodule, to inspect); everything else (matmul, conv, fallbacks) stays aten, rewritten by the wrapper passes that
  are on (:data:`fusion.compiler.wrapper_passes.WRAPPER_PASSES`: ``prims`` ops as aten ops, library outputs held at
  their traced strides, views as strides, library calls through torch's Python bindings). The GraphModule's
  generated ``forward`` is the wrapper a call runs: straight-line Python, one line per launch or library call,
  intermediates freed after their last use (what Inductor's ``call(args)`` is, written by fx's code generator
  instead of ours).
* :class:`~fusion.compiler.compiled.CompiledGraph` / :class:`~fusion.compiler.compiled.CompiledModel` — what
  Phase 8 and Phase 9 run (re-exported here).
"""

from __future__ import annotations

import heapq
import operator
from collections import Counter
from collections.abc import Iterator, Sequence

import torch
import torch.fx as fx

from fusion.aten.nodes import reduced_dims
from fusion.common import FusionReport, fallback_reason
from fusion.compiler.compiled import CompiledGraph, CompiledModel
from fusion.compiler.graph_passes import writes_state
from fusion.compiler.launch_plans import launch_plan
from fusion.compiler.lone_kernels import is_lone_kernel_piece
from fusion.compiler.lower_reductions import REDUCTIONS
from fusion.compiler.pass_base import run_stage
from fusion.compiler.wrapper_passes import WRAPPER_PASSES, map_prims
from fusion.fxutils.finish import relint
from fusion.fxutils.pieces import connected_pieces
from fusion.fxutils.rebuild import Group, rebuild
from fusion.ir.plan import KernelPlan, Region, SplitRegion, Unsupported
from fusion.kernels import c_runtime
from fusion.kernels import triton_runtime as rt
from fusion.kernels.precompile import precompile, precompile_c

prims_to_aten = map_prims  # the backend's name for it: wrapper_passes.map_prims (prims and max pools as aten ops)

__all__ = [  # CompiledGraph, CompiledModel and prims_to_aten live elsewhere: re-exported for their importers
    "CompiledGraph",
    "CompiledModel",
    "Worklist",
    "build_compiled_graph",
    "ensure_meta",
    "place_after_producers",
    "prims_to_aten",
    "split_by_outputs",
    "split_region",
]


def ensure_meta(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor], what: str = "compile_graph") -> None:
    """Check ``gm`` is a GraphModule and give every node ``meta["val"]`` (FakeTensorProp) if one lacks it."""
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"{what} needs a torch.fx.GraphModule (e.g. from capture_aten), got {type(gm).__name__}")
    if any("val" not in n.meta for n in gm.graph.nodes if n.op in ("placeholder", "call_function")):
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        FakeTensorProp(gm).propagate(*example_inputs)  # shapes, strides and dtypes for every node


class Worklist:
    """The regions still to generate; iterate it, and answer each region with :meth:`done` or :meth:`refuse`."""

    def __init__(self, gm: fx.GraphModule, regions: Sequence[Region]) -> None:
        self.gm = gm
        self.regions = len(regions)
        self.work = list(regions)
        self.plans: list[KernelPlan] = []
        self.report = FusionReport("compile_graph")
        self.runs, self.why = rt.triton_status()
        # CPU kernels run from C where the C renderer is chosen and a compiler is found, with or without Triton
        self.c_chosen = c_runtime.chosen() == "c"
        self.c_cpu = self.c_chosen and c_runtime.available()[0]
        self.triton, self.runs = self.runs, self.runs or self.c_cpu

    def __iter__(self) -> Iterator[Region]:
        while self.work:
            yield self.work.pop(0)

    def done(self, plan: KernelPlan) -> None:
        """The region's kernel was generated (it runs only where Triton does: else the region is refused)."""
        if not self.runs:
            self.refuse(plan.kernel.region, Unsupported(self.why))
            return
        if self.c_cpu and (why := c_runtime.refusal(plan, self.triton)) is not None:  # C does not take it: aten
            self.refuse(plan.kernel.region, why)
            return
        try:  # what the runtime holds: the launch as data (fusion.compiler.launch_plans)
            plan.launch = launch_plan(plan)
        except Unsupported as e:
            self.refuse(plan.kernel.region, e)
            return
        self.plans.append(plan)
        members = [n.name for n in plan.kernel.region.nodes]
        self.report.fuse("region", members, replacement=plan.kernel.name, reason=f"{plan.kernel.kind} kernel")

    def refuse(self, region: Region, exc: BaseException) -> None:
        """The generator raised: cut the region at the node it refused, or run the region as aten ops."""
        reason = fallback_reason(exc, "generating a kernel", expected=(Unsupported,))
        if isinstance(exc, Unsupported):
            reason = str(exc)
        else:
            reason = f"internal error: {reason}"
        if self.runs and isinstance(exc, SplitRegion):  # two kernels, nothing to aten: no decision to report
            pieces = split_by_outputs(region, exc.first) or split_region(region, exc.before, keep=True)
            if all(len(p.nodes) < len(region.nodes) for p in pieces):  # each piece smaller: the loop ends
                self.work[:0] = pieces
                return
            reason = f"{reason} (cut at {exc.before.name}, it came back whole)"  # merged siblings: aten, not a loop
        bad = getattr(exc, "node", None)
        if self.runs and isinstance(exc, Unsupported) and bad in region.members:  # cut there, generate the rest
            self.report.skip("op", [bad.name], f"runs as an aten call: {reason}")
            self.work[:0] = split_region(region, bad)
            return
        self.report.skip("region", [n.name for n in region.nodes], f"runs as aten ops: {reason}")

    def compiled(self) -> CompiledGraph:
        new = build_compiled_graph(self.gm, self.plans)
        compiled = CompiledGraph(new, [p.kernel for p in self.plans], self.report, self.regions)
        owners = [lch.owner for lch in compiled.launchers]
        compiled.precompiled = precompile(owners)  # CUDA: all kernels at once, in a worker pool
        compiled.c_precompiled = precompile_c(owners)  # CPU from C: the missing kernels at once, a compiler per core
        return compiled


def split_by_outputs(region: Region, first: Sequence[fx.Node]) -> list[Region]:
    """The region as two sides: what the outputs ``first`` need (their ancestors in the region), and the rest, which
    may read the first side (its call then sits after the first's: :func:`place_after_producers`); a multi-output
    op's getitems stay on its side. Each side's connected pieces with two or more non-view nodes come back as
    regions; [] where one side would be the whole."""
    need, stack = set(), list(first)
    while stack:
        n = stack.pop()
        if n not in need:
            need.add(n)
            stack += [i for i in n.all_input_nodes if i in region.members]
            stack += [u for u in n.users if u.target is operator.getitem and u in region.members]  # var_mean's both
    sides = ([n for n in region.nodes if n in need], [n for n in region.nodes if n not in need])
    if not all(sides):
        return []
    return _kernel_pieces(region, sides)


def split_region(region: Region, bad: fx.Node, keep: bool = False) -> list[Region]:
    """The region without ``bad`` (with it, first of the second side, if ``keep``), cut there the way Phase 6 cuts a
    span at a non-fusible node: the members before ``bad`` and those after it are grouped separately (so every
    piece's inputs come before it), each into its connected pieces; pieces with at least two non-view nodes come back
    as regions, to be generated in turn."""
    cut = region.nodes.index(bad)
    return _kernel_pieces(region, (region.nodes[:cut], region.nodes[cut + (0 if keep else 1) :]))


def _kernel_pieces(region: Region, spans: Sequence[list[fx.Node]]) -> list[Region]:
    """The connected pieces of each span, siblings merged (:func:`merge_siblings`), with at least two non-view
    nodes (or one op a pass marked for a kernel of its own, with its views: ``lone_kernels``), as regions of
    ``region``'s kind."""
    pieces = [region.piece(nodes) for span in spans for nodes in merge_siblings(span, connected_pieces(span))]
    return [p for p in pieces if p.non_view_count >= 2 or is_lone_kernel_piece(p.nodes)]


def merge_siblings(span: list[fx.Node], pieces: list[list[fx.Node]]) -> list[list[fx.Node]]:
    """Pieces of one span whose reductions all walk the same rows (input shape and reduced dims) as one piece: a
    split LayerNorm gradient's two stage-2 sums, each alone a piece of one op (an aten call), are one kernel with
    two reductions. Safe: no path joins two pieces of a span (none inside it, being separate pieces; none through
    the rest of the region, which the cut put wholly before or after; none outside, a region being convex)."""
    by_walk: dict[tuple, list[fx.Node]] = {}
    out: list[list[fx.Node]] = []
    for nodes in pieces:
        walks = {_walk(n) for n in nodes if n.op == "call_function" and n.target in REDUCTIONS}
        if len(walks) != 1:
            out.append(nodes)
            continue
        key = walks.pop()
        if key not in by_walk:
            by_walk[key] = []
            out.append(by_walk[key])
        by_walk[key].extend(nodes)
    order = {n: i for i, n in enumerate(span)}
    return [sorted(nodes, key=order.__getitem__) for nodes in out]


def _walk(n: fx.Node) -> tuple:
    shape, dims = reduced_dims(n)
    return shape, tuple(dims)


def hoist_constant_inputs(gm: fx.GraphModule, groups: Sequence[Group]) -> None:
    """Move each op that reads nothing (``iota``, ``full``: Phase 6 lets such a constant sit inside a span, as it
    cannot close a cycle) and that a group reads to just before the group's first member. Left where it was, the
    group's call would wait for it (:func:`place_after_producers`), after an outside op that reads a member
    computed before the constant (a fuzzer's find: ``abs``, a strided slice of it, then a ``where`` over an ``iota``)."""
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    members = {n for g in groups for n in g.nodes}
    for g in groups:
        first = g.nodes[0]
        for n in g.inputs:
            if n.op != "call_function" or n.all_input_nodes or n.is_impure() or n in members:
                continue
            if position[n] > position[first]:
                first.prepend(n)
                position = {n: i for i, n in enumerate(gm.graph.nodes)}


def order_by_dependencies(gm: fx.GraphModule, groups: Sequence[Group]) -> bool:
    """Put ``gm``'s nodes in an order where each group's members are contiguous and follow everything the group reads,
    and every outside node follows what it reads: a topological sort of the graph with each group as one unit, ties
    broken by the original position (so a graph the groups fit already keeps its order). Needed where a group reads
    another group's output and an outside op reads one of its members in between (fuzzer's finds: a backward whose
    ``sum(mul)`` sat between ``mul``'s group and the group it waits for), or where every member precedes that
    producer. Returns False, leaving the graph alone, where an op writes state or is impure (order then carries
    meaning the data flow does not show) or the groups form a cycle."""
    nodes = list(gm.graph.nodes)
    if any(n.op not in ("placeholder", "output", "get_attr") and writes_state(n) for n in nodes):
        return False
    position = {n: i for i, n in enumerate(nodes)}
    group_of = {n: g for g in groups for n in g.nodes}
    unit_of = {n: group_of.get(n, n) for n in nodes}
    first = {u: position[u.nodes[0]] if isinstance(u, Group) else position[u] for u in unit_of.values()}
    units = {first[u]: u for u in unit_of.values()}
    deps: dict[int, set[int]] = {k: set() for k in units}
    for n in nodes:
        k = first[unit_of[n]]
        deps[k] |= {first[unit_of[i]] for i in n.all_input_nodes} - {k}
    users: dict[int, list[int]] = {k: [] for k in units}
    for k, ds in deps.items():
        for d in ds:
            users[d].append(k)
    waiting = {k: len(ds) for k, ds in deps.items()}
    ready = [k for k, w in waiting.items() if w == 0]
    heapq.heapify(ready)
    order: list[fx.Node] = []
    while ready:
        k = heapq.heappop(ready)
        unit = units[k]
        order.extend(unit.nodes if isinstance(unit, Group) else [unit])
        for u in users[k]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):  # a cycle through groups: the caller's check names it
        return False
    if order != nodes:  # each group contiguous now: its call sits at its first member (Group.at stays None)
        for prev, node in zip(order, order[1:], strict=False):
            prev.append(node)
    return True


def place_after_producers(gm: fx.GraphModule, groups: Sequence[Group]) -> None:
    """Set ``group.at`` where a group reads another group's output (the two sides of a :class:`SplitRegion`, their
    members interleaved in the graph): its call sits at its first member after the producer's call. Every other
    group keeps its first member."""
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    group_of = {n: g for g in groups for n in g.nodes}

    def call_position(g: Group) -> int:
        if g.at is None:
            g.at = g.nodes[0]
            # a kernel it reads (its call), or an aten node (an op cut out of the other side of a SplitRegion)
            producers = [
                call_position(group_of[n]) if n in group_of else position[n]
                for n in g.inputs
                if group_of.get(n) is not g and n in position
            ]
            if producers and position[g.at] < max(producers):
                g.at = next(n for n in g.nodes if position[n] > max(producers))
        return position[g.at]

    for g in groups:
        call_position(g)


def build_compiled_graph(gm: fx.GraphModule, plans: Sequence[KernelPlan]) -> fx.GraphModule:
    """A copy of ``gm`` where each plan's region is one call of its kernel's launcher + getitems (the
    :class:`~fusion.kernels.triton_runtime.RegionKernel` kept as a submodule named after the kernel, and after its call
    where regions of the same code share one kernel).

    The call sits where the region's first member was (:func:`~fusion.fxutils.rebuild.rebuild`): every external input
    of a region comes before its span, every outside user after it (Phase 6's regions never reach across a
    non-fusible node).
    """
    calls, seen = Counter(p.kernel.name for p in plans), Counter()  # regions of one code share a kernel's name:
    names = []  # each call's submodule is then the kernel's name + _call<k>
    for p in plans:
        seen[p.kernel.name] += 1
        names.append(p.kernel.name if calls[p.kernel.name] == 1 else f"{p.kernel.name}_call{seen[p.kernel.name]}")
    kernels = {name: rt.RegionKernel(p.launch or launch_plan(p)) for name, p in zip(names, plans, strict=True)}
    groups = [Group(name, p.kernel.region.nodes, p.inputs, p.outputs) for name, p in zip(names, plans, strict=True)]
    hoist_constant_inputs(gm, groups)
    if not order_by_dependencies(gm, groups):
        place_after_producers(gm, groups)

    def launch(graph: fx.Graph, group: Group, args: tuple[fx.Node, ...]) -> fx.Node:
        call = graph.call_function(kernels[group.name].launch, args)
        call.meta["kernel"] = group.name
        return call

    new = rebuild(gm, groups, launch, kernels, class_name="CompiledGraph")
    new.meta["prims_to_aten"] = []  # the wrapper passes that are on keep here what they changed
    run_stage(WRAPPER_PASSES, new)  # by the options of the compile in progress (pass_base.current())
    relint(new)
    return new
