"""AOTAutograd glue: from Dynamo's torch-level graph to aten graphs, and the boxed calling convention.

Dynamo hands a backend ``(gm, example_inputs)``: a torch-level graph (``torch.conv2d``, ``torch._C._nn.linear``,
parameters as inputs) and real example tensors. AOTAutograd traces it below autograd into aten graphs on fake
tensors, applies a decomposition table (``fusion.aten.capture.decomposition_table``: the one Phases 6 and 8 use), functionalizes it, and — when some input needs a
gradient — partitions the joint graph into a forward and a backward graph. It calls one compiler per graph:

* ``inference_compiler`` when no output needs a gradient (``torch.no_grad()``, ``torch.inference_mode()``, or no
  input requires grad): one graph, parameters as its inputs;
* ``fw_compiler`` and ``bw_compiler`` otherwise (the backward lazily, on the first ``.backward()``).

Each compiler returns a callable in the *boxed* convention: it takes one list of tensors (so the runtime can free
inputs early) and carries ``_boxed_call = True``; ``make_boxed_func`` wraps a plain ``f(*args)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.fx as fx

from fusion.common import is_todo
from fusion.compiler.attention import CAPTURE_PASSES
from fusion.compiler.pass_base import current, run_stage
from fusion.kernels.precompile import warm_pool

aten = torch.ops.aten


def make_boxed(fn: Callable[..., object]) -> Callable[[list], object]:
    """``fn(*args)`` as a boxed callable ``g(args_list)``: ``fn.boxed`` where ``fn`` carries one (a compiled graph's
    runner: it empties the list, so each input is freed at its last use), else
    ``torch._functorch.aot_autograd.make_boxed_func`` (the list and the call's tuple hold every input to the end)."""
    boxed = getattr(fn, "boxed", None)
    if boxed is not None:
        return boxed
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(fn)


def lower_with_aot(
    gm: fx.GraphModule,
    example_inputs: Sequence[object],
    *,
    inference_compiler: Callable,
    fw_compiler: Callable,
    bw_compiler: Callable,
    decompositions: dict,
    options: object = None,
) -> Callable:
    """AOTAutograd with our compilers: returns the callable Dynamo runs in place of ``gm``. The capture passes on in
    ``options`` (default: those of the compile in progress, ``pass_base.current()``) rewrite ``gm`` first."""
    from torch._dynamo.backends.common import aot_autograd

    warm_pool(example_inputs)  # CUDA: the kernel compile workers start while AOTAutograd traces
    run_stage(CAPTURE_PASSES, gm, options=options)  # before the trace picks attention's kernel (a boolean mask: math)
    opts = options if options is not None else current()
    if torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in example_inputs):
        keep = training_keep(opts)
        decompositions = {op: fn for op, fn in decompositions.items() if op not in keep}
    backend = aot_autograd(
        fw_compiler=fw_compiler,
        bw_compiler=bw_compiler,
        inference_compiler=inference_compiler,
        decompositions=decompositions,
        keep_inference_input_mutations=True,
        **partitioner(opts),
    )
    return backend(gm, example_inputs)


def training_keep(options: object) -> tuple[torch._ops.OpOverload, ...]:
    """The ops a training graph keeps whole (``fusion.aten.capture.TRAINING_KEEP``: the library's kernels where they
    win), less batch norm's under ``options={"decompose_bn": True}``. A kept batch norm keeps its eval-mode form
    whole too: Inductor's decomposition of ``_native_batch_norm_legit_no_training`` calls the mutable
    ``_native_batch_norm_legit``, which AOTAutograd rejects when that is kept."""
    from fusion.aten.capture import TRAINING_BATCH_NORM, TRAINING_KEEP

    if options is not None and options.decompose_bn:
        return tuple(op for op in TRAINING_KEEP if op not in TRAINING_BATCH_NORM)
    return (*TRAINING_KEEP, aten._native_batch_norm_legit_no_training.default)


def partitioner(options: object) -> dict:
    """How the joint graph is cut into forward and backward: ``options={"min_cut": True}`` (the default) picks
    AOTAutograd's min-cut rematerialization (what Inductor uses: the backward recomputes cheap pointwise values from
    fewer saved tensors); ``False`` its default partitioner (every value the backward reads is saved by the forward)."""
    if options is None or not options.min_cut:  # None: no compile in progress (the backend always has one)
        return {}
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def partition(joint: fx.GraphModule, *args, **kwargs):
        save_compared_values(joint)
        return min_cut_rematerialization_partition(joint, *args, **kwargs)

    return {"partition_fn": partition}


def save_compared_values(joint: fx.GraphModule) -> int:
    """Mark each forward value that an equality reads (``eq``/``ne`` of two tensors: amax's and max's backward
    ``grad * (result == x) / count``) as saved, never recomputed by the backward (``CheckpointPolicy.MUST_SAVE``,
    which the min-cut partitioner honours). Recomputed, ``x`` may come from another implementation than the one the
    forward's result came from (eager's erf in a refused region against a kernel's ``fusion_erff``, a bit apart): the
    equality is then false everywhere and the gradient 0/0 (a fuzzer's find, tests/test_fuzz.py). Returns how many
    were marked."""
    from torch.utils.checkpoint import CheckpointPolicy

    from fusion.aten.nodes import is_view_node

    aten = torch.ops.aten
    backward: set[fx.Node] = set()  # what depends on a tangent: the backward's own values, nothing to save
    for node in joint.graph.nodes:
        if (node.op == "placeholder" and node.name.startswith("tangents")) or any(
            i in backward for i in node.all_input_nodes
        ):
            backward.add(node)
    marked = 0
    for node in joint.graph.nodes:
        if node.op != "call_function" or node.target not in (aten.eq.Tensor, aten.ne.Tensor):
            continue
        for value in node.args[:2]:
            while isinstance(value, fx.Node) and value.op == "call_function" and is_view_node(value, getitem=False):
                value = value.args[0]
            if isinstance(value, fx.Node) and value.op == "call_function" and value not in backward:
                value.meta["recompute"] = CheckpointPolicy.MUST_SAVE
                marked += 1
    return marked


def placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def input_values(gm: fx.GraphModule) -> list[object]:
    """The placeholders' ``meta["val"]`` (fake tensors, SymInts): example inputs for a graph a pass rewrote."""
    return [n.meta.get("val") for n in placeholders(gm)]


def has_dynamic_shapes(gm: fx.GraphModule) -> bool:
    """Does any input have a symbolic size (Dynamo's automatic dynamic shapes after a recompile)?"""
    for val in input_values(gm):
        if isinstance(val, torch.SymInt):
            return True
        if isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape):
            return True
    return False


def decompose(gm: fx.GraphModule, table: dict) -> fx.GraphModule:
    """Re-trace ``gm`` on its placeholders' fake values, applying ``table`` to the ops a pass left whole.

    The result has the same inputs and outputs, fresh ``meta["val"]`` on every node.
    """
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    vals = input_values(gm)
    fake_mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    interpreter = fx.Interpreter(gm)
    if fake_mode is None:
        return make_fx(interpreter.run, decomposition_table=table)(*vals)
    with fake_mode:
        return make_fx(interpreter.run, decomposition_table=table)(*vals)


def decompose_in_place(gm: fx.GraphModule, table: dict) -> None:
    """:func:`decompose`, with the result's graph (and the constants it reads) installed into ``gm`` itself."""
    new = decompose(gm, table)
    for old, node in zip(placeholders(gm), placeholders(new), strict=True):  # what passes marked (folded weights)
        node.meta.update({k: v for k, v in old.meta.items() if k not in node.meta})
    for node in new.graph.nodes:
        if node.op == "get_attr":
            setattr(gm, node.target, getattr(new, node.target))
    gm.graph = new.graph  # the setter makes gm own the graph and recompiles


def register_once(name: str, fn: Callable) -> None:
    """Register ``fn`` (``fusion.compiler.driver.fusion_backend``) as the Dynamo backend ``name``, once per process.

    Dynamo's registry refuses a second registration under one name, so a second call is a no-op. An unsolved
    exercise (``NotImplementedError("TODO(human) ...")``) comes out of the compiled call unwrapped, not wrapped in
    Dynamo's ``BackendCompilerFailed``, so the practice tooling and ``fusion.main`` recognise it.
    """
    from torch._dynamo import list_backends, register_backend

    if name in list_backends(exclude_tags=()):
        return

    def backend(gm, example_inputs, **kwargs):
        try:
            return fn(gm, example_inputs, **kwargs)
        except NotImplementedError as e:  # an unsolved TODO(human) in a practice workspace: raise it as it is when
            if not is_todo(e):  # the graph runs, not wrapped in Dynamo's BackendCompilerFailed
                raise
            todo = e

            def unsolved(*args, **kwargs):
                raise todo

            return unsolved

    backend.__name__ = getattr(fn, "__name__", name)
    register_backend(backend, name=name)
