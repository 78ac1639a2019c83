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
  submodule, to inspect); everything else (matmul, conv, fallbacks) stays aten, with ``prims`` ops outside kernels
  mapped to their aten ops (:func:`prims_to_aten`) and library calls made through torch's Python bindings
  (:mod:`fusion.compiler.bindings`: ``torch.convolution``, ~5 µs less CPU a call than the OpOverload). The
  GraphModule's generated ``forward`` is the wrapper a call runs: straight-line Python, one line per launch or
  library call, intermediates freed after their last use (what Inductor's ``call(args)`` is, written by fx's code
  generator instead of ours).
* :class:`CompiledGraph` / :class:`CompiledModel` — what Phase 8 and Phase 9 run.
"""

from __future__ import annotations

import contextlib
import operator
from collections import Counter
from collections.abc import Iterator, Sequence

import torch
import torch.fx as fx

from fusion.aten.nodes import LOW_MEMORY_MAX_POOLS, as_traced, is_view_node, reinterpret, same_layout, strided_view
from fusion.common import FusionReport, fallback_reason
from fusion.compiler.bindings import python_bindings
from fusion.compiler.lowering import lower_plan
from fusion.fxutils.pieces import connected_pieces
from fusion.fxutils.rebuild import Group, rebuild
from fusion.ir.plan import Kernel, KernelPlan, Region, SplitRegion, Unsupported
from fusion.kernels import c_runtime
from fusion.kernels import triton_runtime as rt
from fusion.kernels.precompile import precompile


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
        return sum(
            n.op == "call_function"
            and not isinstance(n.target, rt.Launcher)
            and not is_view_node(n)
            and n.target is not as_traced  # a stride check, not a call (a copy only where ATen chose another layout)
            for n in self.graph_module.graph.nodes
        )

    @property
    def code(self) -> str:
        return self.graph_module.code

    check_inputs = True  # the backend turns it off: Dynamo's guards already pin every input's shape and strides

    @property
    def input_specs(self) -> list[tuple[str, tuple, tuple, torch.dtype] | None]:
        """(name, shape, stride, dtype) per graph input the call is checked against (None: not a static tensor)."""
        specs = self.__dict__.get("_input_specs")
        if specs is None:
            specs = []
            for node in self.graph_module.graph.find_nodes(op="placeholder"):
                v = node.meta.get("val")
                static = isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in (*v.shape, *v.stride()))
                specs.append((node.name, tuple(v.shape), tuple(v.stride()), v.dtype) if static else None)
            self.__dict__["_input_specs"] = specs
        return specs

    def check(self, args: Sequence[object]) -> None:
        """Once per call, at the entry: every input as the kernels were generated for (they trust it after)."""
        for spec, t in zip(self.input_specs, args, strict=False):
            if spec is None or not isinstance(t, torch.Tensor):
                continue
            name, shape, stride, dtype = spec
            if t.shape != shape or t.dtype != dtype or (t.stride() != stride and not same_layout(t, stride)):
                raise rt.ShapeMismatchError(
                    f"compiled graph input {name} is {tuple(t.shape)} stride {tuple(t.stride())} {t.dtype}, but its kernels "
                    f"were generated for {shape} stride {stride} {dtype}. Fix: compile again with example inputs of the "
                    "shapes (and memory layout) you call it with"
                )
        for i in self.written_inputs:  # an input the graph writes must not share memory with another input
            other = next((j for j, t in enumerate(args) if j != i and _overlap(args[i], t)), None)
            if other is not None:
                a, b = self.input_specs[i], self.input_specs[other]
                a, b = (a[0] if a else f"#{i}"), (b[0] if b else f"#{other}")
                raise rt.ShapeMismatchError(
                    f"compiled graph inputs {a} and {b} share memory, and the graph writes {a} in place: it was traced "
                    f"with separate tensors, so it reads {b} as it was before the write. Fix: pass separate tensors "
                    f'({b}.clone()), or use torch.compile(model, backend="fusion"), which recompiles for aliased inputs'
                )

    @property
    def written_inputs(self) -> list[int]:
        """The inputs the graph writes in place (a copy_ of a new value back into the caller's tensor)."""
        written = self.__dict__.get("_written")
        if written is None:
            placeholders = {n: i for i, n in enumerate(self.graph_module.graph.find_nodes(op="placeholder"))}
            written = sorted({placeholders[n.args[0]] for n in self.graph_module.graph.nodes
                              if n.op == "call_function" and n.target is aten.copy_.default and n.args[0] in placeholders})  # fmt: skip
            self.__dict__["_written"] = written
        return written

    def forward(self, *args):
        if self.check_inputs:  # the graph is specialised to the example shapes, with or without kernels in it
            self.check(args)
        return self.graph_module.forward(*args)  # forward itself: no second Module.__call__ per call

    @property
    def launchers(self) -> list[rt.Launcher]:
        return [m.launch for m in self.graph_module.modules() if isinstance(m, rt.RegionKernel)]


def _overlap(a: object, b: object) -> bool:
    """Do tensors ``a`` and ``b`` reach common bytes (the spans of their elements in one storage intersect)?"""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or not a.numel() or not b.numel():
        return False

    def span(t: torch.Tensor) -> tuple[int, int]:
        start = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
        last = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True))
        return start, start + (last + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


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
        if self.c_chosen and all(n.meta["val"].device.type == "cpu" for n in (*plan.inputs, *plan.stored)):
            try:  # the pure-data kernel IR the C renderer renders (fusion.kernels.c_runtime.kernel_for)
                plan.ir = lower_plan(plan)
            except Unsupported as e:
                plan.ir_refused = e
        if self.c_cpu and (why := c_runtime.refusal(plan, self.triton)) is not None:  # C does not take it: aten
            self.refuse(plan.kernel.region, why)
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
            self.work[:0] = split_by_outputs(region, exc.first) or split_region(region, exc.before, keep=True)
            return
        bad = getattr(exc, "node", None)
        if self.runs and isinstance(exc, Unsupported) and bad in region.members:  # cut there, generate the rest
            self.report.skip("op", [bad.name], f"runs as an aten call: {reason}")
            self.work[:0] = split_region(region, bad)
            return
        self.report.skip("region", [n.name for n in region.nodes], f"runs as aten ops: {reason}")

    def compiled(self) -> CompiledGraph:
        new = build_compiled_graph(self.gm, self.plans)
        compiled = CompiledGraph(new, [p.kernel for p in self.plans], self.report, self.regions)
        compiled.precompiled = precompile([lch.owner for lch in compiled.launchers])  # CUDA: all kernels at once
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
    """The connected pieces of each span with at least two non-view nodes, as regions of ``region``'s kind."""
    pieces = [region.piece(nodes) for span in spans for nodes in connected_pieces(span)]
    return [p for p in pieces if p.non_view_count >= 2]


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
            producers = [call_position(group_of[n]) if n in group_of else position[n]
                         for n in g.inputs if group_of.get(n) is not g and n in position]  # fmt: skip
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
    kernels = {name: rt.RegionKernel(p) for name, p in zip(names, plans, strict=True)}
    groups = [Group(name, p.kernel.region.nodes, p.inputs, p.outputs) for name, p in zip(names, plans, strict=True)]
    place_after_producers(gm, groups)

    def launch(graph: fx.Graph, group: Group, args: tuple[fx.Node, ...]) -> fx.Node:
        call = graph.call_function(kernels[group.name].launch, args)
        call.meta["kernel"] = group.name
        return call

    new = rebuild(gm, groups, launch, kernels, class_name="CompiledGraph")
    new.meta["prims_to_aten"] = prims_to_aten(new)
    new.meta["traced_layouts"] = traced_layouts(new)
    new.meta["views_as_strides"] = views_as_strides(new)
    new.meta["python_bindings"] = python_bindings(new)  # library calls: torch.convolution, not an OpOverload
    new.graph.lint()
    new.recompile()
    return new


prims = torch.ops.prims
aten = torch.ops.aten


def _iota(length, *, start, step, dtype, device, requires_grad):
    return aten.arange.start_step(start, start + length * step, step, dtype=dtype, device=device)


# prims ops that Inductor's decompositions emit and Inductor lowers itself: run eagerly, each is a Python reference
# implementation (~10-20 µs of CPU per call). Outside a generated kernel they become the aten op that does the same:
# prims.convert_element_type(x, dtype) -> aten._to_copy(x, dtype=dtype) (below), and these.
PRIMS_TO_ATEN = {prims.iota.default: _iota}


def _same_strides_as_input(node: fx.Node) -> bool:
    """aten._to_copy keeps a dense input's strides; the graph was traced with prims' strides: they must agree (but
    for dims of size 1, never stepped along: a GEMM's (K, C) gradient viewed as (K, C, 1, 1) has strides (C, 1, 1, 1)
    where prims traced (C, 1, C, C))."""
    x, out = node.args[0], node.meta.get("val")
    xv = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(xv, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    return _dense(xv) and same_layout(xv, tuple(out.stride()))


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: some order of the dims is contiguous (size-1 dims may have any stride)."""
    expected = 1
    dims = sorted(((st, s) for s, st in zip(t.shape, t.stride(), strict=True) if s != 1))
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _max_pool_values(op):
    def max_pool(x, kernel_size, stride, padding, dilation, ceil_mode):
        return op(x, kernel_size, stride, padding, dilation, ceil_mode)[0], None  # (values, offsets nobody reads)

    max_pool.__name__ = f"{op.__name__.split('.')[0]}_values"
    return max_pool


def _max_pool_as_aten(node: fx.Node) -> bool:
    """Inductor's low-memory max-pool prim (values + int8 window offsets) as one aten max-pool call, where no one
    reads the offsets (inference) and aten's result has the strides the graph was traced with; else left as it is."""
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        return False  # the offsets feed the backward: keep the prim
    x, rest = node.args[0], node.args[1:6]
    xv, want = x.meta.get("val"), node.meta.get("val")
    if not isinstance(xv, torch.Tensor) or not isinstance(want, (tuple, list)) or len(node.args[1]) not in (2, 3):
        return False
    op = aten.max_pool2d_with_indices.default if len(node.args[1]) == 2 else aten.max_pool3d_with_indices.default
    from torch._guards import detect_fake_mode

    try:
        with detect_fake_mode([xv]) or contextlib.nullcontext():
            ref = op(xv, *rest)[0]
    except Exception:  # noqa: BLE001 - aten does not take these arguments: keep the prim
        return False
    if ref.shape != want[0].shape or ref.stride() != want[0].stride() or ref.dtype != want[0].dtype:
        return False  # a kernel downstream reads the values at the traced strides: they must be aten's
    node.target = _max_pool_values(op)
    return True


def prims_to_aten(gm: fx.GraphModule) -> list[str]:
    """Replace every ``prims`` call of ``gm`` (outside generated kernels: they are launcher calls by now) by its aten
    op. Returns the nodes changed; a prims op without an entry in :data:`PRIMS_TO_ATEN` is left as it is."""
    changed = []
    for node in list(gm.graph.nodes):
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or target.namespace != "prims":
            continue
        if target is prims.convert_element_type.default and _same_strides_as_input(node):
            x, dtype = node.args
            node.target, node.args, node.kwargs = aten._to_copy.default, (x,), {"dtype": dtype}
        elif target in PRIMS_TO_ATEN:
            node.target = PRIMS_TO_ATEN[target]
        elif not (target._schema.name in LOW_MEMORY_MAX_POOLS and _max_pool_as_aten(node)):
            continue
        changed.append(f"{node.name}: {target}")
    if changed:
        gm.recompile()
    return changed


# Library ops whose ATen kernels always return a new contiguous tensor (cuBLAS and the CPU BLAS path alike allocate
# the result row-major), so their output needs no layout check: ~1 µs of CPU a call each (GPT-2: 48 a call).
FRESH_CONTIGUOUS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default})


def _fresh_contiguous(node: fx.Node) -> bool:
    """A :data:`FRESH_CONTIGUOUS` op traced contiguous: its output holds the traced strides with no check."""
    val = node.meta.get("val")
    return node.target in FRESH_CONTIGUOUS and isinstance(val, torch.Tensor) and val.is_contiguous()


def _library_value(node: fx.Node) -> bool:
    """A tensor a library call computed (its output, or one item of its tuple): its strides are ATen's choice."""
    if node.op != "call_function" or isinstance(node.target, rt.Launcher) or is_view_node(node, getitem=False):
        return False
    if node.target in (reinterpret, as_traced):
        return False
    if node.target is operator.getitem:  # an item of a library call's tuple (not of a split: a view, see below)
        src = node.args[0]
        return (isinstance(src, fx.Node) and src.op == "call_function" and not isinstance(src.target, rt.Launcher)
                and not is_view_node(src, getitem=False))  # fmt: skip
    return True


def traced_layouts(gm: fx.GraphModule) -> int:
    """Every library output that a generated kernel or a view reads, or that the graph returns (a forward graph's
    saved tensors are the backward graph's inputs), goes through :func:`as_traced`: all of them trust the traced
    strides, and ATen's kernels need not keep them. (Seen: the BatchNorm family on CPU returns a contiguous output
    for a transposed input, where its meta function keeps the input's strides: ``bn(x.transpose(1, 2))`` in
    training gave values off by 3.7 through a view's strides.) Returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        val = node.meta.get("val")
        if not _library_value(node) or not isinstance(val, torch.Tensor):
            continue
        try:
            stride = tuple(int(s) for s in val.stride())
        except (TypeError, RuntimeError):
            continue
        if _fresh_contiguous(node):  # ATen allocates it so: nothing to check
            continue
        # a kernel or a view here, or the output: a saved tensor the backward graph's kernels read at these strides
        readers = [u for u in node.users
                   if u.op == "output" or isinstance(u.target, rt.Launcher) or is_view_node(u, getitem=False)]  # fmt: skip
        if not readers:
            continue
        with gm.graph.inserting_after(node):
            fixed = gm.graph.call_function(as_traced, (node, stride))
        fixed.meta = dict(node.meta)
        for u in readers:
            u.replace_input_with(node, fixed)
        count += 1
    if count:
        gm.recompile()
    return count


def _traced_layout(node: fx.Node) -> bool:
    """Does ``node`` hold its traced strides at run time? A graph input (checked at the entry, or guarded by Dynamo),
    a generated kernel's output (allocated at the traced strides), what :func:`as_traced` returns, or a GEMM's output
    traced contiguous (:func:`_fresh_contiguous`). Another library call's own output need not (see
    :func:`traced_layouts`)."""
    if node.op == "placeholder" or node.target is as_traced or _fresh_contiguous(node):
        return True
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        return isinstance(node.args[0].target, rt.Launcher)
    return False


def views_as_strides(gm: fx.GraphModule) -> int:
    """Every view op outside the kernels (a weight's ``t`` before a matmul, a ``view`` between two library calls)
    becomes one ``reinterpret`` of its base at the traced size, stride and offset, as Inductor's wrapper does: one
    C++ call instead of a view op's dispatch. A chain of views is one call: each reinterprets the chain's root, and
    the links nothing else reads are dropped (MultiheadAttention's q: view, permute, view; three calls, now one).
    An item of a ``split``/``unbind`` is a view of what the split reads (GPT-2's q, k, v: one ``split`` and three
    ``getitem`` calls, now three ``reinterpret``). Returns how many views became strides; a view that is not plain
    strides is left alone."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not is_view_node(node) or not node.args:
            continue
        base = node.args[0]
        if node.target is operator.getitem:  # an item of split/unbind/chunk: a view of what the split reads
            if not (isinstance(base, fx.Node) and base.op == "call_function" and is_view_node(base, getitem=False)):
                continue
            base = base.args[0]
        while isinstance(base, fx.Node) and base.target is reinterpret:  # earlier in graph order: already strides
            base = base.args[0]
        view = strided_view(node, base) if isinstance(base, fx.Node) and _traced_layout(base) else None
        if view is None:
            continue
        node.target, node.args, node.kwargs = reinterpret, (base, *view), {}
        count += 1
    for node in reversed(gm.graph.nodes):  # a link of a chain (a split whose items are strides), read by nothing now
        mutable = getattr(getattr(node.target, "_schema", None), "is_mutable", False)
        pure = node.target is reinterpret or (is_view_node(node, getitem=False) and not mutable)
        if node.op == "call_function" and not node.users and pure:  # an in-place view (transpose_) changes its input
            gm.graph.erase_node(node)
    if count:
        gm.recompile()
    return count


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
