"""What a compiled aten graph is at run time: :class:`CompiledGraph` (the graph with one launch per kernel, checked at
its entry against the inputs it was generated for) and :class:`CompiledModel` (Phase 8's ``compile_regions``: a
model's parameters read at each call). Built by :mod:`fusion.compiler.partition`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.fx as fx

from fusion.aten.nodes import as_traced, is_view_node, same_layout
from fusion.fxutils import boxed
from fusion.ir.plan import Kernel
from fusion.ir.views import extent
from fusion.kernels import stack_chunks
from fusion.kernels import triton_runtime as rt

aten = torch.ops.aten


class CompiledGraph(torch.nn.Module):
    """Callable like the aten graph it came from; ``.kernels``, ``.report``, ``.regions``, ``.num_kernels``,
    ``.library_calls``."""

    def __init__(self, graph_module: fx.GraphModule, kernels: list[Kernel], report, regions: int = 0) -> None:
        super().__init__()
        boxed.make_boxed(graph_module)  # forward(list): an input is freed at its last use (fusion.fxutils.boxed)
        stack_chunks.keep()  # once per process: a call's cost no longer depends on its caller's stack depth
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
        return self.graph_module.forward(list(args))  # forward itself: no second Module.__call__ per call

    def runner(self) -> Callable:
        """``run(*args)`` (as :meth:`forward`) with ``run.boxed``: the same call in AOTAutograd's boxed convention,
        ``run.boxed(args)`` (``_boxed_call``), which empties the list it is given so the graph frees each input
        at its last use (a backward's saved activations; :mod:`fusion.fxutils.boxed`). ``aot.make_boxed`` takes it."""
        forward, graph = self.forward, self.graph_module.forward

        def run(*args):
            return forward(*args)

        def run_boxed(args: list) -> object:
            if self.check_inputs:
                self.check(args)
            return graph(args)

        run_boxed._boxed_call = True
        run.boxed = run_boxed
        return run

    @property
    def launchers(self) -> list[rt.Launcher]:
        return [m.launch for m in self.graph_module.modules() if isinstance(m, rt.RegionKernel)]


def _overlap(a: object, b: object) -> bool:
    """Do tensors ``a`` and ``b`` reach common bytes (the spans of their elements in one storage intersect)?"""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or not a.numel() or not b.numel():
        return False

    def span(t: torch.Tensor) -> tuple[int, int]:
        start = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
        return start, start + extent(t.shape, t.stride()) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


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
