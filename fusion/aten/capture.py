"""Capture a model as the aten graph Inductor lowers: fake tensors, parameters as inputs, Inductor's decompositions.

>>> from fusion import models
>>> m = models.TinyNet()
>>> gm = capture_aten(m, models.tiny_inputs())
>>> torch.testing.assert_close(gm(*aten_inputs(m, models.tiny_inputs())), m(*models.tiny_inputs()))
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx

from fusion.aten.roll import roll_as_cat
from fusion.common import ensure_module

# Inductor decompositions that read torch._inductor.lowering when they run (max_pool*_with_indices asks
# ``lowering.should_fallback_max_pool_with_indices`` whether to keep the op). Only a compile imports that module, so
# a capture outside torch.compile met "module 'torch._inductor' has no attribute 'lowering'" on every max-pool.
_NEEDS_LOWERING = frozenset({"aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices"})


def _named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    return tensors


def aten_inputs(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The flat list a graph from :func:`capture_aten` takes: parameters, then buffers, then the model inputs."""
    return [*_named_tensors(model).values(), *example_inputs]


def _with_lowering(decomposition: Callable) -> Callable:
    """``decomposition``, importing torch._inductor.lowering the first time it runs (importing it costs seconds)."""

    @functools.wraps(decomposition)
    def run(*args, **kwargs):
        import torch._inductor.lowering  # noqa: F401  (the decomposition reads torch._inductor.lowering.<…>)

        return decomposition(*args, **kwargs)

    return run


# Attention stays one library call without an entry here: Inductor's table "decomposes" the CompositeImplicit
# aten.scaled_dot_product_attention by running torch's own dispatch (op.decompose), which picks the fused kernel for
# the (fake) inputs' device, dtype and mask: _scaled_dot_product_flash_attention / _efficient_attention /
# _cudnn_attention on CUDA, _scaled_dot_product_flash_attention_for_cpu on a CPU; none of those is in the table
# (Inductor drops the _for_cpu math decomposition), so the graph keeps that one call. Only where torch itself would
# run the math path (no fused kernel takes the inputs) does the graph show bmm + softmax.
# The ops the course leaves whole although Inductor's table decomposes them: none today. A pass that wants to match
# an op before it is decomposed passes it as ``keep`` for its own capture (the backend keeps eval-mode batch norm for
# the fold, then decomposes what the fold left with the full table); an op listed here would be kept everywhere.
KEEP_WHOLE: frozenset[torch._ops.OpOverload] = frozenset()

# What a *training* graph keeps whole (Phase 9 passes it as ``keep`` when some input needs a gradient): ops whose
# decomposition our generator cannot yet turn into fast kernels, so the library's kernel, the one eager runs, is
# faster. Measured on an H200 (scripts/results/h200-2026-11-24-profile_models.*): batch norm's statistics and its
# backward are reductions over N, H and W (not the last dim: no generated kernel, each ran as a float32 aten reduction
# on a float32 copy, 2.5× eager's GPU time on ResNet-50's step); max-pool's window offsets become int64 index
# arithmetic in Python references; the embedding backward a float32 scatter-add (1.9 ms on BERT's step). The kept
# embedding backward can run as zeros and one index_add_ instead of ATen's sort (wrapper pass ``embedding_grads``).
_aten = torch.ops.aten
TRAINING_KEEP: tuple[torch._ops.OpOverload, ...] = (
    _aten._batch_norm_with_update.default, _aten._batch_norm_with_update_functional.default,
    _aten._native_batch_norm_legit.default, _aten._native_batch_norm_legit_functional.default,
    _aten.native_batch_norm.default, _aten.native_batch_norm_backward.default, _aten.batch_norm_backward.default,
    _aten.cudnn_batch_norm.default, _aten.cudnn_batch_norm_backward.default,
    _aten.max_pool2d_with_indices.default, _aten.embedding_dense_backward.default,
)  # fmt: skip
# Batch norm's ops among them: ``options={"decompose_bn": True}`` decomposes those in a training graph too, as
# Inductor does (its statistics are reductions over N, H and W, which the generator now runs as column reductions;
# its output then a pointwise value the min-cut partitioner recomputes in the backward instead of saving it)
TRAINING_BATCH_NORM: tuple[torch._ops.OpOverload, ...] = tuple(op for op in TRAINING_KEEP if "batch_norm" in op.name())


@functools.cache
def decomposition_table(decompose: bool = True, keep: tuple[torch._ops.OpOverload, ...] = ()) -> dict:
    """THE decomposition table of the course: Phase 6's and Phase 8's ``capture_aten`` and Phase 9's AOTAutograd
    lowering all use it, so the three phases see the same aten graph. It is Inductor's own table (exactly what it
    decomposes before lowering; max-pool becomes Inductor's low-memory window prims), less :data:`KEEP_WHOLE` and
    ``keep``; {} for ``decompose=False``. A torch build without Inductor gets the core-aten table.
    """
    if not decompose:
        return {}
    try:
        from torch._inductor.decomposition import select_decomp_table

        table = dict(select_decomp_table())
    except Exception:
        from torch._decomp import core_aten_decompositions

        table = dict(core_aten_decompositions())
    for op, fn in table.items():
        if isinstance(op, torch._ops.OpOverload) and op._schema.name in _NEEDS_LOWERING:
            table[op] = _with_lowering(fn)
    table[torch.ops.aten.roll.default] = roll_as_cat  # two slices and a cat, not a gather (fusion/aten/roll.py)
    for op in (*KEEP_WHOLE, *keep):
        table.pop(op, None)
    return table


def capture_aten(
    model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], *, decompose: bool = True
) -> fx.GraphModule:
    """Trace ``model`` into an aten-level GraphModule on fake tensors, the graph Inductor lowers.

    * Parameters and buffers become placeholders (named ``p_<name>``, before the inputs); call the result with
      :func:`aten_inputs` to run it on real tensors.
    * Every tensor node carries ``meta["val"]``: a FakeTensor with shape, dtype and strides, but no storage, so
      a (64, 4096, 4096) activation costs nothing to capture. Inputs may be real or already fake.
    * ``decompose=True`` applies Inductor's decomposition table (layer_norm, gelu, batch_norm, max_pool, … into
      primitive ops); ``decompose=False`` keeps them as single aten ops.
    * The trace is functionalized: BatchNorm's running-stat updates in training mode appear as ``copy_`` nodes at
      the end, not as mutations hidden in the middle. The caller's model is not modified.
    """
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.func import functional_call, functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    ensure_module(model, "capture_aten")
    named = _named_tensors(model)
    names = list(named)
    inputs = list(example_inputs)
    if not all(isinstance(t, torch.Tensor) for t in inputs):
        raise TypeError(
            "capture_aten needs example_inputs as a sequence of tensors, e.g. (x,); got "
            f"{[type(t).__name__ for t in inputs]}"
        )

    def flat_forward(*flat: torch.Tensor):
        return functional_call(model, dict(zip(names, flat[: len(names)], strict=True)), tuple(flat[len(names) :]))

    modes = {t.fake_mode for t in inputs if isinstance(t, FakeTensor)}
    fake_mode = modes.pop() if len(modes) == 1 else FakeTensorMode(allow_non_fake_inputs=False)
    fake = [t if isinstance(t, FakeTensor) else fake_mode.from_tensor(t) for t in [*named.values(), *inputs]]
    try:
        with fake_mode:
            gm = make_fx(
                functionalize(flat_forward, remove="mutations"), decomposition_table=decomposition_table(decompose)
            )(*fake)
    except Exception as e:  # a branch on a tensor's value has no single graph: say so and name the fix
        data_dependent = "DataDependent" in type(e).__name__ or "data-dependent" in str(e).lower()
        if not data_dependent:
            raise
        raise ValueError(
            f"capture_aten: {type(model).__name__}.forward reads a tensor's value ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:120]}), e.g. `if x.sum() > 0`: data-dependent control flow has no single "
            'graph to capture. Fix: torch.compile(model, backend="fusion") (Dynamo breaks the graph there and '
            "compiles each piece), or remove the branch from forward()"
        ) from None
    gm.graph.eliminate_dead_code()  # decompositions leave dead helpers (empty, full, alias); copy_ is impure and stays
    (output,) = gm.graph.find_nodes(op="output")
    for copy in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default):
        if copy.args[0].op == "placeholder":  # `return x.add_(1)` returns x itself, as eager does, not a new tensor
            output.replace_input_with(copy.args[1], copy)

    # Readable placeholder names: p_fc1_weight instead of arg2_1.
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    readable = [f"p_{name.replace('.', '_')}" for name in names] + [f"x{i}" for i in range(len(inputs))]
    if len(readable) == 1 + len(names):
        readable[-1] = "x"
    for node, name in zip(placeholders, readable, strict=True):
        try:
            node._rename(name)
            node.target = node.name
        except Exception:  # naming is cosmetic: keep torch's names if a version lacks Node._rename
            pass
    gm.recompile()
    gm.meta["aten_input_names"] = [n.name for n in placeholders]
    return gm
