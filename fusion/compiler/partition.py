"""The partition stage: an aten graph + its regions' kernels -> one callable graph (one launch per kernel).

* :class:`Worklist` — the cut-and-retry loop, driven by Phase 8's ``compile_graph``::

      work = Worklist(gm, regions)
      for region in work:
          try:
              work.done(generate_kernel(region))
          except Exception as e:
              work.refuse(region, e)
      compiled = work.compiled()

  A region the generator refuses (:class:`~fusion.compiler.ir.Unsupported`) at one of its nodes is cut there: that
  node runs as an aten call and the pieces around it come back into the loop. Any other exception is a generator
  bug: raised in tests and practice workspaces (``fusion.common.fallback_reason``), a fallback reason otherwise.
* :func:`build_compiled_graph` — the original graph with every kernel's region replaced by one ``call_module`` of
  its :class:`~fusion.kernels.triton_runtime.RegionKernel`; everything else (matmul, conv, fallbacks) stays aten.
* :class:`CompiledGraph` / :class:`CompiledModel` — what Phase 8 and Phase 9 run.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Iterator, Sequence

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.common import FusionReport, fallback_reason
from fusion.compiler.ir import Kernel, KernelPlan, Region, Unsupported
from fusion.fxutils.pieces import connected_pieces
from fusion.kernels import triton_runtime as rt


class CompiledGraph(torch.nn.Module):
    """Callable like the aten graph it came from; ``.kernels``, ``.report``, ``.regions``, ``.num_kernels``,
    ``.library_calls``."""

    def __init__(self, graph_module: fx.GraphModule, kernels: list[Kernel], report, regions: int = 0) -> None:
        super().__init__()
        self.graph_module = graph_module
        self.kernels = kernels
        self.report = report
        self.regions = regions  # Phase 6's regions of the graph (before any cut)

    @property
    def num_kernels(self) -> int:
        """Generated kernel launches per call (one per compiled region)."""
        return len(self.kernels)

    @property
    def library_calls(self) -> int:
        """aten calls per call that are not generated kernels (matmul, conv, ops of fallback regions, lone ops)."""
        return sum(n.op == "call_function" and not is_view_node(n) for n in self.graph_module.graph.nodes)

    @property
    def code(self) -> str:
        return self.graph_module.code

    def forward(self, *args):
        return self.graph_module.forward(*args)  # forward itself: no second Module.__call__ per call


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

    def __iter__(self) -> Iterator[Region]:
        while self.work:
            yield self.work.pop(0)

    def done(self, plan: KernelPlan) -> None:
        """The region's kernel was generated (it runs only where Triton does: else the region is refused)."""
        if not self.runs:
            self.refuse(plan.kernel.region, Unsupported(self.why))
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
        bad = getattr(exc, "node", None)
        if self.runs and isinstance(exc, Unsupported) and bad in region.members:  # cut there, generate the rest
            self.report.skip("op", [bad.name], f"runs as an aten call: {reason}")
            self.work[:0] = split_region(region, bad)
            return
        self.report.skip("region", [n.name for n in region.nodes], f"runs as aten ops: {reason}")

    def compiled(self) -> CompiledGraph:
        new = build_compiled_graph(self.gm, self.plans)
        return CompiledGraph(new, [p.kernel for p in self.plans], self.report, self.regions)


def split_region(region: Region, bad: fx.Node) -> list[Region]:
    """The region without ``bad``, cut there the way Phase 6 cuts a span at a non-fusible node: the members before
    ``bad`` and those after it are grouped separately (so every piece's inputs come before it), each into its
    connected pieces; pieces with at least two non-view nodes come back as regions, to be generated in turn."""
    cut = region.nodes.index(bad)
    pieces = []
    for span in (region.nodes[:cut], region.nodes[cut + 1 :]):
        for nodes in connected_pieces(span):
            if sum(not is_view_node(n) for n in nodes) >= 2:
                pieces.append(region.piece(nodes))
    return pieces


def build_compiled_graph(gm: fx.GraphModule, plans: Sequence[KernelPlan]) -> fx.GraphModule:
    """A copy of ``gm`` where each plan's region is one ``call_module`` (named after its kernel) + getitems.

    The call sits where the region's first member was: every external input of a region comes before its span,
    every outside user after it (Phase 6's regions never reach across a non-fusible node).
    """
    graph = fx.Graph()
    graph._codegen = copy.deepcopy(gm.graph._codegen)
    owner: dict[fx.Node, KernelPlan] = {n: p for p in plans for n in p.kernel.region.nodes}
    env: dict[fx.Node, fx.Node] = {}
    done: set[int] = set()
    root = torch.nn.Module()
    for name, mod in gm.named_children():
        root.add_module(name, mod)
    for name, p in gm.named_parameters(recurse=False):
        root.register_parameter(name, p)
    for name, b in gm.named_buffers(recurse=False):
        root.register_buffer(name, b)
    for node in gm.graph.nodes:
        plan = owner.get(node)
        if plan is None:
            env[node] = graph.node_copy(node, env.__getitem__)
            continue
        if id(plan) in done:
            continue
        done.add(id(plan))
        root.add_module(plan.kernel.name, rt.RegionKernel(plan))
        call = graph.call_module(plan.kernel.name, tuple(env[n] for n in plan.inputs))
        for i, out in enumerate(plan.outputs):
            item = graph.call_function(operator.getitem, (call, i))
            item.meta = copy.copy(out.meta)
            env[out] = item
    new = fx.GraphModule(root, graph, class_name="CompiledGraph")
    new.graph.lint()
    new.recompile()
    return new


class CompiledModel(torch.nn.Module):
    """What Phase 8's ``compile_regions`` returns: the model's outputs, computed by the compiled aten graph."""

    def __init__(self, model: torch.nn.Module, compiled: CompiledGraph) -> None:
        from fusion.aten.capture import _named_tensors

        super().__init__()
        self.compiled = compiled
        self._model = [model]  # not a submodule: its parameters are read at each call, never copied or changed
        # Where each parameter and buffer lives (owner module, attribute), found once: reading them at each call
        # by getattr sees a reassigned parameter too, without walking named_parameters() every time.
        self._refs = []
        for name in _named_tensors(model):  # the order of capture_aten's placeholders: parameters, buffers
            owner, _, attr = name.rpartition(".")
            self._refs.append((model.get_submodule(owner), attr))

    kernels = property(lambda self: self.compiled.kernels)
    report = property(lambda self: self.compiled.report)
    num_kernels = property(lambda self: self.compiled.num_kernels)
    library_calls = property(lambda self: self.compiled.library_calls)

    def forward(self, *inputs: torch.Tensor):
        with torch.no_grad():  # generated kernels have no backward (Phase 9 compiles the backward graph too)
            return self.compiled.forward(*[getattr(m, a) for m, a in self._refs], *inputs)
