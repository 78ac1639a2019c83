"""Attention stays one fused library call: a boolean mask becomes the additive mask fused kernels take.

``F.scaled_dot_product_attention`` is one call in eager; which kernel runs (FlashAttention, memory-efficient,
cuDNN, or PyTorch's *math* path: ``bmm`` + softmax in float32) is chosen from its inputs. Under AOTAutograd the choice
is made once, at trace time, and the graph keeps that kernel's aten op; where no fused kernel takes the inputs, the
graph gets the math path, decomposed: two float32 GEMMs, a float32 softmax and copies per layer.

HuggingFace's encoders hit this: under ``torch.compile`` BERT's padding mask is a ``bool`` tensor of shape
(batch, 1, q, k) broadcast from (batch, k), strides (0, k, 1, 0) (in eager, HF drops an all-ones mask and cuDNN runs
without one). No fused kernel takes a broadcast last dimension, so on an H200 BERT-base spent 7.1 ms per call in math
attention against eager's 2.0 ms (``scripts/results/h200-2026-11-23-probe_attention_bert_mask.log``).

The rewrite, on Dynamo's graph before AOTAutograd (so the trace-time choice sees it): a boolean ``attn_mask`` becomes
``where(mask, 0, -inf)`` in the query's dtype, made contiguous — the additive form every fused kernel takes, and the
form GPT-2's graph already carries. One query row masked everywhere is the one place the two differ: the math path
returns 0 there (``_safe_softmax``), an additive ``-inf`` row is NaN. So the result is
``where(mask.any(-1, keepdim=True), attention, 0)``: a select per layer, the reduction once per mask; none where the
mask is computed from no input and every row attends somewhere (a causal mask: :func:`every_query_attends`). Only on CUDA,
where the fused kernels are; each mask is converted (and reduced) once however many layers read it (a GPT-2 profile:
12 ``any`` of the same mask cost 57 us a call).
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F

from fusion.compiler.pass_base import Pass
from fusion.fxutils.finish import relint

SDPA = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
DEVICES = ("cuda",)  # where fused attention kernels exist (a CPU's flash kernel takes a boolean mask as it is)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` (True: attend) as 0 / -inf in ``dtype``, dense and contiguous (what fused attention reads)."""
    return torch.where(mask, 0.0, float("-inf")).to(dtype).contiguous()


def attends(mask: torch.Tensor) -> torch.Tensor:
    """True where a query attends to at least one key."""
    return mask.any(-1, keepdim=True)


def zero_fully_masked(out: torch.Tensor, attending: torch.Tensor) -> torch.Tensor:
    """0 where a query attends to nothing (``attending`` False), as the math path's ``_safe_softmax`` gives (the
    additive form: NaN)."""
    return torch.where(attending, out, 0.0).to(out.dtype)


def _example(node: object) -> torch.Tensor | None:
    val = node.meta.get("example_value", node.meta.get("val")) if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


MASK_EVAL_LIMIT = 1 << 24  # at most this many elements in a mask computed at compile time (16 MB of bool)


def every_query_attends(gm: fx.GraphModule, mask: fx.Node) -> bool:
    """Is ``mask`` computed from no input (a causal mask built from the sequence length alone, as HuggingFace's
    decoders build one under ``torch.compile``) and does every query row attend to some key? Then the select after
    attention changes nothing, and a training graph would save the reduced mask for the backward and select there
    too (two launches a layer). The mask's ancestors are evaluated once, at compile time; any that reads a graph
    input, a parameter or buffer (the caller may change it), calls a module, draws random numbers or is written in
    place, or a mask over :data:`MASK_EVAL_LIMIT` elements, answers False (the select stays)."""
    val = _example(mask)
    if val is None or val.numel() > MASK_EVAL_LIMIT:
        return False
    ancestors, stack = set(), [mask]
    while stack:
        n = stack.pop()
        if n in ancestors:
            continue
        if n.op not in ("call_function", "call_method") or _writes_or_draws(n):
            return False
        ancestors.add(n)
        stack += n.all_input_nodes
    if any(_writes_or_draws(u) for n in ancestors for u in n.users):  # a mask filled in place after it is made
        return False
    from torch.utils._python_dispatch import _disable_current_modes

    interp = fx.Interpreter(gm)
    try:
        with _disable_current_modes(), torch.no_grad():
            for n in gm.graph.nodes:
                if n in ancestors:
                    interp.env[n] = interp.run_node(n)
            value = interp.env[mask]
            return isinstance(value, torch.Tensor) and bool(value.to(torch.bool).any(-1).all())
    except Exception:  # an op the interpreter cannot run outside the trace: keep the select
        return False


IN_PLACE_OPERATORS = {"setitem", "delitem", "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand",
                      "ior", "ixor", "ilshift", "irshift", "imatmul"}  # fmt: skip
RANDOM = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli", "dropout", "multinomial",
          "normal", "randperm", "poisson"}  # fmt: skip


def _writes_or_draws(n: fx.Node) -> bool:
    """Does ``n`` write a tensor in place (``mask[i] = v``, ``x.add_()``, ``x += y``, ``out=``) or draw random numbers?"""
    import operator

    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    if "out" in n.kwargs or name in RANDOM or "dropout" in name:
        return True
    if getattr(operator, name, None) is n.target:  # the operator module: and_, or_ are not in place; iand is
        return name in IN_PLACE_OPERATORS
    return name.endswith("_") and not name.startswith("_")  # masked_fill_, add_


def fused_attention_masks(gm: fx.GraphModule) -> list[str]:
    """Rewrite every ``scaled_dot_product_attention`` of Dynamo's graph ``gm`` whose mask is boolean (on
    :data:`DEVICES`) as described above; returns the names of the calls changed."""
    changed: list[str] = []
    converted: dict[tuple[fx.Node, torch.dtype], fx.Node] = {}
    reduced: dict[fx.Node, fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in SDPA:
            continue
        in_kwargs = "attn_mask" in node.kwargs
        mask = node.kwargs.get("attn_mask") if in_kwargs else (node.args[3] if len(node.args) > 3 else None)
        q, m = _example(node.args[0] if node.args else None), _example(mask)
        if q is None or m is None or m.dtype != torch.bool or q.device.type not in DEVICES:
            continue
        with gm.graph.inserting_before(node):
            key = (mask, q.dtype)
            if key not in converted:
                converted[key] = gm.graph.call_function(additive_mask, (mask, q.dtype))
            if mask not in reduced:
                reduced[mask] = None if every_query_attends(gm, mask) else gm.graph.call_function(attends, (mask,))
        if in_kwargs:
            node.update_kwarg("attn_mask", converted[key])
        else:
            node.update_arg(3, converted[key])
        changed.append(node.name)
        if reduced[mask] is None:  # no row masked everywhere: the additive form's answer is the math path's
            continue
        with gm.graph.inserting_after(node):
            fixed = gm.graph.call_function(zero_fully_masked, (node, reduced[mask]))
        node.replace_all_uses_with(fixed, delete_user_cb=lambda user, fixed=fixed: user is not fixed)
    if changed:
        relint(gm)
    return changed


def _attention_mask(gm: fx.GraphModule, part: object = None) -> None:
    fused_attention_masks(gm)  # looked up when it runs: a test may watch it


# Passes on Dynamo's graph, before AOTAutograd traces it (aot.lower_with_aot runs those that are on)
CAPTURE_PASSES = [
    Pass("attention_mask", _attention_mask, stage="capture",
         doc="a boolean attention mask as the additive mask fused attention kernels take (CUDA)"),
]  # fmt: skip
