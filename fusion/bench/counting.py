"""FLOPs and bytes of every node of an FX graph, from ShapeProp's shapes: what the roofline is fed. No timing here.

Conventions (the report prints them): a matmul/conv counts 2 FLOPs per multiply-add; an elementwise op 1 FLOP per
output element (addcmul and eval-mode BatchNorm 2); a reduction 1 per input element. A node *reads* each distinct
tensor it takes (for a call_module, also the module's parameters and buffers) and *writes* its output. View ops
(flatten, reshape, getitem, ...) move nothing. Running every node as its own kernel is what eager mode does.
Models that symbolic_trace cannot trace are counted with torch's own ``FlopCounterMode`` (matmuls and convs only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.passes.shape_prop import ShapeProp

from fusion.aten.nodes import is_view_node
from fusion.kernels.cudnn import CONV_THEN_ADD_RELU, CONV_THEN_RELU, CUDNN_CONV_THEN_BIAS, CUDNN_EPILOGUE

_MATMUL_NAMES = {"matmul", "mm", "bmm", "addmm", "baddbmm", "linear", "_addmm_activation"}
_EPILOGUE_WORDS = ("add", "relu", "gelu", "activation")  # fused after a matmul: one FLOP per output element each
_TWO_FLOP_ELEMENTWISE = {"addcmul", "addcdiv", "batch_norm"}


@dataclass(frozen=True)
class NodeCost:
    name: str
    flops: int
    bytes_read: int
    bytes_written: int
    intermediate: bool  # its output is written to memory and read back by another node (not a graph output)
    kernel_path: str = ""  # what a fused module says it really runs (FusedLinearReLU.kernel_path), if it says
    extra_passes: int = 0  # extra read+write passes over its output that kernel path makes (in place, not a new tensor)

    @property
    def nbytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def extra_pass_bytes(self) -> int:
        """Bytes of the extra passes (each reads and rewrites the output): separate kernels inside this node."""
        return 2 * self.extra_passes * (self.bytes_written // (1 + self.extra_passes))


def _nbytes(meta: object) -> int:
    if not hasattr(meta, "shape"):
        return 0
    return math.prod(meta.shape) * meta.dtype.itemsize


def _numel(node: fx.Node) -> int:
    meta = node.meta.get("tensor_meta")
    return math.prod(meta.shape) if hasattr(meta, "shape") else 0


def _tensor_inputs(node: fx.Node) -> list[fx.Node]:
    seen: dict[fx.Node, None] = {}
    for a in node.all_input_nodes:  # distinct nodes among args and kwargs
        if hasattr(a.meta.get("tensor_meta"), "shape"):
            seen[a] = None
    return list(seen)


def _fn_name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    return getattr(node.target, "__name__", str(node.target)).lower()


def _matmul_flops(node: fx.Node, name: str) -> int:
    out = _numel(node)
    k_input = next((a for a in _tensor_inputs(node) if len(a.meta["tensor_meta"].shape) >= 2), None)
    k = k_input.meta["tensor_meta"].shape[-1] if k_input is not None else 0
    epilogue = sum(word in name for word in _EPILOGUE_WORDS)
    if name == "linear":  # F.linear(x, w, b): the bias add is the epilogue
        epilogue = int(len(node.args) > 2 and node.args[2] is not None or node.kwargs.get("bias") is not None)
    return 2 * out * k + epilogue * out


def node_flops(node: fx.Node, gm: fx.GraphModule) -> int:
    """FLOPs of one node, from the shapes ShapeProp recorded (see the conventions above)."""
    out = _numel(node)
    if node.op not in ("call_module", "call_function", "call_method") or is_view_node(node, gm) or not out:
        return 0
    inputs = _tensor_inputs(node)
    first_in = _numel(inputs[0]) if inputs else 0
    if node.op == "call_module":
        m = gm.get_submodule(node.target)
        if isinstance(m, nn.modules.conv._ConvNd):
            macs_per_out = (m.in_channels // m.groups) * math.prod(m.kernel_size)
            epilogue = getattr(m, "epilogue_flops_per_output", 0)  # ConvBiasReLU2d: the ReLU (and the add)
            return 2 * out * macs_per_out + (out if m.bias is not None else 0) + epilogue * out
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return 2 * out  # eval mode: y = x * scale + shift
        weight = getattr(m, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2:  # nn.Linear and fused Linear+activation modules
            flops = 2 * out * weight.shape[1] + (out if getattr(m, "bias", None) is not None else 0)
            return flops + (out if any(w in type(m).__name__.lower() for w in ("relu", "gelu")) else 0)
        return max(out, first_in)  # elementwise (ReLU: out) or reduction (pooling: its input)
    name = _fn_name(node)
    if name in _MATMUL_NAMES or "matmul" in name:
        return _matmul_flops(node, name)
    per_element = 2 if name.strip("_") in _TWO_FLOP_ELEMENTWISE else 1
    return per_element * max(out, first_in)


def declared_kernel_path(module: nn.Module, node: fx.Node, device: torch.device) -> tuple[str, int]:
    """(path, extra passes over the output) for a fused module that says which kernels it runs, else ("", 0).

    Phase 2's FusedLinearReLU has ``kernel_path(x)``: on CUDA one cuBLASLt GEMM with a bias+ReLU epilogue; on CPU
    ``addmm`` then ``relu_`` in place — still a second pass over the output, which fusion was meant to remove.
    """
    kernel_path = getattr(module, "kernel_path", None)
    inputs = _tensor_inputs(node)
    if not callable(kernel_path) or not inputs:
        return "", 0
    meta = inputs[0].meta["tensor_meta"]
    x = torch.zeros((), dtype=meta.dtype, device=device).expand(*meta.shape)  # right shape/dtype/device, no memory
    try:
        path = str(kernel_path(x))
    except Exception:
        return "", 0
    if path in EXTRA_PASSES:
        return path, EXTRA_PASSES[path]
    return path, 2 if path.startswith("cuda-gemm") else 1  # bias copy + GEMM + relu; or GEMM + relu_


# What the kernels of a node really do, where that differs from "one kernel per node". Phase 2's paths are described
# in fusion.kernels.cublaslt.KERNEL_PATHS; the convolution's, on CUDA, in fusion.kernels.cudnn.CONV_PATHS.
EXTRA_PASSES = {  # extra read+write passes over the node's output, beyond the one write of its result
    "cublaslt-epilogue": 0,
    "empty": 0,
    CUDNN_EPILOGUE: 0,
    CUDNN_CONV_THEN_BIAS: 1,
    CONV_THEN_RELU: 1,
    CONV_THEN_ADD_RELU: 2,
}
_BIAS_OUTSIDE = {"Cudnn", "CudnnTranspose"}  # ConvBackends whose bias is a separate output.add_(bias) in ATen


def conv_backend(conv: nn.Module, node: fx.Node, device: torch.device) -> str | None:
    """The ATen backend (``torch._C._ConvBackend`` name: "Cudnn", "Mkldnn", "Slow2d", ...) this conv node runs on,
    asked from ATen itself on a tensor with the node input's shape, strides and dtype; None when it cannot be told."""
    select = getattr(torch._C, "_select_conv_backend", None)
    inputs = _tensor_inputs(node)
    if select is None or not inputs or isinstance(conv.padding, str):
        return None
    meta = inputs[0].meta["tensor_meta"]
    try:
        x = torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=device)
        transposed = isinstance(conv, nn.modules.conv._ConvTransposeNd)
        out_pad = list(conv.output_padding) if transposed else [0] * len(conv.kernel_size)
        backend = select(
            x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, transposed, out_pad, conv.groups
        )
    except Exception:
        return None
    return getattr(backend, "name", str(backend).rsplit(".", 1)[-1])


def conv_kernel_path(conv: nn.Module, node: fx.Node, device: torch.device) -> tuple[str, int]:
    """(path, extra passes) of a plain conv with a bias: on cuDNN the bias is a kernel of its own.

    ``at::_convolution`` runs ``cudnn_convolution`` and then ``output.add_(bias)``: a conv with a bias costs the
    conv *plus* a read+write pass over its output. So folding a BatchNorm into a cuDNN conv swaps each BN pass for
    a bias-add pass with the same bytes; only an epilogue (ConvBiasReLU2d) removes it. Elsewhere (oneDNN, the
    native depthwise kernels) the bias rides in the conv kernel and this returns ("", 0).
    """
    if getattr(conv, "bias", None) is None:
        return "", 0
    backend = conv_backend(conv, node, device)  # on a CPU tensor ATen answers a CPU backend
    if (
        backend is None
        and device.type == "cuda"
        and torch.backends.cudnn.is_available()
        and torch.backends.cudnn.enabled
    ):
        backend = "Cudnn"  # cannot ask ATen: assume the common case on CUDA
    return (CUDNN_CONV_THEN_BIAS, 1) if backend in _BIAS_OUTSIDE else ("", 0)


def graph_costs(gm: fx.GraphModule, *example_inputs: torch.Tensor) -> list[NodeCost]:
    """Run ShapeProp on ``example_inputs`` and count every kernel node's FLOPs, bytes read and bytes written."""
    ShapeProp(gm).propagate(*example_inputs)
    device = next((t.device for t in example_inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
    outputs = {n for n in gm.graph.nodes if n.op == "output"}
    returned: set[fx.Node] = set()
    for o in outputs:  # the values the graph returns, followed back through views to the kernel that wrote them
        stack = list(o.all_input_nodes)
        while stack:
            n = stack.pop()
            returned.add(n)
            if is_view_node(n, gm):
                stack.extend(n.all_input_nodes)
    costs = []
    for node in gm.graph.nodes:
        if node.op not in ("call_module", "call_function", "call_method") or is_view_node(node, gm):
            continue
        written = _nbytes(node.meta.get("tensor_meta"))
        if not written:
            continue  # no single tensor result (a tuple, a shape): not a kernel we can cost
        read = sum(_nbytes(a.meta["tensor_meta"]) for a in _tensor_inputs(node))
        path, extra = "", 0
        if node.op == "call_module":
            m = gm.get_submodule(node.target)
            read += sum(t.numel() * t.element_size() for t in (*m.parameters(), *m.buffers()))
            path, extra = declared_kernel_path(m, node, device)
            if not path and isinstance(m, nn.modules.conv._ConvNd):
                path, extra = conv_kernel_path(m, node, device)
        read, written = read + extra * written, written * (1 + extra)
        costs.append(NodeCost(node.name, node_flops(node, gm), read, written, node not in returned, path, extra))
    return costs


def intermediate_bytes(costs: Sequence[NodeCost]) -> int:
    """Bytes written to memory only to be read back: outputs of non-final nodes, and extra passes inside a node."""
    total = 0
    for c in costs:
        one_output = c.bytes_written // (1 + c.extra_passes)
        total += c.bytes_written if c.intermediate else c.bytes_written - one_output
    return total


def flat_tensors(value: object) -> list[torch.Tensor]:
    """The tensors in a model's output: a tensor, or a (nested) tuple/list/dict of them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flat_tensors(v)]
    return []


def min_bytes(model: nn.Module, inputs: Sequence[torch.Tensor], outputs: object) -> int:
    """The fewest bytes any implementation must move: read every input and parameter once, write every output once."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    n = sum(t.numel() * t.element_size() for t in tensors.values() if t.is_floating_point())
    return n + sum(t.numel() * t.element_size() for t in (*flat_tensors(list(inputs)), *flat_tensors(outputs)))


def kernels_bound(costs: Sequence[NodeCost], bound_s: Callable[[int, int], float], bytes_per_s: float) -> float:
    """The roofline bound of running each node as its own kernel: each pays its own bytes, the times add up.

    ``bound_s(flops, nbytes)`` is one kernel's roofline bound (the lesson's ``roofline``). A node that declares extra
    passes over its output (FusedLinearReLU on CPU: addmm, then relu_) runs those as kernels of their own, pure
    memory traffic that cannot hide behind the matmul's compute.
    """
    return sum(bound_s(c.flops, c.nbytes - c.extra_pass_bytes) + c.extra_pass_bytes / bytes_per_s for c in costs)


def flop_count(model: nn.Module, inputs: Sequence[torch.Tensor]) -> int:
    """FLOPs of one call by torch.utils.flop_counter (matmuls, convs, attention; elementwise ops count 0)."""
    import contextlib

    from torch.utils.flop_counter import FlopCounterMode

    mha = getattr(torch.backends, "mha", None)
    with contextlib.ExitStack() as stack:
        if mha is not None and hasattr(mha, "set_fastpath_enabled"):  # the fused encoder op has no FLOP formula:
            was = mha.get_fastpath_enabled()  # count the same math through the unfused path
            mha.set_fastpath_enabled(False)
            stack.callback(mha.set_fastpath_enabled, was)
        counter = stack.enter_context(FlopCounterMode(display=False))
        model(*inputs)
    return int(counter.get_total_flops())
