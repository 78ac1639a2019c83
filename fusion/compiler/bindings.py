"""Library calls through torch's Python bindings, not OpOverload objects: the same op, less CPU per call.

fx writes an aten node as ``torch.ops.aten.convolution.default(...)``: an ``OpOverload``, whose call takes the boxed
path (the arguments packed onto a stack and matched against the schema by the dispatcher). ``torch.convolution(...)``
reaches the same kernel through the generated C++ binding, unboxed. Measured on the lent H200 (torch 2.11,
``scripts/archive/gpu_probe_calls.py``, 2026-11-24): a small channels_last bf16 1x1 convolution costs 20.6 µs of CPU per
call as an OpOverload and 15.7 µs as ``torch.convolution``; a depthwise 3x3 16.3–21.3 µs against 11.3 µs. A graph
that is CPU-bound (EfficientNet-B0: 81 convolutions a call) pays that on every library call. Inductor's output code
calls ``extern_kernels.convolution`` (``torch.convolution``) and ``extern_kernels.mm`` for the same reason.

Only ops whose binding takes exactly the overload's arguments (same order, same keyword names), cannot resolve to
another overload for them and returns what the overload returns are listed; the one that writes an input
(``_native_batch_norm_legit``, a training BatchNorm's running statistics) writes the same ones. A missing binding
(another torch) is skipped. Not listed: the CUDA attention kernels (flash, efficient, cuDNN): their bindings return
the sequence lengths as tensors where the overloads return ints (a backward reads them).

Two more become Tensor methods where the call's arguments make them the same op (:data:`METHODS`): ``_to_copy`` to
another dtype is ``Tensor.to(dtype)`` (a training step under autocast casts every weight and every weight's
gradient: ResNet-50, 110 a step; 6.3 µs of CPU each as an OpOverload with its keyword argument, 2.1 µs as ``.to``
on this project's CPU machine), ``add_`` without ``alpha`` is ``Tensor.add_``. (``.to`` returns its input itself
for the same dtype, where ``_to_copy`` copies: that call stays the overload.) A depthwise convolution that pass
``depthwise`` renamed and the generator left out is ``torch.convolution`` again. A ``fusion::combo_cast`` (pass
``combo_casts``) becomes a plain Python call that keeps its node's plan (:class:`~fusion.kernels.combo.ComboCall`):
no dispatcher around a list of 58 tensors.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from fusion.compiler.depthwise import DEPTHWISE
from fusion.fxutils.finish import relint
from fusion.kernels.combo import COMBO_CAST, ComboCall

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
    aten._native_batch_norm_legit.default: "_native_batch_norm_legit",
    aten.relu.default: "relu",
    aten.native_batch_norm.default: "native_batch_norm",
    aten.cudnn_batch_norm.default: "cudnn_batch_norm",
    aten._scaled_dot_product_flash_attention_for_cpu.default: "_scaled_dot_product_flash_attention_for_cpu",
}
BINDINGS = {op: getattr(torch._C._VariableFunctions, name) for op, name in _NAMES.items()
            if hasattr(torch._C._VariableFunctions, name)}  # fmt: skip


def _to_another_dtype(node: fx.Node) -> tuple | None:
    """``_to_copy(x, dtype=d)`` with nothing else and ``x`` not of dtype ``d``: ``Tensor.to(x, d)``'s arguments."""
    x, dtype = node.args[0], node.kwargs.get("dtype")
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    if set(node.kwargs) != {"dtype"} or len(node.args) != 1 or not isinstance(val, torch.Tensor) or val.dtype == dtype:
        return None
    return (x, dtype)


def _depthwise_as_convolution(node: fx.Node) -> tuple:
    """``fusion::depthwise_conv2d(x, w, stride, padding, dilation)``, run outside a kernel: ``torch.convolution``'s
    arguments, every channel its own group (not the op's Python implementation behind the dispatcher)."""
    x, w, stride, padding, dilation = node.args
    return (x, w, None, stride, padding, dilation, False, [0, 0], x.meta["val"].shape[1])


# overload -> (Tensor method or function, its positional arguments for a node, or None where it is not the same op)
METHODS = {
    aten._to_copy.default: (torch.Tensor.to, _to_another_dtype),
    aten.add_.Tensor: (torch.Tensor.add_, lambda node: None if node.kwargs or len(node.args) != 2 else node.args),
    DEPTHWISE: (torch.convolution, _depthwise_as_convolution),
}


COMBO_CALLS = True  # False: each combo node stays the op, through the dispatcher (an A/B switch: scripts/gpu_ab.py)


def python_bindings(gm: fx.GraphModule) -> list[str]:
    """Point every library call of ``gm`` that has a binding in :data:`BINDINGS` at it, each call that is a Tensor
    method's op (:data:`METHODS`) at the method, and each ``fusion::combo_cast`` at a :class:`ComboCall` of its own,
    in place (the graph's ``forward`` is regenerated). Returns the nodes changed,
    ``"convolution_3: aten.convolution.default"``."""
    changed = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is COMBO_CAST and COMBO_CALLS:
            changed.append(f"{node.name}: {node.target}")
            node.target = ComboCall(f"combo_cast_{node.name}")
            continue
        binding, (method, args_of) = BINDINGS.get(node.target), METHODS.get(node.target, (None, None))
        args = args_of(node) if method is not None else None
        if binding is None and args is None:
            continue
        changed.append(f"{node.name}: {node.target}")
        if binding is not None:
            node.target = binding
        else:
            node.target, node.args, node.kwargs = method, tuple(args), {}
    if changed:
        relint(gm)
    return changed
