"""Library calls through torch's Python bindings, not OpOverload objects: the same op, less CPU per call.

fx writes an aten node as ``torch.ops.aten.convolution.default(...)``: an ``OpOverload``, whose call takes the boxed
path (the arguments packed onto a stack and matched against the schema by the dispatcher). ``torch.convolution(...)``
reaches the same kernel through the generated C++ binding, unboxed. Measured on the lent H200 (torch 2.11,
``scripts/gpu_probe_calls.py``, 2026-11-24): a small channels_last bf16 1x1 convolution costs 20.6 µs of CPU per
call as an OpOverload and 15.7 µs as ``torch.convolution``; a depthwise 3x3 16.3–21.3 µs against 11.3 µs. A graph
that is CPU-bound (EfficientNet-B0: 81 convolutions a call) pays that on every library call. Inductor's output code
calls ``extern_kernels.convolution`` (``torch.convolution``) and ``extern_kernels.mm`` for the same reason.

Only ops whose binding takes exactly the overload's arguments (same order, same keyword names), cannot resolve to
another overload for them and returns what the overload returns are listed; none of them mutates an input. A
missing binding (another torch) is skipped. Not listed: the CUDA attention kernels (flash, efficient, cuDNN): their
bindings return the sequence lengths as tensors where the overloads return ints (a backward reads them).
"""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten

# overload -> the name of its binding in torch (torch._C._VariableFunctions)
_NAMES = {
    aten.convolution.default: "convolution",
    aten.mm.default: "mm",
    aten.addmm.default: "addmm",
    aten.bmm.default: "bmm",
    aten.baddbmm.default: "baddbmm",
    aten.cat.default: "cat",
    aten.clone.default: "clone",
    aten.embedding.default: "embedding",
    aten.where.self: "where",
    aten.cumsum.default: "cumsum",
    aten.mean.dim: "mean",
    aten.sum.dim_IntList: "sum",
    aten.amax.default: "amax",
    aten.constant_pad_nd.default: "constant_pad_nd",
    aten._adaptive_avg_pool2d.default: "_adaptive_avg_pool2d",
    aten._native_batch_norm_legit_no_training.default: "_native_batch_norm_legit_no_training",
    aten.native_batch_norm.default: "native_batch_norm",
    aten.cudnn_batch_norm.default: "cudnn_batch_norm",
    aten._scaled_dot_product_flash_attention_for_cpu.default: "_scaled_dot_product_flash_attention_for_cpu",
}
BINDINGS = {op: getattr(torch._C._VariableFunctions, name) for op, name in _NAMES.items()
            if hasattr(torch._C._VariableFunctions, name)}  # fmt: skip


def python_bindings(gm: fx.GraphModule) -> list[str]:
    """Point every library call of ``gm`` that has a binding in :data:`BINDINGS` at it, in place (the graph's
    ``forward`` is regenerated). Returns the nodes changed, ``"convolution_3: aten.convolution.default"``."""
    changed = []
    for node in gm.graph.nodes:
        binding = BINDINGS.get(node.target) if node.op == "call_function" else None
        if binding is not None:
            changed.append(f"{node.name}: {node.target}")
            node.target = binding
    if changed:
        gm.recompile()
    return changed
