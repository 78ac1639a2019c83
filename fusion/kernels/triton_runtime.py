"""Machinery behind Phase 8 (``fusion.codegen``): turn generated Triton source into a launchable kernel, and run a
graph in which every compiled region is one launch. A learner reads ``fusion/codegen.py``; this file is plumbing.

* :func:`triton_status` — can this machine run Triton at all (installed? a GPU, or the CPU interpreter?).
* :func:`load_kernel` — write the source to a cache directory and import it: ``@triton.jit`` reads the function's
  source with ``inspect``, so a kernel must live in a real file (Inductor's ``PyCodeCache`` does the same). Kernels
  for CPU tensors are defined with ``TRITON_INTERPRET=1`` set (only while their module is imported), so they run in
  Triton's interpreter; kernels for CUDA tensors are compiled by Triton.
* :class:`KernelPlan` / :class:`RegionKernel` — one launch: check the inputs against what the source was specialised
  for, allocate the outputs, launch on the grid, rebuild escaping views.
* :func:`build_compiled_graph` / :class:`CompiledGraph` — the original graph with every compiled region replaced by
  one ``call_module`` of its :class:`RegionKernel`; everything else (matmul, conv, fallbacks) stays an aten call.
* :func:`compile_graph_with` / :func:`split_region` — generate every region; a region with an op the generator has
  no rule for is cut at that op (an aten call) and the pieces around it are generated in turn. Any other exception is
  a generator bug: reported as "internal error: …" (or raised, with ``STRICT`` / ``FUSION_STRICT=1``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import operator
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.fx as fx

from fusion.compiler.ir import Unsupported

# ----------------------------------------------------------------------------------------------------------------------
# Is Triton here?


def triton_status() -> tuple[bool, str]:
    """(can we run generated kernels, why not / how). Never raises."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # macOS wheels, a torch build without Triton, a broken install
        return False, f"Triton is not installed here ({type(e).__name__}: {e}); the source can be printed, not run"
    how = "on the GPU" if torch.cuda.is_available() else "in Triton's CPU interpreter (TRITON_INTERPRET=1)"
    return True, f"Triton {triton.__version__} runs the kernels {how}"


def triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except Exception:
        return "not installed"


@contextlib.contextmanager
def _interpret(on: bool):
    """TRITON_INTERPRET set (or cleared) while a kernel module is imported: ``@triton.jit`` reads it at definition."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def cache_dir() -> Path:
    """Where generated kernels are written: $FUSION_CACHE_DIR, else <tmp>/fusion_kernels_<user>."""
    root = os.environ.get("FUSION_CACHE_DIR")
    if not root:
        user = os.environ.get("USER") or os.environ.get("USERNAME") or str(os.getuid() if hasattr(os, "getuid") else 0)
        root = os.path.join(tempfile.gettempdir(), f"fusion_kernels_{user}")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


_LOADED: dict[tuple[str, bool], object] = {}


def load_kernel(source: str, name: str, *, interpret: bool) -> object:
    """Write ``source`` to ``<cache_dir>/<name>_<hash>.py``, import it, return its function ``name``.

    One module per (source, interpret): loading the same source twice returns the same (already compiled) kernel.
    """
    key = (source, interpret)
    if key in _LOADED:
        return _LOADED[key]
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = cache_dir() / f"{name}_{digest}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)  # atomic: a parallel test worker never imports half a file
    module_name = f"fusion_kernels.{path.stem}{'_interp' if interpret else ''}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # inspect.getsource finds the file through the module
    with _interpret(interpret):
        spec.loader.exec_module(module)
    kernel = getattr(module, name)
    _LOADED[key] = kernel
    return kernel


# ----------------------------------------------------------------------------------------------------------------------
# One generated kernel and its launch


@dataclass
class GeneratedKernel:
    """A region's kernel: ``name`` (what the profiler shows), ``source`` (the Triton code), ``region``, ``kind``."""

    name: str
    source: str
    region: object  # fusion.regions.FusionRegion
    kind: str = "pointwise"  # or "reduction"
    ops: list[str] = field(default_factory=list)  # the aten ops it computes, one per line of the body

    def __repr__(self) -> str:
        return f"GeneratedKernel({self.name}, {len(self.ops)} ops)"


@dataclass
class KernelPlan:
    """Everything a launch needs besides the tensors, decided at code-generation time."""

    kernel: GeneratedKernel
    inputs: list[fx.Node]  # external inputs, in kernel-argument order
    input_meta: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]  # (shape, stride, dtype) specialised on
    stored: list[fx.Node]  # members written by the kernel, in argument order
    outputs: list[fx.Node]  # the region's external outputs, in the order the launch returns them
    grid: int  # number of programs of a reduction kernel (one per row); 0 for a pointwise kernel
    constexprs: dict[str, int]  # e.g. {"RBLOCK": 1024}
    num_warps: int = 4
    xnumel: int = 0  # elements of a pointwise kernel: XBLOCK and the grid are chosen at launch, per device

    def launch_config(self, device: torch.device) -> tuple[int, dict[str, int]]:
        """(programs, constexprs): a pointwise kernel takes 1024 elements per program on a GPU, and many more in the
        interpreter, where every program costs ~1 ms of Python."""
        if not self.xnumel:
            return self.grid, self.constexprs
        cap = 1024 if device.type == "cuda" else 16384
        block = min(cap, 1 << max(self.xnumel - 1, 0).bit_length())
        return -(-self.xnumel // block), {"XBLOCK": block}


def _same_layout(t: torch.Tensor, stride: tuple[int, ...]) -> bool:
    """Strides differ only where they do not matter: a dimension of size 1 is never stepped along (its index is 0)."""
    return all(size == 1 or a == b for size, a, b in zip(t.shape, t.stride(), stride, strict=True))


class ShapeMismatchError(ValueError):
    """A compiled kernel was called with tensors of another shape/stride/dtype than it was generated for."""


class RegionKernel(torch.nn.Module):
    """One region = one launch. Called with the region's external inputs, returns its external outputs (a tuple)."""

    def __init__(self, plan: KernelPlan) -> None:
        super().__init__()
        self.plan = plan
        self._compiled: dict[bool, object] = {}
        # Decided once, not per call (the per-call Python is what a small kernel's wall time is made of).
        vals = [node.meta["val"] for node in plan.stored]
        self._out_specs = [(tuple(v.shape), tuple(v.stride()), v.dtype) for v in vals]
        self._configs: dict[str, tuple[int, dict[str, int]]] = {}  # device type -> (programs, constexprs)

    @property
    def kernel(self) -> GeneratedKernel:
        return self.plan.kernel

    def _function(self, interpret: bool):
        fn = self._compiled.get(interpret)
        if fn is None:
            fn = self._compiled[interpret] = load_kernel(self.kernel.source, self.kernel.name, interpret=interpret)
        return fn

    def _launcher(self, inputs: Sequence[torch.Tensor]) -> tuple[Callable[[], None], list[torch.Tensor]]:
        """Check the inputs, allocate the outputs; return (launch once, the outputs it writes)."""
        plan = self.plan
        for node, t, want in zip(plan.inputs, inputs, plan.input_meta, strict=True):
            if t.shape != want[0] or t.dtype != want[2] or (t.stride() != want[1] and not _same_layout(t, want[1])):
                raise ShapeMismatchError(
                    f"{self.kernel.name}: input {node.name} is {tuple(t.shape)} stride {tuple(t.stride())} {t.dtype}, "
                    f"but the kernel was generated for {want[0]} stride {want[1]} {want[2]}. Fix: compile again "
                    "with example inputs of the shapes (and memory layout) you call it with"
                )
        device = inputs[0].device if inputs else torch.device("cpu")
        outs = [
            torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride, dtype in self._out_specs
        ]
        fn = self._function(interpret=device.type != "cuda")
        config = self._configs.get(device.type)
        if config is None:
            config = self._configs[device.type] = plan.launch_config(device)
        grid, constexprs = config

        def launch() -> None:
            if grid > 0:
                fn[(grid,)](*inputs, *outs, num_warps=plan.num_warps, **constexprs)

        return launch, outs

    def forward(self, *inputs: torch.Tensor) -> tuple:
        launch, outs = self._launcher(inputs)
        launch()
        values: dict[fx.Node, object] = dict(zip(self.plan.stored, outs, strict=True))
        values.update(zip(self.plan.inputs, inputs, strict=True))
        return tuple(_rebuild(node, values) for node in self.plan.outputs)


def _rebuild(node: fx.Node, values: dict[fx.Node, object]) -> object:
    """An escaping view is not written by the kernel: apply the view op to the tensor it aliases, here in Python."""
    if node in values:
        return values[node]
    args = fx.node.map_arg(node.args, lambda n: _rebuild(n, values))
    kwargs = fx.node.map_arg(node.kwargs, lambda n: _rebuild(n, values))
    values[node] = node.target(*args, **kwargs)
    return values[node]


# ----------------------------------------------------------------------------------------------------------------------
# The whole graph: regions become launches, everything else stays aten


class CompiledGraph(torch.nn.Module):
    """Callable like the aten graph it came from; ``.kernels``, ``.report``, ``.num_kernels``, ``.library_calls``."""

    def __init__(self, graph_module: fx.GraphModule, kernels: list[GeneratedKernel], report, fallbacks: int) -> None:
        super().__init__()
        self.graph_module = graph_module
        self.kernels = kernels
        self.report = report
        self.fallback_regions = fallbacks

    @property
    def num_kernels(self) -> int:
        """Generated kernel launches per call (one per compiled region)."""
        return len(self.kernels)

    @property
    def library_calls(self) -> int:
        """aten calls per call that are not generated kernels (matmul, conv, ops of fallback regions, lone ops)."""
        from fusion.aten.nodes import is_view_node

        return sum(
            n.op == "call_function" and not is_view_node(n) and n.target is not operator.getitem
            for n in self.graph_module.graph.nodes
        )

    @property
    def code(self) -> str:
        return self.graph_module.code

    def forward(self, *args):
        return self.graph_module.forward(*args)  # forward itself: no second Module.__call__ per call


def compile_graph_with(
    gm: fx.GraphModule,
    example_inputs: Sequence[torch.Tensor],
    generate: Callable[[object], KernelPlan],
    regions_of: Callable[[fx.GraphModule], dict],
) -> CompiledGraph:
    """``fusion.codegen.compile_graph``'s loop: ``generate`` each region's plan; a region it refuses runs as aten.
    ``regions_of`` is Phase 6's ``build_fusion_regions`` (passed in: machinery never imports a lesson)."""
    from fusion.aten.nodes import unique_regions
    from fusion.common import FusionReport, is_todo

    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"compile_graph needs a torch.fx.GraphModule (e.g. from capture_aten), got {type(gm).__name__}")
    if any("val" not in n.meta for n in gm.graph.nodes if n.op in ("placeholder", "call_function")):
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        FakeTensorProp(gm).propagate(*example_inputs)  # shapes, strides and dtypes for every node
    report = FusionReport("compile_graph")
    ok, why = triton_status()
    plans: list[KernelPlan] = []
    fallbacks = 0
    work = list(unique_regions(regions_of(gm)))
    while work:
        region = work.pop(0)
        members = [n.name for n in region.nodes]
        try:
            plan = generate(region)
            if not ok:
                raise Unsupported(why)
            plans.append(plan)
            report.fuse("region", members, replacement=plan.kernel.name, reason=f"{plan.kernel.kind} kernel")
        except Exception as e:  # a region we cannot compile runs as aten ops: never a crash, never a wrong answer
            if is_todo(e) or (STRICT and not isinstance(e, Unsupported)):
                raise
            bad = getattr(e, "node", None)
            reason = str(e) if isinstance(e, Unsupported) else f"internal error: {type(e).__name__}: {e}"
            if ok and isinstance(e, Unsupported) and bad in region.members:  # cut there, compile the pieces around it
                report.skip("op", [bad.name], f"runs as an aten call: {reason}")
                work[:0] = split_region(region, bad)
                continue
            fallbacks += 1
            report.skip("region", members, f"runs as aten ops: {reason}")
    new = build_compiled_graph(gm, plans)
    return CompiledGraph(new, [p.kernel for p in plans], report, fallbacks)


# Tests set this: an exception other than Unsupported is a bug in the generator, never a fallback reason.
STRICT = os.environ.get("FUSION_STRICT") == "1"


def split_region(region, bad: fx.Node) -> list:
    """The region without ``bad``, cut there the way Phase 6 cuts a span at a non-fusible node: the members before
    ``bad`` and those after it are grouped separately (so every piece's inputs come before it), each into its
    connected pieces; pieces with at least two non-view nodes come back as regions, to be generated in turn."""
    from fusion.aten.nodes import is_view_node

    cut = region.nodes.index(bad)
    pieces = []
    for span in (region.nodes[:cut], region.nodes[cut + 1 :]):
        members, piece_of = set(span), {}
        for node in span:  # union of a node with its producers in the span, in graph order
            roots = {id(piece_of[i]): piece_of[i] for i in node.all_input_nodes if i in members}
            merged = [n for p in roots.values() for n in p] + [node]
            for n in merged:
                piece_of[n] = merged
        for piece in {id(p): p for p in piece_of.values()}.values():
            nodes = sorted(piece, key=span.index)
            if sum(not is_view_node(n) for n in nodes) >= 2:
                pieces.append(type(region)(nodes, index=region.index, byte_cache=region.byte_cache))
    return pieces


def build_compiled_graph(gm: fx.GraphModule, plans: Sequence[KernelPlan]) -> fx.GraphModule:
    """A copy of ``gm`` where each plan's region is one ``call_module`` (named after its kernel) + getitems.

    The call sits where the region's first member was: every external input of a region comes before its span,
    every outside user after it (Phase 6's regions never reach across a non-fusible node).
    """
    import copy

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
        root.add_module(plan.kernel.name, RegionKernel(plan))
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
    """What :func:`compile_regions` returns: the model's outputs, computed by the compiled aten graph."""

    def __init__(self, model: torch.nn.Module, compiled: CompiledGraph) -> None:
        super().__init__()
        self.compiled = compiled
        self._model = [model]  # not a submodule: its parameters are read at each call, never copied or changed
        # Where each parameter and buffer lives (owner module, attribute), found once: reading them at each call
        # by getattr sees a reassigned parameter too, without walking named_parameters() every time.
        self._refs = []
        for name in _aten_input_names(model):
            owner, _, attr = name.rpartition(".")
            self._refs.append((model.get_submodule(owner), attr))

    kernels = property(lambda self: self.compiled.kernels)
    report = property(lambda self: self.compiled.report)
    num_kernels = property(lambda self: self.compiled.num_kernels)
    library_calls = property(lambda self: self.compiled.library_calls)

    def forward(self, *inputs: torch.Tensor):
        with torch.no_grad():  # generated kernels have no backward (Phase 9 compiles the backward graph too)
            return self.compiled.forward(*[getattr(m, a) for m, a in self._refs], *inputs)


def _aten_input_names(model: torch.nn.Module) -> list[str]:
    """The qualified names of the tensors capture_aten makes placeholders of, in its order (parameters, buffers)."""
    from fusion.aten.capture import _named_tensors

    return list(_named_tensors(model))


def wall_us(fn: Callable[..., object], *args: object) -> float:
    """Median wall time of ``fn(*args)`` + a CUDA synchronize, in µs (torch.utils.benchmark)."""
    from torch.utils.benchmark import Timer

    timer = Timer("f(*x); torch.cuda.synchronize()", globals={"f": fn, "x": args, "torch": torch})
    with torch.no_grad():
        return timer.blocked_autorange(min_run_time=0.3).median * 1e6


def kernel_gpu_us(compiled: CompiledGraph, flat_inputs: Sequence[torch.Tensor], launches: int = 50) -> list[tuple]:
    """(kernel, GPU µs per launch) for every generated kernel of one call: CUDA events around ``launches``
    back-to-back launches of that kernel alone, on the inputs it received in that call (outputs preallocated)."""
    captured: dict[RegionKernel, tuple] = {}
    kernels = [m for m in compiled.graph_module.modules() if isinstance(m, RegionKernel)]
    hooks = [m.register_forward_pre_hook(lambda mod, args: captured.setdefault(mod, args)) for m in kernels]
    try:
        with torch.no_grad():
            compiled(*flat_inputs)
    finally:
        for h in hooks:
            h.remove()
    rows = []
    for mod, args in captured.items():
        launch, _ = mod._launcher(args)
        launch()  # compile and warm up
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            launch()
        end.record()
        end.synchronize()
        rows.append((mod.kernel, start.elapsed_time(end) * 1e3 / launches))
    return rows


def gpu_numbers(compile_regions: Callable, quick: bool) -> None:
    """On a GPU: each generated kernel's GPU time beside Phase 6's prediction (external bytes ÷ copy bandwidth)."""
    from fusion import models
    from fusion.aten.bandwidth import measure_bandwidth_gbps
    from fusion.aten.capture import aten_inputs
    from fusion.common import heading, table

    heading(f"On the GPU ({torch.cuda.get_device_name()}, bf16): measured vs predicted", "-")
    bw = measure_bandwidth_gbps("cuda")
    rows, misses, n = [], [], 1024 if quick else 8192
    for title, m, inp in (
        ("relu(x·a+b)·c + x", models.ElementwiseChain(d=4096), models.elementwise_inputs(batch=n, d=4096)),
        ("x + gelu(layer_norm(x))", models.NormGELUResidual(d_model=4096), models.norm_inputs(1, n, 4096)),
    ):
        m, inp = m.cuda().bfloat16(), tuple(t.cuda().bfloat16() for t in inp)
        compiled = compile_regions(m, inp)
        eager, ours = wall_us(m, *inp), wall_us(compiled, *inp)
        for kernel, gpu in kernel_gpu_us(compiled.compiled, aten_inputs(m, inp)):
            predicted = kernel.region.total_bytes / (bw * 1e3)  # µs
            if gpu > 1.3 * predicted:
                misses.append((kernel.name, kernel.kind))
            rows.append((title, kernel.name, f"{predicted:.1f}", f"{gpu:.1f}", f"{gpu / predicted:.2f}×",
                         f"{eager:.1f}", f"{ours:.1f}"))  # fmt: skip
    print(table(rows, ["block", "kernel", "predicted µs", "GPU µs", "GPU/predicted", "eager wall µs", "ours wall µs"]))
    print(f"predicted = the region's external bytes ÷ {bw:.0f} GB/s (a copy measured here); GPU µs from CUDA events.")
    for name, kind in misses:
        why = (
            "one program per row is a dependent chain (load, cross-warp reduction, second reduction, store) with "
            "little memory-level parallelism per SM: the lesson's docstring says why, and what Inductor does instead"
            if kind == "reduction"
            else "a pointwise kernel should stream at copy bandwidth: look at its loads (broadcast, strides) and XBLOCK"
        )
        print(f"{name} is beyond 1.3× of its prediction: {why}.")
