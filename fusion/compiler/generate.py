"""Code generation, the compiler's middle: Phase 6's regions -> the kernel IR -> Triton source -> one launch each.

    aten graph ──regions (Phase 6)──▶ Region ──lowering──▶ kernel_ir.Kernel ──triton_render──▶ KernelPlan ──partition──▶ graph

* :func:`generate_kernel` — one region: its checks (static shapes, ops with a rule, one walk its outputs share, the
  GPU's coalescing rule for reductions over leading dims: ``fusion.kernels.rows``), its kernel IR (the device-neutral
  lowering, ``fusion.compiler.lowering``), its Triton source (``fusion.kernels.triton_render`` with Phase 8's
  ``triton_expr`` and ``split_index``: what the learner writes), its name and launch facts: a
  :class:`~fusion.ir.plan.KernelPlan`, or :class:`~fusion.ir.plan.Unsupported` naming the node it cannot take.
  C renders the same IR for CPU tensors at the kernel's first call (``fusion.kernels.c_runtime``).
* :func:`compile_graph` — a graph: Phase 6's regions, one kernel each; a refused region is cut at the node it
  refused (that op runs as one aten call, the reason in the report) and the pieces around it are generated
  (``fusion.compiler.partition``); then the graph with one call per kernel.
* :func:`compile_regions` — a module: ``capture_aten`` then :func:`compile_graph`.

What the learner writes comes through :mod:`fusion.compiler.registry`; nothing here imports a lesson.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.fx as fx

from fusion.aten.capture import aten_inputs, capture_aten
from fusion.aten.nodes import unique_regions
from fusion.compiler import registry
from fusion.compiler.compiled import CompiledGraph, CompiledModel
from fusion.compiler.lone_kernels import lone_kernel_regions
from fusion.compiler.lower_reductions import REDUCTIONS
from fusion.compiler.lower_windows import c_refusal
from fusion.compiler.lowering import Lowering
from fusion.compiler.partition import Worklist, ensure_meta
from fusion.ir.plan import GeneratedKernel, KernelPlan, Region
from fusion.kernels import c_runtime, row_splits
from fusion.kernels import rows as krows
from fusion.kernels import triton_lang as tlang
from fusion.kernels.triton_launch import MAX_RBLOCK
from fusion.kernels.triton_render import render

LESSON_PARTS = ("build_fusion_regions", "triton_expr", "split_index")  # what code generation asks the lessons for


def check(region: Region) -> list[fx.Node]:
    """The members the kernel stores, after the checks every target shares, or :class:`~fusion.ir.plan.Unsupported`
    (:class:`~fusion.ir.plan.SplitRegion` where two kernels would do)."""
    stored = krows.stored_members(region)  # an escaping view: its member is stored, the view rebuilt after
    krows.check_region(region, stored, REDUCTIONS)  # static shapes, one device, ops with a rule
    reductions = [n for n in region.nodes if n.op == "call_function" and n.target in REDUCTIONS]
    if reductions:
        if split := row_splits.split_by_reductions(region, reductions, stored):
            raise split  # reductions walking different rows (a row's and a column's): one kernel each
        # refuses rows a GPU reads uncoalesced, and (unless C runs the kernel) too few long rows to fill a GPU
        krows.Rows.of(reductions, stored, MAX_RBLOCK, True, region.members, fill_gpu=not c_runtime.runs_as_c(region))
        return stored
    try:
        torch.broadcast_shapes(*(tuple(n.meta["val"].shape) for n in stored))
    except RuntimeError as e:
        raise row_splits.split_by_shape(region, stored) from e
    if c_runtime.runs_as_c(region) and (split := row_splits.split_repeated_tables(region, stored)):
        raise split  # a C loop would compute a small sin/exp table again for every element it is broadcast to
    return stored


def generate_kernel(region: Region) -> KernelPlan:
    """One region -> its :class:`~fusion.ir.plan.KernelPlan` (kernel IR, Triton source, launch facts), or
    :class:`~fusion.ir.plan.Unsupported` with the reason (see the module's docstring)."""
    stored = check(region)
    if (refused := c_refusal(region)) is not None:  # a max-pool on a CPU whose kernels C renders: aten's is faster
        raise refused
    lowering = Lowering(region, stored)
    kernel = lowering.kernel(tlang.UNNAMED)
    draft, launch = render(kernel, registry.get("triton_expr"), registry.get("split_index"))
    name, source = tlang.kernel_name(region, launch, draft)
    kernel = dataclasses.replace(kernel, name=name)
    code = GeneratedKernel(name, source, region, kernel.kind, list(kernel.ops))
    inputs = lowering.inputs
    meta = [(tuple(n.meta["val"].shape), tuple(n.meta["val"].stride()), n.meta["val"].dtype) for n in inputs]
    outputs = region.external_outputs
    if launch.rblock:  # rows by lanes: a reduction, or a transposed pointwise walk
        return KernelPlan(code, inputs, meta, stored, outputs, launch.numel, {"RBLOCK": launch.rblock},
                          launch.num_warps, min_xblock=launch.min_xblock, ir=kernel, elements=launch.elements)  # fmt: skip
    return KernelPlan(code, inputs, meta, stored, outputs, 0, {}, launch.num_warps, launch.numel, launch.xblock,
                      ir=kernel)  # fmt: skip


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledGraph:
    """One generated kernel per fusion region of an aten graph (``meta["val"]`` on its nodes: capture_aten or AOT);
    the rest stays aten calls. Called like ``gm``; has ``.kernels``, ``.report``, ``.num_kernels``,
    ``.library_calls``. A region with an op no rule takes is cut there (an aten call, its reason in the report)."""
    ensure_meta(gm, example_inputs)
    regions = unique_regions(registry.get("build_fusion_regions")(gm))  # Phase 6's regions, built once
    work = Worklist(gm, [*regions, *lone_kernel_regions(gm, regions)])  # and the lone ops passes marked
    for region in work:
        try:
            work.done(generate_kernel(region))
        except Exception as e:  # an op without a rule: cut the region there (Unsupported names the node)
            work.refuse(region, e)
    return work.compiled()  # fusion.compiler.partition: the graph with one call per kernel


def compile_regions(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor]) -> CompiledModel:
    """capture_aten + compile_graph: a module computing ``model(*inputs)`` for inputs of the example shapes."""
    return CompiledModel(model, compile_graph(capture_aten(model, example_inputs), aten_inputs(model, example_inputs)))


def generated_sources(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> list[GeneratedKernel]:
    """The kernels of every region, generated but not loaded: this works without Triton installed."""
    regions = unique_regions(registry.get("build_fusion_regions")(capture_aten(model, inputs)))
    return [generate_kernel(r).kernel for r in regions]
