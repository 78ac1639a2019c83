"""Phase 9 — your compiler: ``torch.compile(model, backend="fusion")`` on models symbolic_trace cannot trace.

Run it:   uv run python -m fusion.backend          (``--quick`` for the small version CI runs)
Test it:  uv run pytest -m phase9

What you learn
--------------
* ``symbolic_trace`` stops at data-dependent control flow and at most of torch's own modules. **TorchDynamo**
  captures graphs from any Python by reading its bytecode: where it cannot continue (``if h.sum() > 0``) it breaks
  the program into several graphs and runs the Python in between itself. Each graph goes to the *backend*, a
  function ``(gm, example_inputs) -> callable``; ``import fusion.backend`` registers ours as ``"fusion"``.
* Dynamo's graphs are torch-level (``torch.conv2d``, ``torch._C._nn.linear``, parameters as inputs).
  **AOTAutograd** lowers them to aten graphs on fake tensors with Inductor's decompositions — Phase 6's graphs —
  and, when gradients are needed, splits forward from backward: one compiler call per aten graph.
* Then the course's own passes, in the order a real compiler runs them:
  1. **fold eval-mode BatchNorm into the convolution before it** (Phase 5's algebra, now on aten nodes);
  2. **conv + bias (+ residual) + ReLU → one cuDNN epilogue kernel** on CUDA (Phase 4's measurement);
  3. **regions → generated Triton kernels** (Phases 6 and 8); matmul, conv and the rest stay library calls.
* You write the fold, the per-graph compiler and the lowering below. The pipeline around them is
  :mod:`fusion.compiler.driver`: its stages in order, ``PASSES`` (each pass's name is its option), ``Options``,
  code generation and ``fusion_backend``, the function Dynamo calls. The end of this file hands your functions to
  it through :mod:`fusion.compiler.registry`, as Phase 8 hands it ``compile_graph``.
* Legality of the fold: it bakes parameter *values* into new weights, yet parameters are graph inputs that may
  change. So the fold is **opt-in**, like Inductor's ``freezing``: ``options={"fold_bn": True}`` (inference graphs
  only) refolds when a source's version counter or address moves, and promises no write through ``p.data``, which
  moves neither. By default BatchNorm stays an affine map the next generated kernel takes: always right.
* What a call runs: the fx graph's generated Python (``print(gm.code)``), one line per library call or kernel
  launch, each launch a light :class:`~fusion.kernels.triton_runtime.Launcher` (Triton's compiled launcher after
  the first call, not its JIT dispatch). ``options={"cudagraphs": True}`` (off by default) records each inference
  graph once and replays it as one CUDA graph: see :mod:`fusion.compiler.cudagraphs` for what that promises.
* ``fusion.backend.reports`` says what became of every graph: regions, generated kernels, library calls,
  fallbacks with their reasons; :func:`summary` adds the graph breaks. To see what Dynamo captured yourself:
  ``torch._dynamo.explain(fn)(*inputs)``, or ``TORCH_LOGS=graph_breaks,graph_code,aot_graphs`` before running.

    >>> import torch
    >>> from fusion import backend
    >>> backend.reset()
    >>> f = torch.compile(lambda x: torch.relu(x * 2.0 + 1.0), backend="fusion")
    >>> f(torch.ones(3)).tolist(), len(backend.reports), backend.reports[0].kernels[0].name.split("_")[:4]
    ([3.0, 3.0, 3.0], 1, ['triton', 'poi', 'fused', 'add'])
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn as nn

import fusion.codegen  # noqa: F401  (Phase 8: importing it registers compile_graph, which the driver calls)
from fusion import models
from fusion.aten.capture import decomposition_table
from fusion.bench.accuracy import acceptable, float64_of, relative_error
from fusion.common import heading, lesson_cli, max_abs_diff, table
from fusion.compiler import aot, driver, fold_weights, registry
from fusion.compiler.driver import PASSES, Options, reports, reset  # noqa: F401  (the pipeline: fusion/compiler/)
from fusion.compiler.report import GraphReport, PartReport, summary
from fusion.conv_bn_fusion import fold_conv_bn_weights
from fusion.kernels.cublaslt import launched_kernels

aten = torch.ops.aten
BN_EVAL = driver.BN_EVAL  # aten._native_batch_norm_legit_no_training: eval-mode batch_norm, as AOTAutograd emits it


# ----------------------------------------------------------------------------------------------------------------------
# 1. Fold eval-mode BatchNorm into the convolution before it, on the aten graph


def find_conv_bn_folds(gm: fx.GraphModule) -> tuple[list[tuple[fx.Node, fx.Node, fx.Node]], list[tuple]]:
    """The ``(convolution, batch_norm, getitem 0)`` triples that can be folded, and ``(nodes, why)`` for the others.

    A triple folds when the BatchNorm is the eval-mode op (``BN_EVAL``), reads a ``aten.convolution`` whose only
    user it is, only its output ``[0]`` is used (not the saved statistics), and every tensor the fold reads (conv
    weight and bias, BN weight, bias, running mean and var) is a graph input: a parameter whose value the fold can
    read at run time, not something computed inside the graph.
    """
    folds, skipped = [], []
    # TODO(human): find every BN_EVAL node, check the docstring's rules for folding it into the convolution it reads, and return the legal (convolution, batch norm, getitem 0) triples, and ([conv name, bn name], why not) for each other one. Hint: the BN's args are (input, weight, bias, running_mean, running_var, momentum, eps) and a convolution's (x, w, b, stride, padding, dilation, transposed, output_padding, groups). More: test the rules one after the other and stop at the first that fails, so that each refusal carries one reason; a node's .target, .users and .op answer them (a graph input is a placeholder), and an absent bias is None, which needs no check
    # BEGIN SOLUTION
    for bn in gm.graph.nodes:
        if bn.op != "call_function" or bn.target is not BN_EVAL:
            continue
        conv = bn.args[0]
        names = [getattr(conv, "name", str(conv)), bn.name]
        if not isinstance(conv, fx.Node) or conv.target is not aten.convolution.default:
            skipped.append((names, "the batch norm does not read a convolution"))
            continue
        if len(conv.users) != 1:
            skipped.append((names, f"{conv.name}'s output has {len(conv.users)} users: they would see BN'd values"))
            continue
        outs = list(bn.users)
        if len(outs) != 1 or outs[0].target is not operator.getitem or outs[0].args[1] != 0:
            skipped.append((names, "the batch norm's saved statistics are used"))
            continue
        sources = [conv.args[1], conv.args[2], *bn.args[1:5]]
        computed = [s.name for s in sources if isinstance(s, fx.Node) and s.op != "placeholder"]
        if computed:
            skipped.append((names, f"{', '.join(computed)} computed in the graph: not a parameter to fold"))
            continue
        folds.append((conv, bn, outs[0]))
    # END SOLUTION
    return folds, skipped


def fold_batch_norm(gm: fx.GraphModule, part: PartReport) -> None:
    """The pass ``fold_bn``: every legal conv → eval-mode batch norm becomes one conv reading folded weights.

    The folded weight and bias are new graph inputs, computed from the live parameters at each call (cached while
    no source tensor changes): the function computing them goes to ``part.extra_inputs``.
    """
    # TODO(human): fold every legal conv+BN pair of the graph and hand on the folded weights; report every decision with part.note_pass: each refused pair with the action 'skipped' and its reason, each fold with the action 'folded' and the names of its convolution and batch norm. Hint: find_conv_bn_folds sorts the pairs for you, and fold_weights.install_folds does the rewrite of the graph. More: the folded weights become new inputs of the graph, computed from the live parameters at each call: read install_folds' docstring for what it returns (and when it returns nothing), and PartReport.extra_inputs for where such a function goes
    # BEGIN SOLUTION
    folds, skipped = find_conv_bn_folds(gm)
    for names, why in skipped:
        part.note_pass("fold batch norm", names, "skipped", why)
    for conv, bn, _ in folds:
        part.note_pass("fold batch norm", [conv.name, bn.name], "folded", "weights refreshed when params change")
    refresh = fold_weights.install_folds(gm, folds, fold_conv_bn_weights)
    if refresh is not None:
        part.extra_inputs.append(refresh)
    # END SOLUTION


# ----------------------------------------------------------------------------------------------------------------------
# 2. One aten graph: passes, then code generation. Both live in fusion/compiler/driver.py: PASSES (fold_bn above, then
# the machinery's rewrites, each switched by its name in options) and generate (Phase 8's compile_graph, CUDA graphs)


def compile_aten_graph(gm: fx.GraphModule, example_inputs, kind: str, entry: GraphReport, opts: Options):
    """AOTAutograd's compiler for one aten graph (``kind``: inference, forward or backward): a boxed callable."""
    part = PartReport(kind)
    entry.parts.append(part)
    # TODO(human): run the enabled passes on the aten graph, generate its kernels, and return a boxed callable that gives the runner the call's args followed by the extra inputs the passes asked for (the folded weights). Hint: opts.passes_for(kind) lists the passes to run, in order, each with run(gm, part); driver.generate turns the graph into its runner. More: each function in part.extra_inputs maps the call's args to a list of tensors, which the runner expects after the args, in list order; AOTAutograd calls a compiled graph with one list of args (the boxed convention): read aot.make_boxed
    # BEGIN SOLUTION
    for p in opts.passes_for(kind):
        p.run(gm, part)
    run = driver.generate(gm, part, opts)
    extra = list(part.extra_inputs)
    if not extra:
        return aot.make_boxed(run)
    return aot.make_boxed(lambda *args: run(*args, *(t for f in extra for t in f(args))))
    # END SOLUTION


# ----------------------------------------------------------------------------------------------------------------------
# 3. Dynamo's graph to aten graphs: what driver.fusion_backend, the function Dynamo calls, runs


def lower(gm: fx.GraphModule, example_inputs: list[torch.Tensor], entry: GraphReport, opts: Options):
    """AOTAutograd from Dynamo's graph to aten graphs, :func:`compile_aten_graph` for each; the callable Dynamo runs."""

    # TODO(human): lower the Dynamo graph through AOTAutograd with one compiler per aten graph kind (inference, forward, backward), decomposing with the one table Phases 6 and 8 capture with, which keeps BN_EVAL whole when opts.fold_bn is on. Hint: aot.lower_with_aot takes the three compilers and the decompositions; each compiler is compile_aten_graph with its kind, entry and opts fixed. More: AOTAutograd calls a compiler with (graph, example inputs) only, so each compiler must carry its kind and the rest with it (a small factory function, or functools.partial); decomposition_table's keep argument names the ops it leaves whole
    # BEGIN SOLUTION
    def compiler(kind: str):
        return lambda g, ex: compile_aten_graph(g, ex, kind, entry, opts)

    return aot.lower_with_aot(
        gm,
        example_inputs,
        inference_compiler=compiler("inference"),
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        decompositions=decomposition_table(keep=(BN_EVAL,) if opts.fold_bn else ()),
    )
    # END SOLUTION


# What you wrote, handed to the compiler (fusion/compiler/registry.py): PASSES runs fold_bn, fusion_backend runs lower
registry.register(9, fold_bn=fold_batch_norm, compile_aten_graph=compile_aten_graph, lower=lower)
driver.register_backend("fusion")  # torch.compile(..., backend="fusion") calls driver.fusion_backend


# ----------------------------------------------------------------------------------------------------------------------
# The lesson


def _device_and_dtype() -> tuple[str, torch.dtype]:
    return ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)


def _compare(
    title: str,
    model: nn.Module,
    inputs: tuple,
    *,
    inductor: bool,
    show_kernel: bool = False,
    options: dict | None = None,
) -> None:
    """Compile ``model`` with our backend (and Inductor), check the numbers, show what each did."""
    heading(title, "-")
    reset()
    ours = torch.compile(model, backend="fusion", options=options)
    with torch.no_grad():
        want, got = model(*inputs), ours(*inputs)
    diff, (_, verdict) = relative_error(got, want), acceptable(got, want, float64_of(model, inputs))
    print(f"backend='fusion': {verdict}")  # Inductor's accuracy rule (fusion.bench.accuracy), the one rule
    print(summary(reports))
    for r in reports:
        print(f"\n{r.table()}")
    mine = list(reports)
    if show_kernel and mine and mine[0].kernels:
        k = mine[0].kernels[0]
        print(f"\nOne generated kernel, {k.name} (Phase 8), as the backend compiled it:\n{k.source}")
    if not inductor:
        print("(--quick skips Inductor: compiling with it takes ~10 s per graph on a CPU; run without --quick)")
        return
    from torch._inductor import metrics

    torch._dynamo.reset()
    metrics.reset()
    theirs = torch.compile(model, backend="inductor")
    with torch.no_grad():
        diff_i = relative_error(theirs(*inputs), want)
    ours_kernels = sum(len(r.kernels) for r in mine)
    ours_library = sum(sum(p.library_calls.values()) for r in mine for p in r.parts)
    rows = [
        ("fusion", len(mine), ours_kernels, ours_library, f"{diff:.1e}"),
        ("inductor", "-", metrics.generated_kernel_count, "-", f"{diff_i:.1e}"),
    ]
    if want.is_cuda:
        from torch.utils.benchmark import Timer

        for row, fn in zip(rows, (ours, theirs), strict=True):
            with torch.no_grad():
                launches = len(launched_kernels(fn, *inputs))
                t = Timer("f(*x)", globals={"f": fn, "x": inputs}).blocked_autorange(min_run_time=0.5).median
            row += (launches, f"{t * 1e6:.1f}")
        with torch.no_grad():
            launches = len(launched_kernels(model, *inputs))
            t = Timer("f(*x)", globals={"f": model, "x": inputs}).blocked_autorange(min_run_time=0.5).median
        rows.append(("eager", "-", 0, "-", "0", launches, f"{t * 1e6:.1f}"))
        from fusion.kernels.timing import launch_us

        cost = launch_us([lch for r in mine for p in r.parts for lch in p.launchers()], lambda: ours(*inputs))
        print(f"CPU per generated-kernel launch: {cost['direct']:.1f} µs through Triton's compiled launcher, "
              f"{cost['jit']:.1f} µs through its JIT dispatch ({cost['kernels']} kernels)")  # fmt: skip
    headers = ["backend", "graphs", "generated kernels", "library calls", "rel. max |Δ|"]
    headers += ["CUDA kernels / call", "µs / call (wall)"] if want.is_cuda else []
    print(f"\n{table(rows, headers)}")
    if not want.is_cuda:
        print("(on a CPU Inductor generates C++/OpenMP loops, not Triton: its count is of those loops)")


def run(quick: bool = False) -> None:
    device, dtype = _device_and_dtype()
    heading('Phase 9 — your compiler: torch.compile(model, backend="fusion")')
    print(
        "Dynamo captures graphs from any Python (breaking where it must); AOTAutograd lowers each to aten with\n"
        "Inductor's decompositions; we fold BatchNorm, put conv+bias+ReLU into cuDNN's epilogue (CUDA), and\n"
        f"generate one Triton kernel per fusion region (Phase 8). Device: {device}"
        + (" (generated kernels run in Triton's interpreter: correctness only, no timings)" if device == "cpu" else "")
    )

    d = 32 if quick or device == "cpu" else 1024
    model = models.DataDependentBlock(d=d).to(device, dtype).eval()
    (x,) = models.data_dependent_inputs(batch=4 if device == "cpu" else 4096, d=d)
    x = x.to(device, dtype)
    heading("A graph break: data-dependent control flow", "-")
    explanation = torch._dynamo.explain(model)(x)
    print(f"torch._dynamo.explain: {explanation.graph_count} graphs, {explanation.graph_break_count} break(s):")
    for b in explanation.break_reasons:
        print(f"  {str(b.reason).splitlines()[0][:110]}")
    print("(Dynamo's words for: a Python `if` on a tensor's value; the second graph starts after the branch)")
    _compare(
        "DataDependentBlock: both graphs go through our backend", model, (x,), inductor=not quick, show_kernel=True
    )

    heading("nn.TransformerEncoderLayer (eval): symbolic_trace cannot trace it, Dynamo can", "-")
    d_model, batch, seq = (16, 2, 8) if quick or device == "cpu" else (1024, 32, 512)
    layer = nn.TransformerEncoderLayer(d_model, 2 if d_model < 64 else 16, 4 * d_model, dropout=0.0, batch_first=True)
    layer = layer.to(device, dtype).eval()
    src = torch.randn(batch, seq, d_model, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    reset()
    with torch.no_grad():
        torch.compile(layer, backend="fusion")(src)
    print(
        "Under no_grad the layer takes PyTorch's 'fast path': one opaque op, _transformer_encoder_layer_fwd,\n"
        f"that no compiler sees into (Inductor runs it as a fallback too):\n{summary(reports)}\n"
        "torch.backends.mha.set_fastpath_enabled(False) gives the compiler the layer's real ops:"
    )
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        _compare("TransformerEncoderLayer, fast path off", layer, (src,), inductor=not quick)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)

    width, batch, size = (8, 2, 8) if quick or device == "cpu" else (64, 32, 56)
    conv_net = models.ConvBNNet(width=width).to(device, dtype).eval()
    (img,) = models.conv_inputs(batch=batch, size=size)
    img = img.to(device, dtype)
    if device == "cuda":
        conv_net, img = conv_net.to(memory_format=torch.channels_last), img.to(memory_format=torch.channels_last)
    title = "ConvBNNet (eval), options={'fold_bn': True}: BatchNorm folded, conv+bias+ReLU in cuDNN's epilogue (CUDA)"
    _compare(title, conv_net, (img,), inductor=not quick, options={"fold_bn": True})

    heading("Where we agree with Inductor, and where it does more", "-")
    print(
        "Agree: Inductor's decompositions, CSE, values of no input computed at compile time, regions cut at every\n"
        "matmul/conv, matmul and conv in cuBLAS/cuDNN, looped reductions, CUDA graphs (options={'cudagraphs': True}).\n"
        "Inductor does more: autotuning (block sizes, warps, benchmarked per shape); split reductions; matmul\n"
        "epilogues in Triton GEMM templates (max-autotune); a scheduler that fuses across the whole graph and reuses\n"
        "buffers; dynamic shapes. We do more: options={'fold_bn': True} (a weaker promise than `freezing`: folded\n"
        "weights are refreshed when a parameter's version counter or address moves); conv+bias+ReLU in one cuDNN call."
    )

    heading("Legality: change a BatchNorm's statistics after compiling", "-")
    reset()
    net = models.ConvBNNet(width=4).to(device).eval()
    (small,) = models.conv_inputs(batch=1, size=6)
    small = small.to(device)
    compiled = torch.compile(net, backend="fusion", options={"fold_bn": True})
    with torch.no_grad():
        compiled(small)
        net.bn1.running_var.mul_(4.0)  # an in-place write: its version counter moves
        print(f"after bn1.running_var *= 4: max |compiled − eager| = {max_abs_diff(compiled(small), net(small)):.1e}")
    print("The folded weights were recomputed from the new statistics; a baked-in fold would be wrong now.")
    reset()
    plain = torch.compile(net, backend="fusion")  # the default: no fold, nothing baked in
    with torch.no_grad():
        plain(small), net.bn1.running_var.data.mul_(4.0)  # a write through .data moves no version counter
        print(f"default options, after a .data write: max |Δ| = {max_abs_diff(plain(small), net(small)):.1e}")


def main(argv: list[str] | None = None) -> int:
    return lesson_cli(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
