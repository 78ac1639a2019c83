"""Machinery behind Phase 8's lesson (``fusion.codegen.run``): the printing and the demo models a learner need not
read. The lesson passes its functions in, so this file never imports ``fusion.codegen``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.kernels.triton_runtime import GeneratedKernel


def show_region(kernel: GeneratedKernel) -> None:
    """The region's aten ops, then the kernel generated for them."""
    print(f"The region's aten ops (the {len(kernel.region.nodes)} nodes Phase 6 grouped):")
    for n in kernel.region.nodes:
        print(f"    {n.name} = {n.target}({', '.join(a.name if isinstance(a, fx.Node) else repr(a) for a in n.args)})")
    print(f"\n...become one Triton kernel, {kernel.name} (rendered from the kernel IR below, with your triton_expr and "
          "split_index):\n")  # fmt: skip
    print(kernel.source)


def show_c(kernel: GeneratedKernel, ir) -> None:
    """The same region lowered to the pure-data kernel IR (``ir``: ``fusion.compiler.lowering.lower_region``'s
    record), then rendered as C: a second renderer of one IR."""
    from fusion.kernels import c_render

    print(
        "Lowered to the kernel IR (frozen records: buffers, index expressions, loads, ops, stores; no torch object):\n"
    )
    print(ir.describe())
    source = c_render.render(ir)
    print("\n...and rendered as C (what the backend compiles for CPU tensors; helpers above it left out):\n")
    print(source[source.index(f"void {kernel.name}(") :])
    if "#pragma omp parallel" not in source:
        print(f"(A kernel of {c_render.PARALLEL_MIN:,} elements or more shares its loop out over the threads with "
              "`#pragma omp parallel for`; this one is smaller, so it has no parallel region: one thread.)\n")  # fmt: skip
    print("The Triton text above and this C come from one region: the IR, not the language, is the compiler.")


def show_looped(kernel: GeneratedKernel, max_rblock: int) -> None:
    """A softmax over rows longer than one block: its looped kernel, the loops shown."""
    print(f"softmax over rows of {max_rblock + 1} (> MAX_RBLOCK): a loop per reduction, one more for the stores:\n")
    print("def triton" + kernel.source.split("@triton.jit\ndef triton")[1])


def show_indexing(split_index: Callable, kernel_ir) -> None:
    """What the lesson's ``split_index`` gives for an (8, 64) walk, and where the IR's loads read each tensor."""
    print("An (8, 64) output is walked by one flat index; each loop's index is cut out of it:\n"
          + "\n".join(f"    {var} = {expr}" for var, expr in split_index("xindex", (8, 64))))  # fmt: skip
    print(
        "\nThe lowering adds the indices up at each tensor's strides (exact integer algebra: a reshape's // and % "
        "cancel where the loop ranges prove it). The chain's loads:"
    )
    from fusion.ir import kernel_ir as ir

    for s in kernel_ir.statements():
        if isinstance(s, ir.Load):
            buf = next(b for b in kernel_ir.buffers if b.name == s.buffer)
            print(f"    {s.buffer} {buf.sizes} strides {buf.strides}: at {ir.index_text(s.offset)}")
    print(
        "A (64,) parameter broadcast over the rows is read at the inner index alone: broadcasting is index arithmetic, nothing is "
        "copied. 1000 elements, XBLOCK=1024: the mask xindex < 1000 switches off the last 24 lanes."
    )


class Fallbacks(torch.nn.Module):
    """Regions the generator cannot compile whole: an op with no Triton line (digamma: the region is cut there and the
    pieces around it still become kernels), a reduction over dim 0."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.relu(x * 2.0 + 1.0)
        b = torch.digamma(torch.mm(a, a.t())) * 2.0
        c = torch.relu(torch.digamma(torch.relu(x * 2.0)) * 3.0) + 1.0
        d = torch.mm(b, x).sum(0) * 3.0
        return a, b, c, d


def show_fallbacks(compile_graph: Callable) -> None:
    from fusion.aten.capture import capture_aten

    x = torch.randn(4, 6)
    print(compile_graph(capture_aten(Fallbacks(), (x,)), [x]).report.table())


def models_table(compile_regions: Callable, regions_of: Callable, device: str, quick: bool) -> None:
    """The course's models, compiled: kernels before and after, library calls, fallbacks, the error vs eager.
    ``regions_of`` is Phase 6's ``build_fusion_regions``."""
    from fusion import models
    from fusion.aten.capture import capture_aten
    from fusion.aten.nodes import kernel_counts
    from fusion.common import max_abs_diff, table

    rows: list = []
    for title, m, inp in (
        ("ElementwiseChain", models.ElementwiseChain(), models.elementwise_inputs()),
        ("TinyNet", models.TinyNet(), models.tiny_inputs()),
        ("MLP", models.MLP(), models.mlp_inputs()),
        ("TransformerMLP", models.TransformerMLP(), models.transformer_inputs()),
        ("ConvBNNet (eval)", models.ConvBNNet().eval(), models.conv_inputs(size=8 if quick else 16)),
        ("NormGELUResidual", models.NormGELUResidual(), models.norm_inputs()),
        ("ScaledSoftmax fp16", models.ScaledSoftmax(), tuple(t.half() for t in models.norm_inputs())),
    ):
        m, inp = m.to(device), tuple(t.to(device) for t in inp)
        compiled, gm = compile_regions(m, inp), capture_aten(m, inp)
        with torch.no_grad():
            diff = max_abs_diff(compiled(*inp), m(*inp))
        unfused = kernel_counts(gm, regions_of(gm))[0]
        skipped = len(compiled.report.skipped)
        rows.append((title, unfused, compiled.num_kernels, compiled.library_calls, skipped, f"{diff:.1e}"))
    print(table(rows, ["model", "kernels unfused", "generated", "library calls", "fallbacks", "max |Δ| vs eager"]))
    print("generated = one launch per region; library calls = matmul/conv/other aten ops (and fallback regions).")
