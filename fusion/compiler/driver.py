"""The compiler's driver: its stages in order, the pass list, the options, and the backend function Dynamo calls.

``torch.compile(model, backend="fusion")`` calls :func:`fusion_backend` once per Dynamo graph. It hands the graph to
Phase 9's ``lower`` (AOTAutograd, one ``compile_aten_graph`` per aten graph: the lesson ``fusion/backend.py``), which
runs the enabled :data:`PASSES` and then :func:`generate`: ``fusion.compiler.generate.compile_graph`` (Phase 6's
regions, lowering, rendering with Phase 8's expressions, partition) and, under ``options={"cudagraphs": True}``, one
CUDA graph. What the learner writes comes from the lessons through :mod:`fusion.compiler.registry`; nothing here imports a lesson. :data:`STAGES` names each stage, the module
that does it and what it hands on: the README's "How a tensor flows" table, held true by ``tests/test_layout.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
from torch._dynamo.utils import counters

from fusion.aten.capture import decomposition_table
from fusion.common import fallback_reason
from fusion.compiler import (
    aot,
    attention,
    cast_views,
    combo_casts,
    copy_kernels,
    cudagraphs,
    depthwise,
    epilogue,
    gemm_passes,
    graph_passes,
    layout,
    lower_gathers,
    partition,
    passes,
    random_ops,
    registry,
    scatter_passes,
    sibling_casts,
    split_reductions,
    view_copies,
    wrapper_passes,
)
from fusion.compiler.generate import LESSON_PARTS, compile_graph
from fusion.compiler.report import GraphReport, PartReport, fallbacks_from
from fusion.kernels import c_runtime
from fusion.kernels.cudnn import GROUPED_REFUSAL, cudnn_epilogue_unavailable


@dataclass(frozen=True)
class Stage:
    name: str  # the first cell of its row in the README's table
    module: str  # the file that does it, relative to the project root
    hands_on: str  # what it hands the next stage


STAGES = [
    Stage("capture", "fusion/compiler/aot.py", "an aten fx.GraphModule with meta['val'] on every node"),
    Stage("passes", "fusion/compiler/driver.py", "the same graph, rewritten (PASSES); decisions in a PartReport"),
    Stage("regions", "fusion/regions.py", "list[Region] (Phase 6)"),
    Stage("lowering", "fusion/compiler/lowering.py", "the kernel IR: frozen records, no torch or fx object"),
    Stage("rendering", "fusion/kernels/triton_render.py", "Triton source (Phase 8's expressions) and launch facts"),
    Stage("partition", "fusion/compiler/partition.py", "a CompiledGraph: fx Python, one line per launch"),
    Stage("runtime", "fusion/kernels/triton_runtime.py", "a launch (Launcher); the boxed callable Dynamo runs"),
]

reports: list[GraphReport] = []  # one per graph compiled since reset()


def reset() -> None:
    """Forget every compiled graph: clear :data:`reports`, Dynamo's caches and its counters."""
    reports.clear()
    torch._dynamo.reset()
    counters.clear()


# ----------------------------------------------------------------------------------------------------------------------
# Graph passes: in run order; adding one is a function, an entry here and its test (its name is its option)

BN_EVAL = torch.ops.aten._native_batch_norm_legit_no_training.default


def decompose_kept(gm: fx.GraphModule, part: PartReport) -> None:
    """Decompose what was kept whole for a pass (a batch norm the fold refused): the full table, in place."""
    if any(n.target is BN_EVAL for n in gm.graph.nodes):
        aot.decompose_in_place(gm, decomposition_table())


def cudnn_epilogue(gm: fx.GraphModule, part: PartReport) -> None:
    """The pass ``epilogue``: conv + bias (+ residual) + ReLU as one cuDNN kernel, where cuDNN has one (CUDA)."""
    convs = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
    if not convs:
        return
    val = convs[0].meta["val"]
    why = cudnn_epilogue_unavailable(val.device.type, val.dtype)
    if why:
        part.note_pass("cudnn epilogue", [f"{len(convs)} convolution(s)"], "skipped", why)
    else:
        epilogue.install_epilogues(gm, GROUPED_REFUSAL, part.note_pass)


def depthwise_windows(gm: fx.GraphModule, part: PartReport) -> None:
    """The pass ``depthwise`` (``fusion.compiler.depthwise``), except on a CPU whose kernels C renders, unless
    ``options={"depthwise": True}`` asks: there aten's depthwise convolution beat the C window kernel (MobileNetV2
    and blocks of it, 2026-11-27: scripts/results/cpu-2026-11-27-windows-ir.log)."""
    convs = [n for n in gm.graph.nodes if depthwise.is_depthwise_conv(n)]
    opts = passes.current()
    asked = "depthwise" in getattr(opts, "explicit", ())
    if convs and convs[0].meta["val"].device.type == "cpu" and not asked:
        if (getattr(opts, "renderer", None) or c_runtime.chosen()) == "c":
            why = "on CPU aten's convolution beats the C window kernel (options={'depthwise': True} asks for it)"
            for n in convs:  # one note each, as the pass notes them: its own refusal first
                part.note_pass("depthwise conv", [n.name], "skipped", depthwise.refusal(n) or why)
            return
    depthwise.depthwise_as_window_sums(gm, part.note_pass)


noted, lesson = passes.noted, registry.lazy  # f(gm, note) as a pass run(gm, part); a lesson's function, looked up
PASSES = [
    passes.Pass("fold_bn", lesson("fold_bn"), kinds=("inference",), default=False,
                doc="Phase 9: fold eval-mode BatchNorm into the conv (opt-in: the freezing promise)"),
    passes.Pass("decompose", decompose_kept, doc="decompose what was kept whole for the fold"),
    passes.Pass("stack_scatters", noted(scatter_passes.stack_select_scatters),
                doc="a sum of select_scatters into zeros covering a dim: one cat (before constants folds the zeros)"),
    passes.Pass("index_put_sums", noted(scatter_passes.index_puts_as_sums), requires=("codegen",),  # before
                doc="an accumulating index_put into a small table: one masked sum (CUDA)"),  # "constants" folds its arange
    passes.Pass("cse", noted(graph_passes.eliminate_common_subexpressions), doc="the same op on the same inputs: once"),
    view_copies.BROADCAST_FULLS,  # before "constants": a fill folded is then one element held
    passes.Pass("constants", noted(graph_passes.fold_constants), doc="values computed from no input: at compile time"),
    layout.CHANNELS_LAST,  # CPU: oneDNN's convolutions read NHWC images; before the regions read the strides
    *view_copies.VIEW_COPY_PASSES,  # copies as views, cats and pointwise ops; before "reorder" moves them
    random_ops.RANDOM,  # before "reorder": an aten.rand pins what follows it; the seeded op is pure and sinks
    split_reductions.SPLIT_REDUCTIONS,  # before "reorder": the producers then meet the new view (CUDA only)
    passes.Pass("reinplace", noted(graph_passes.reinplace_buffer_updates), doc="BatchNorm statistics in place, as eager"),
    passes.Pass("bmm_as_mm", noted(gemm_passes.bmm_as_mm), doc="a bmm of a weight broadcast over the batch: one mm"),
    passes.Pass("gemm_heads", noted(gemm_passes.gemm_per_head), doc="a GEMM copied head-major: one GEMM per head"),
    passes.Pass("gemm_bias", noted(gemm_passes.bias_after_gemm), requires=("codegen",),
                doc="a CPU addmm read by pointwise ops: mm, its bias added in the kernel after it"),
    cast_views.CAST_VIEWS,  # before "reorder", which puts the cast next to its input
    passes.Pass("reorder", noted(graph_passes.reorder_for_locality), doc="each op just before its first user: runs meet"),
    passes.Pass("raise_reductions", noted(graph_passes.reductions_to_their_inputs),
                doc="a reduction just after the op computing its input (a bias gradient past its GEMMs)"),
    sibling_casts.SIBLING_CASTS,  # after "reorder" and "raise_reductions", which place what it moves beside
    passes.Pass("epilogue", cudnn_epilogue, kinds=("inference",), doc="conv+bias(+add)+ReLU in cuDNN (CUDA)"),
    passes.Pass("conv_bias", noted(epilogue.split_conv_bias), kinds=("inference",),
                doc="a conv's bias as a pointwise add the next region takes", requires=("codegen",)),
    passes.Pass("depthwise", depthwise_windows, kinds=("inference",), requires=("codegen",),
                unless=("cudagraphs",),  # replayed, a launch costs no CPU: cuDNN's faster kernel wins (measured)
                doc="a depthwise conv (<= 5x5) as a window sum in the generated kernel around it: fewer launches"),
    passes.Pass("conv1x1", noted(gemm_passes.conv1x1_backward_as_mm), doc="a 1x1 conv's backward (NHWC): two mm"),
    passes.Pass("conv1x1_forward", noted(gemm_passes.conv1x1_forward_as_mm), default=False,
                doc="a 1x1 conv's forward as one mm (opt-in: measured slower in whole models)"),
    lower_gathers.INLINE_GATHERS,  # marks (a GPU without CUDA graphs); the lowering reads the marks
    copy_kernels.COPY_KERNELS,  # marks; code generation reads the marks (generate.compile_graph, partition)
    combo_casts.COMBO_CASTS,  # after its readers' rewrites (GEMMs, convs); its nodes at the top and the end (CUDA)
    passes.Pass("overlap", noted(lesson("overlap_pass")), default=False,
                doc="Phase 10: collectives started early, waited late, hidden behind whole regions"),
    *attention.CAPTURE_PASSES,  # stage "capture": Dynamo's graph, before AOTAutograd
    *wrapper_passes.WRAPPER_PASSES,  # stage "wrapper": the graph around the kernels (compiler/partition.py)
]  # fmt: skip


class Options(passes.Options):
    """``torch.compile(model, backend="fusion", options={...})``: a switch per pass of :data:`PASSES`, and
    ``codegen`` (regions -> generated kernels; False runs the aten graph as it is), ``cudagraphs`` (off by default:
    inference graphs replayed as CUDA graphs) and ``renderer`` of CPU kernels ("c" or "triton": ``c_runtime``)."""

    @classmethod
    def parse(cls, options: dict | None) -> Options:
        return cls(PASSES, options)


# ----------------------------------------------------------------------------------------------------------------------
# Code generation: regions, lowering, rendering, partition (fusion.compiler.generate), then the runtime's wrapper


def generate(gm: fx.GraphModule, part: PartReport, opts: Options):
    """The runner of one rewritten aten graph: :func:`kernels`, replayed as one CUDA graph under
    ``options={"cudagraphs": True}``."""
    run = kernels(gm, part, opts)
    if opts.cudagraphs:
        run = cudagraphs.maybe_wrap(run, gm, part.kind, part.note_pass)
    return run


def kernels(gm: fx.GraphModule, part: PartReport, opts: Options):
    """``compile_graph`` (``fusion.compiler.generate``) on the rewritten graph, or the aten graph itself with the
    reason why not."""
    part.count_folds(gm)
    why = ""
    if not opts.codegen:
        why = "options={'codegen': False}"
    elif aot.has_dynamic_shapes(gm):
        why = "dynamic shapes: generated kernels are specialised to static sizes (torch.compile(dynamic=False))"
    else:
        try:
            for name in LESSON_PARTS:  # a lesson not imported: one reason naming its import
                registry.get(name)
        except registry.NotRegistered as e:
            why = str(e)
        else:
            try:
                compiled = opts.in_renderer(compile_graph, gm, aot.input_values(gm))  # options={"renderer": "c"}
            except Exception as e:  # never a crash for a user; raised in tests and practice workspaces
                why = "code generation failed: " + fallback_reason(e, "code generation")
            else:
                part.regions = compiled.regions
                part.kernels = list(compiled.kernels)
                part.fallbacks += fallbacks_from(compiled.report)
                part.count_library_calls(gm, part.kernels)
                part.graph = compiled
                compiled.check_inputs = False  # Dynamo's guards pin every input's shape and strides already
                part.note_prims(compiled.graph_module.meta.get("prims_to_aten", []))
                return compiled.runner()
    part.compiled = False
    part.fallback("the whole graph", why)
    part.count_library_calls(gm, [])
    part.note_prims(partition.prims_to_aten(gm))
    return gm.forward


# ----------------------------------------------------------------------------------------------------------------------
# The backend Dynamo calls


def fusion_backend(gm: fx.GraphModule, example_inputs: list[torch.Tensor], options: dict | None = None):
    """Dynamo's graph in, a callable out: Phase 9's ``lower``, or Dynamo's graph itself when that fails (with the
    reason). In tests and practice workspaces a failure is raised instead, naming where it came from."""
    opts = Options.parse(options)
    ops = sum(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes)
    entry = GraphReport(len(reports), str(gm.meta.get("dynamo_compile_id", "?")), ops)
    reports.append(entry)
    try:
        with opts.active():  # the capture passes (inside Phase 9's lower) read the options of this compile
            return registry.get("lower")(gm, example_inputs, entry, opts)
    except Exception as e:
        entry.error = fallback_reason(e, "the fusion backend")
        return gm.forward


def register_backend(name: str = "fusion") -> None:
    """``torch.compile(..., backend=name)`` calls :func:`fusion_backend` (once per process; Phase 9 calls this)."""
    aot.register_once(name, fusion_backend)
