"""Phase 8 — code generation: every fusion region becomes one generated kernel.

Run it:   uv run python -m fusion.codegen          (``--quick`` for the small version CI runs)
Test it:  uv run pytest -m phase8

What you learn
--------------
* Phase 6 found the regions; here each one becomes **one kernel launch**: external inputs loaded once, every op one
  line on registers, every member someone outside needs stored: intermediates never touch DRAM.
* **The IR, not the language, is the compiler.** A region is first *lowered* to a kernel IR of plain records
  (``fusion.ir.kernel_ir``: buffers with sizes, strides and dtypes; loops; index expressions; loads, ops,
  reductions, stores; no torch object), the way Inductor lowers to its loop-level IR and tinygrad to UOps. Every
  numerical decision is made there, once, for every target: half and bfloat16 computed in float32 and rounded where
  eager rounds, an operand converted to the op's dtype first, sums from +0.0, an integer exponent as products. Then
  a *renderer* spells the IR in one language: Triton for GPUs (``fusion.kernels.triton_render``), C for CPUs
  (``fusion.kernels.c_render``). A second target is one more renderer; nothing above it changes.
* **You write the Triton renderer's language**: :func:`triton_expr`, the Triton spelling of each IR op (the special
  values are the job: ``maximum(nan, 0)`` is nan, tanh keeps its digits near 0, a float32 division rounds as IEEE
  does), and :func:`split_index`, how a flat index becomes one index per loop. The compiler hands both to the
  renderer (``fusion.compiler.generate``); the C renderer's table is machinery, written the same way.
* **Indexing is the whole trick.** A pointwise kernel walks the output's elements by a *flat index*
  ``xindex = program_id * XBLOCK + arange(XBLOCK)``, splits it into one index per loop with ``//`` and ``%``
  (``x1 = xindex // 64``, ``x0 = xindex % 64``) and loads every tensor at ``sum(index_d * stride_d)``. Broadcasting
  is free: a size-1 (or missing) dimension contributes nothing. Views, a *mask* ``xindex < numel`` for the last
  block's tail, a ``cat`` (each input loaded at its shifted index under its own mask, a ``tl.where`` picks): all
  index arithmetic, done exactly in the IR (``(60*x0 + x1) // 10`` cancels where the loop ranges prove it). An
  embedding or a gathered bias is one load whose index is partly a *value* (``table[id * 16 + x0]``, the id checked
  to lie in its range): no kernel of its own, a load inside the kernel that reads it. The walk
  follows the first output's memory order (channels_last: C fastest), so neighbouring lanes touch neighbouring
  addresses. In Triton's CPU interpreter every load and store is checked to stay inside its tensor
  (``fusion.kernels.interp_check``): a wrong index is an error naming the kernel's line, never a silent read.
* **Reductions** (softmax, LayerNorm, a bias gradient's ``sum([0, 1])``): a program takes ``XBLOCK`` rows by
  ``RBLOCK`` lanes, reduces along axis 1 and does the pointwise work before and after in the same kernel. A row
  longer than one block is walked in a loop over blocks (a *looped* reduction): softmax reads its row three times,
  still one kernel. Over leading dims the kept dims are the rows, each dim loaded at its real strides.
* What the generator cannot do (an op no rule takes, a reduction over dims too few rows share to read coalesced) is
  cut out the way Phase 6 cuts a span: that op runs as one aten call, with the reason in the report, and the pieces
  around it still become kernels. Never a crash, never a wrong answer.

Anchors: early TorchInductor's ``codegen/triton.py``, Inductor's ``ops`` handler (``TritonOverrides`` /
``CppOverrides``: one table per language), tinygrad's ``code_for_op``, Triton's tutorials.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fusion import models
from fusion.common import heading, lesson_cli
from fusion.compiler import registry
from fusion.compiler.generate import compile_graph, compile_regions, generate_kernel, generated_sources
from fusion.compiler.lowering import lower_region
from fusion.ir.plan import GeneratedKernel, Unsupported
from fusion.kernels import timing
from fusion.kernels import triton_demo as demo
from fusion.kernels import triton_runtime as rt
from fusion.kernels.triton_launch import MAX_RBLOCK
from fusion.kernels.triton_render import tanh
from fusion.regions import build_fusion_regions

__all__ = ["triton_expr", "split_index", "compile_graph", "compile_regions", "generate_kernel", "generated_sources",
           "GeneratedKernel", "MAX_RBLOCK", "run"]  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# 1. One IR op → one Triton expression

NAN_WINS = "tl.where({0} != {0}, {0}, tl.where({0} {1} {2}, {0}, {2}))"  # maximum with ">", minimum with "<"


def triton_expr(op: str, args: list[str], dtype: str) -> str:
    """The Triton expression computing one kernel-IR op (``fusion.ir.kernel_ir.OPS``; the renderer asks for those of
    ``fusion.kernels.triton_render.LESSON_OPS``) from its operands: names of values or literals, each already of
    the op's ``dtype`` ("float32", "int64", "bool", …) except ``where``'s condition (bool) and ``pow``'s exponent.

    >>> triton_expr("mul", ["t0", "t1"], "float32")
    '(t0 * t1)'
    """
    # TODO(human): return the Triton expression of each IR op of LESSON_OPS giving torch's result, special values included: identity; unary math neg, abs, exp, log, sqrt, rsqrt, erf, sin, cos, sigmoid, reciprocal; tanh to its relative accuracy near 0 (tanh(1e-6 * x) * 1e6 is x to 1e-5); relu and maximum/minimum with NaN propagating (maximum(nan, 0) is nan, relu(nan) is nan); add, sub, mul, truediv and reciprocal (Triton's /: on a GPU within 2 ulp of eager's, as Inductor's; a mean, which must give n equal values back exactly, is the machinery's exact_div); comparisons eq ne lt le gt ge; logical_not; and/or of bools as logical and/or (not + and *: Triton's int1 arithmetic wraps, 1 + 1 = 0); bitwise_and/bitwise_or (bool and integers: & and | of each bit); where(cond, a, b); pow(x, e) for a non-integer e as torch: nan for a negative finite x, (-inf)**e is inf for e > 0 and 0 for e < 0; raise Unsupported(reason) for any other op. Hint: a dict from op name to a format string like '({0} + {1})' covers most ops; tanh, maximum/minimum, and/or and pow need code. More: test a != a for NaN first; sigmoid is 1/(1+exp(-x)) (tl.sigmoid is a @jit helper the interpreter cannot call); tanh(x, dtype) is imported above (the series near 0); and/or are & and | (of the int1 values, or of their .to(tl.int32) then != 0); pow is exp(e*log(x)) with a tl.where for x == -inf (log(-inf) is nan); each operand is a name (the renderer binds every result to one of its own: t5 = <your expression>)
    # BEGIN SOLUTION
    a = args
    table = {
        "identity": "{0}", "neg": "(-{0})", "abs": "tl.abs({0})", "exp": "tl.exp({0})", "log": "tl.log({0})",
        "sqrt": "tl.sqrt({0})", "rsqrt": "tl.rsqrt({0})", "erf": "tl.erf({0})", "sin": "tl.sin({0})",
        "cos": "tl.cos({0})", "sigmoid": "(1.0 / (1.0 + tl.exp(-{0})))", "reciprocal": "(1.0 / {0})",
        "relu": "tl.where({0} < 0, 0, {0})",  # NaN < 0 is false: NaN stays
        "logical_not": "({0} == 0)", "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
        "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})",
        "ge": "({0} >= {1})", "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})",
        "where": "tl.where({0}, {1}, {2})",
    }  # fmt: skip
    if op in ("maximum", "minimum"):
        return NAN_WINS.format(a[0], ">" if op == "maximum" else "<", a[1])
    if op == "tanh":
        return tanh(a[0], dtype)
    if op in ("and", "or"):  # on bools: int1 arithmetic wraps (1 + 1 = 0), so compute on int32
        return f"(({a[0]}.to(tl.int32) {'&' if op == 'and' else '|'} {a[1]}.to(tl.int32)) != 0)"
    if op == "pow":  # a non-integer exponent (integer ones are products in the IR); log(x < 0) is nan, as torch
        x, e = a
        return f'tl.where({x} == float("-inf"), tl.where({e} < 0, 0.0, float("inf")), tl.exp(tl.log({x}) * {e}))'
    if op in table:
        return table[op].format(*a)
    raise Unsupported(f"no Triton expression for the IR op {op!r}")
    # END SOLUTION


# ----------------------------------------------------------------------------------------------------------------------
# 2. Indexing: a flat index → one index per loop (the IR's loads add them up at each tensor's strides)


def split_index(flat: str, shape: Sequence[int], prefix: str = "x") -> list[tuple[str, str]]:
    """Name and expression of each dimension's index, from a flat index over a contiguous ``shape``.

    Innermost dimension first gets ``x0``; a size-1 dimension has no variable (its index is always 0).

    >>> split_index("xindex", (8, 1, 64))
    [('x1', 'xindex // 64'), ('0', '0'), ('x0', 'xindex % 64')]
    """
    # TODO(human): split the flat index into one index per dimension of the contiguous shape and return them outermost first, as (name, expr): named prefix0, prefix1, … from the innermost; the innermost is flat % size, each outer one (flat // inner) % size where inner is the product of the sizes inside it; the outermost dimension (the first of size > 1) needs no % (the mask keeps the flat index in range); a size-1 dim is ('0', '0'). Hint: walk the dimensions from the last to the first, keeping the product of the sizes seen so far. More: the Triton renderer writes 'x1 = <expr>' for each loop, so expr is any Python/Triton integer expression of flat; collect innermost first and reverse at the end; a wrong index is caught as an access outside its tensor (fusion.kernels.interp_check) or a wrong element
    # BEGIN SOLUTION
    out: list[tuple[str, str]] = []
    inner, k = 1, 0
    outermost = next((d for d, s in enumerate(shape) if s != 1), len(shape))
    for d in range(len(shape) - 1, -1, -1):
        size = shape[d]
        if size == 1:
            out.append(("0", "0"))
            continue
        expr = flat if inner == 1 else f"{flat} // {inner}"
        if d != outermost:
            expr = f"({expr}) % {size}" if inner != 1 else f"{expr} % {size}"
        out.append((f"{prefix}{k}", expr))
        inner, k = inner * size, k + 1
    return out[::-1]
    # END SOLUTION


# ----------------------------------------------------------------------------------------------------------------------
# The lesson


def run(quick: bool = False) -> None:
    heading("Phase 8 — code generation: every fusion region becomes one generated kernel")
    runs, why = rt.triton_status()
    device = "cuda" if torch.cuda.is_available() and runs else "cpu"
    print(why + (". Interpreter runs check correctness only: no timings are shown." if device == "cpu" else "."))
    heading("A region and the kernel generated for it", "-")
    chain = generated_sources(models.ElementwiseChain(), models.elementwise_inputs(batch=8, d=64))[0]
    demo.show_region(chain)
    heading("Its kernel IR, and the same IR rendered as C: one lowering, two renderers", "-")
    chain_ir = lower_region(chain.region, name=chain.name)  # the device-neutral lowering's record
    demo.show_c(chain, chain_ir)
    heading("Indexing: flat index, // and %, broadcast and strides, the mask", "-")
    demo.show_indexing(split_index, chain_ir)  # what split_index gives, and where the IR's loads read
    heading("Reductions: softmax and LayerNorm + GELU + residual, one kernel each", "-")
    (soft,) = generated_sources(models.ScaledSoftmax(), models.norm_inputs())
    print(f"softmax(x * 0.125): {soft.name}, ops {' → '.join(n.name for n in soft.region.nodes)}")
    (norm,) = generated_sources(models.NormGELUResidual(), models.norm_inputs())
    print(f"x + gelu(layer_norm(x)): one kernel, XBLOCK rows per program:\n\n{norm.source}")
    demo.show_looped(generated_sources(models.ScaledSoftmax(), (torch.randn(128, MAX_RBLOCK + 1),))[0], MAX_RBLOCK)
    if not runs:
        print(f"These kernels cannot run here: {why}.")
        return
    heading("What falls back, and why: the region is cut at the op, the pieces around it still fuse", "-")
    demo.show_fallbacks(compile_graph)
    heading("The course's models: generated kernels vs eager", "-")
    demo.models_table(compile_regions, build_fusion_regions, device, quick)
    if device == "cuda":
        timing.gpu_numbers([(*case, compile_regions(*case[1:])) for case in timing.gpu_cases(quick)])


def main(argv: list[str] | None = None) -> int:
    return lesson_cli(run, __doc__, argv)


# What you wrote, handed to the Triton renderer (fusion/compiler/generate.py looks them up in the registry)
registry.register(8, triton_expr=triton_expr, split_index=split_index)
if __name__ == "__main__":
    raise SystemExit(main())
