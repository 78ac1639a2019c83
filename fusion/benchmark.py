"""Phase 4 — an honest benchmark: fused vs unfused vs torch.compile, explained by the roofline.

Run it:   uv run python -m fusion.benchmark [--device cpu|cuda] [--quick] [--no-compile] [--json PATH] [--plot PATH]
          uv run --extra plot python -m fusion.benchmark --plot roofline.png     (the picture needs matplotlib)
Test it:  uv run pytest -m phase4

What you learn
--------------
* How to time GPU and CPU code so the number means something: ``torch.utils.benchmark.Timer.blocked_autorange``
  (warm-up, CUDA synchronisation, many blocks), the *median* and the *IQR* instead of one lucky run, and the
  variants of one workload interleaved in one process so that their ratio is fair (same clocks, same neighbours).
* The roofline model. A kernel needs at least ``FLOPs / peak FLOP/s`` seconds (compute) and at least
  ``bytes / peak bytes/s`` seconds (memory); it cannot beat the larger of the two. The ratio ``FLOPs / bytes`` is the
  *arithmetic intensity*: below the machine's ridge point (peak FLOP/s ÷ peak bytes/s) a kernel is memory-bound.
* Why fusion pays where it pays. Fusion removes *intermediate tensors*: bytes written to memory by one kernel only to
  be read back by the next. It removes no FLOPs. So a memory-bound chain (elementwise ops, BatchNorm, a bias+ReLU
  after a small-batch matmul) speeds up by about the bytes it saves, and a compute-bound matmul barely moves.
* Where the model does not hold, and why: caches (a working set that fits in L2 runs above the DRAM roofline),
  per-kernel launch and Python overhead at tiny sizes, and library kernels that reach their ceiling unequally.
  On CUDA the profiler splits each call into GPU kernel time and the rest (wall − GPU): a memory-bound
  Linear+ReLU on an H100 keeps the GPU busy ~11 µs of a ~35 µs call, so there fusion pays by launching fewer
  ops, not by moving fewer bytes.
* Kernel paths matter: on cuDNN a conv's bias is a separate kernel, so folding BatchNorm into the conv (phase 5)
  trades a BN pass for a bias pass; only an epilogue (cuDNN runtime fusion: conv + bias + ReLU) removes it.

The idea
--------
Every workload is run as three variants, interleaved: eager (unfused), our FX-fused model (the pass from phase 2,
3 or 5 that applies), and ``torch.compile`` of the unfused model. The peaks of *this* machine are measured at
start-up (a large copy, a large matmul). From the FX graph and ShapeProp's shapes we count each node's FLOPs and
bytes, so the roofline *predicts* the speedup of fusion before we measure it; the table puts both side by side.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import gc
import importlib
import importlib.util
import json
import math
import operator
import os
import platform
import sys
import time
import timeit
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.passes.shape_prop import ShapeProp
from torch.utils import benchmark as tbench

from fusion import models
from fusion.bench_report import (  # the report only reads the dict benchmark() returns: plumbing, not lesson
    PLOT_HINT,
    check_targets,
    have_matplotlib,
    plot_roofline,
    print_report,
)
from fusion.common import is_todo, report_of, run_lesson, trace_module
from fusion.conv_bn_fusion import (  # phase 5's module; its cuDNN epilogue section is not an exercise
    CONV_THEN_ADD_RELU,
    CONV_THEN_RELU,
    CUDNN_CONV_THEN_BIAS,
    CUDNN_EPILOGUE,
    cudnn_epilogue_unavailable,
    fuse_conv_relu_epilogue,
)

SEED = 0
SCHEMA_VERSION = 1

# ----------------------------------------------------------------------------------------------------------------------
# Sizes. CUDA runs the shapes in bfloat16; CPU runs float32 shapes that finish in seconds on two cores.


@dataclass(frozen=True)
class Sizes:
    linear_memory: tuple[int, int, int]  # (M, K, N): x (M, K) @ W (K, N), small batch, large weights
    linear_compute: tuple[int, int, int]  # (M, K, N): large batch, modest weights
    matmul: tuple[int, tuple[int, ...]]  # (batch, dims) for MatmulAddReLU(*dims)
    conv: tuple[int, int, int, int]  # (batch, in_ch, width, size) for ConvBNNet
    elementwise: tuple[int, int]  # (rows, d) for ElementwiseChain(d)
    copy_numel: int  # elements of the bandwidth probe (a copy src -> dst)
    matmul_n: int  # n of the compute probe (an n×n @ n×n matmul)
    rounds: int  # interleaved rounds per workload
    min_run_time: float  # seconds of blocked_autorange per variant per round


SIZES: dict[str, Sizes] = {
    "cuda": Sizes(
        linear_memory=(64, 4096, 4096),
        linear_compute=(32768, 1024, 1024),
        matmul=(8192, (1024, 4096, 1024)),
        conv=(64, 3, 128, 56),
        elementwise=(8192, 4096),
        copy_numel=256 * 2**20,  # 512 MiB in bf16 each side: far beyond any L2
        matmul_n=8192,
        rounds=5,
        min_run_time=0.2,
    ),
    "cuda-quick": Sizes(
        linear_memory=(64, 4096, 4096),
        linear_compute=(32768, 1024, 1024),
        matmul=(8192, (1024, 4096, 1024)),
        conv=(64, 3, 128, 56),
        elementwise=(8192, 4096),
        copy_numel=128 * 2**20,
        matmul_n=8192,
        rounds=3,
        min_run_time=0.05,
    ),
    "cpu": Sizes(
        linear_memory=(16, 2048, 2048),
        linear_compute=(2048, 512, 512),
        matmul=(1024, (512, 1024, 512)),
        conv=(8, 3, 32, 32),
        elementwise=(2048, 4096),
        copy_numel=16 * 2**20,  # 64 MiB in float32 each side
        matmul_n=1024,
        rounds=5,
        min_run_time=0.2,
    ),
    "cpu-quick": Sizes(
        linear_memory=(16, 1024, 1024),
        linear_compute=(1024, 256, 256),
        matmul=(512, (256, 512, 256)),
        conv=(4, 3, 16, 32),
        elementwise=(1024, 1024),
        copy_numel=8 * 2**20,
        matmul_n=512,
        rounds=3,
        min_run_time=0.05,
    ),
    # Toy shapes for the tests: the harness end to end in seconds. Its numbers mean nothing.
    "tiny": Sizes(
        linear_memory=(2, 32, 32),
        linear_compute=(64, 16, 16),
        matmul=(8, (16, 32, 16)),
        conv=(1, 3, 4, 8),
        elementwise=(4, 16),
        copy_numel=2**16,
        matmul_n=64,
        rounds=2,
        min_run_time=0.002,
    ),
}


@dataclass(frozen=True)
class Config:
    device: str = "cpu"  # "cpu" | "cuda"
    sizes: str = "cpu"  # a key of SIZES
    compile: bool = True
    threads: int = 0  # 0: keep torch.get_num_threads()
    seed: int = SEED
    quick: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.device == "cuda" else torch.float32


def default_config(device: str | None = None, quick: bool = False, compile: bool = True) -> Config:
    """The sizes for ``device``; ``quick``: smaller, fewer rounds, no torch.compile, and on CPU one thread.

    One thread in ``--quick`` because CPU math libraries spin-wait for their sibling threads: on a shared or busy
    machine (CI, a laptop compiling something) two threads can run a small op a hundred times slower than one.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    sizes = device + ("-quick" if quick else "")
    threads = 1 if quick and device == "cpu" else 0
    return Config(device=device, sizes=sizes, compile=compile and not quick, threads=threads, quick=quick)


# ----------------------------------------------------------------------------------------------------------------------
# Costs from the graph: FLOPs and bytes of every node, from ShapeProp's shapes. No timing here, only counting.
#
# Conventions (printed in the table's notes): a matmul/conv counts 2 FLOPs per multiply-add; an elementwise op 1 FLOP
# per output element (addcmul and eval-mode BatchNorm 2); a reduction 1 per input element. A node *reads* each distinct
# tensor it takes (for a call_module, also the module's parameters and buffers) and *writes* its output. View ops
# (flatten, reshape, getitem, ...) move nothing. Running every node as its own kernel is what eager mode does.

_VIEW_FUNCTIONS = {torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze, torch.t, torch.transpose}
_VIEW_FUNCTIONS |= {torch.permute, operator.getitem, getattr}
_VIEW_METHODS = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "t", "transpose", "permute", "expand", "size"}
_VIEW_MODULES = (nn.Flatten, nn.Identity, nn.Unflatten)
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


def is_view(node: fx.Node, gm: fx.GraphModule) -> bool:
    """A node that only reinterprets a tensor (no kernel, no bytes moved)."""
    if node.op == "call_function":
        return node.target in _VIEW_FUNCTIONS
    if node.op == "call_method":
        return node.target in _VIEW_METHODS
    if node.op == "call_module":
        return isinstance(gm.get_submodule(node.target), _VIEW_MODULES)
    return False


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
    if node.op not in ("call_module", "call_function", "call_method") or is_view(node, gm) or not out:
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
# in fusion.manual_fusion.KERNEL_PATHS; the convolution's, on CUDA, in fusion.conv_bn_fusion.CONV_PATHS.
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
            if is_view(n, gm):
                stack.extend(n.all_input_nodes)
    costs = []
    for node in gm.graph.nodes:
        if node.op not in ("call_module", "call_function", "call_method") or is_view(node, gm):
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


def min_bytes(model: nn.Module, inputs: Sequence[torch.Tensor], outputs: torch.Tensor | Sequence[torch.Tensor]) -> int:
    """The fewest bytes any implementation must move: read every input and parameter once, write every output once."""
    outs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    n = sum(t.numel() * t.element_size() for t in tensors.values() if t.is_floating_point())
    return n + sum(t.numel() * t.element_size() for t in (*inputs, *outs))


# ----------------------------------------------------------------------------------------------------------------------
# The roofline. Peaks are measured on this machine at start-up; every bound below uses them.


@dataclass(frozen=True)
class Peaks:
    flops_per_s: float  # best observed matmul throughput, in the workloads' dtype
    bytes_per_s: float  # best observed copy throughput, bytes read + bytes written
    copy_bytes: int = 0
    matmul_n: int = 0
    dtype: str = ""
    copy_times_s: tuple[float, ...] = ()
    matmul_times_s: tuple[float, ...] = ()

    @property
    def ridge(self) -> float:
        """The arithmetic intensity (FLOP/byte) where the two ceilings meet."""
        return self.flops_per_s / self.bytes_per_s


@dataclass(frozen=True)
class Roofline:
    flops: int
    nbytes: int
    intensity: float  # FLOPs per byte
    bound_s: float  # the roofline's lower bound on the time
    bound_by: str  # "memory" or "compute": the ceiling that binds


def roofline(flops: float, nbytes: float, peaks: Peaks) -> Roofline:
    """The roofline bound of moving ``nbytes`` and computing ``flops`` on a machine with these ``peaks``.

    >>> r = roofline(flops=2e9, nbytes=1e8, peaks=Peaks(flops_per_s=1e12, bytes_per_s=1e11))
    >>> r.intensity, r.bound_s, r.bound_by
    (20.0, 0.002, 'compute')
    """
    # TODO(human): compute the intensity (FLOPs per byte) and the bound: the larger of the compute time and the memory time. Hint: compute time = flops / peaks.flops_per_s, memory time = nbytes / peaks.bytes_per_s; bound_by names the larger
    # BEGIN SOLUTION
    compute_s = flops / peaks.flops_per_s
    memory_s = nbytes / peaks.bytes_per_s
    intensity = flops / nbytes if nbytes else math.inf
    bound_by = "compute" if compute_s >= memory_s else "memory"
    return Roofline(int(flops), int(nbytes), intensity, max(compute_s, memory_s), bound_by)
    # END SOLUTION


def kernels_bound(costs: Sequence[NodeCost], peaks: Peaks) -> float:
    """The roofline bound of running each node as its own kernel: each pays its own bytes, the times add up.

    A node that declares extra passes over its output (FusedLinearReLU on CPU: addmm, then relu_) runs those as
    kernels of their own, pure memory traffic that cannot hide behind the matmul's compute.
    """
    return sum(
        roofline(c.flops, c.nbytes - c.extra_pass_bytes, peaks).bound_s + c.extra_pass_bytes / peaks.bytes_per_s
        for c in costs
    )


@dataclass(frozen=True)
class RowMetrics:
    speedup_vs_eager: float  # eager median / this median
    pct_of_limit: float  # roofline bound / this median, in percent (100 = at the ceiling)
    gbps: float  # effective bandwidth: the workload's minimum bytes / this median, in GB/s
    tflops: float  # achieved: the workload's FLOPs / this median, in TFLOP/s
    predicted_speedup: float | None  # roofline bound of eager's kernels / that of this variant's kernels


def row_metrics(
    median_s: float, eager_median_s: float, workload: Roofline, eager_kernels_s: float, variant_kernels_s: float | None
) -> RowMetrics:
    """What one table row says about one variant: measured speedup, % of the roofline limit, and the prediction.

    ``workload`` is the roofline of the whole workload (its FLOPs and *minimum* bytes); ``eager_kernels_s`` and
    ``variant_kernels_s`` are :func:`kernels_bound` of the eager graph and of this variant's graph (None: unknown).

    >>> w = Roofline(flops=1_000_000, nbytes=4_000_000, intensity=0.25, bound_s=2e-6, bound_by="memory")
    >>> m = row_metrics(4e-6, 8e-6, w, eager_kernels_s=6e-6, variant_kernels_s=3e-6)
    >>> m.speedup_vs_eager, m.pct_of_limit, m.gbps, m.predicted_speedup
    (2.0, 50.0, 1000.0, 2.0)
    """
    # TODO(human): compute the measured speedup vs eager, the bound as a percentage of the measured time, the effective GB/s and TFLOP/s, and the predicted speedup. Hint: speedup = eager / this; % of limit = 100 * bound / this; GB/s = bytes / this / 1e9; predicted = eager_kernels_s / variant_kernels_s
    # BEGIN SOLUTION
    predicted = eager_kernels_s / variant_kernels_s if variant_kernels_s else None
    return RowMetrics(
        speedup_vs_eager=eager_median_s / median_s,
        pct_of_limit=100.0 * workload.bound_s / median_s,
        gbps=workload.nbytes / median_s / 1e9,
        tflops=workload.flops / median_s / 1e12,
        predicted_speedup=predicted,
    )
    # END SOLUTION


# ----------------------------------------------------------------------------------------------------------------------
# Timing: Timer.blocked_autorange, variants interleaved round by round, median and IQR of all the blocks.


def make_timer(device: str) -> Callable[[], float]:
    """The clock Timer reads. On CUDA, kernels run asynchronously: synchronize before reading the clock, or you time
    only how fast Python *queues* work."""
    if device == "cuda":

        def cuda_timer() -> float:
            torch.cuda.synchronize()
            return timeit.default_timer()

        return cuda_timer
    return timeit.default_timer


def time_interleaved(
    fns: dict[str, Callable[[], object]],
    *,
    rounds: int,
    min_run_time: float,
    threads: int,
    timer: Callable[[], float] = timeit.default_timer,
) -> dict[str, list[float]]:
    """Time every function in ``fns`` for ``rounds`` rounds, one after another inside each round (A B C A B C ...).

    Returns each name's per-call times in seconds: the ``.times`` of every blocked_autorange Measurement (each entry
    is one block's average). Interleaving means a slow phase of the machine (a neighbour, thermal throttling) hits
    every variant alike, so their *ratio* stays meaningful.
    """
    # TODO(human): time each fn round-robin for `rounds` rounds with torch.utils.benchmark.Timer(...).blocked_autorange, collecting every Measurement.times. Hint: Timer(stmt='fn()', globals={'fn': fn}, num_threads=threads, timer=timer); the inner loop is over fns, the outer over rounds
    # BEGIN SOLUTION
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            timer_ = tbench.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads, timer=timer, description=name)
            times[name].extend(timer_.blocked_autorange(min_run_time=min_run_time).times)
    return times
    # END SOLUTION


def summarize(times: Sequence[float]) -> tuple[float, float]:
    """(median, IQR) of a list of times."""
    p25, p50, p75 = np.percentile(np.asarray(times, dtype=float), [25, 50, 75])
    return float(p50), float(p75 - p25)


def measure_peaks(config: Config, threads: int) -> Peaks:
    """This machine's ceilings: bandwidth from a large copy (bytes read + written), compute from a large matmul.

    The best block wins: a ceiling is what the machine *can* do. Small probes (``--quick``) underestimate both.
    """
    sizes, dev, dtype = SIZES[config.sizes], torch.device(config.device), config.dtype
    src = torch.ones(sizes.copy_numel, dtype=dtype, device=dev)  # touch every page before timing
    dst = torch.empty_like(src).fill_(0)
    n = sizes.matmul_n
    g = torch.Generator().manual_seed(config.seed)
    a = torch.randn(n, n, generator=g).to(dev, dtype)
    b = torch.randn(n, n, generator=g).to(dev, dtype)
    c = torch.empty(n, n, dtype=dtype, device=dev)
    fns = {"copy": lambda: dst.copy_(src), "matmul": lambda: torch.mm(a, b, out=c)}
    for fn in fns.values():  # warm-up: first-touch, cuBLAS handles, clocks up
        fn()
    times = time_interleaved(
        fns, rounds=2, min_run_time=max(sizes.min_run_time, 0.01), threads=threads, timer=make_timer(config.device)
    )
    copy_bytes = 2 * src.numel() * src.element_size()
    peaks = Peaks(
        flops_per_s=2 * n**3 / min(times["matmul"]),
        bytes_per_s=copy_bytes / min(times["copy"]),
        copy_bytes=copy_bytes,
        matmul_n=n,
        dtype=str(dtype).removeprefix("torch."),
        copy_times_s=tuple(times["copy"]),
        matmul_times_s=tuple(times["matmul"]),
    )
    return peaks


# ----------------------------------------------------------------------------------------------------------------------
# Workloads and their variants


class VariantUnavailable(Exception):
    """This variant cannot run here (its phase is not written or not solved yet, or torch.compile failed)."""


def load_phase(module: str, phase: int):
    """``fusion.<module>`` if it exists; otherwise VariantUnavailable('phase N not available ...')."""
    name = f"fusion.{module}"
    if importlib.util.find_spec(name) is None:
        raise VariantUnavailable(f"phase {phase} not available ({name} is not written yet)")
    return importlib.import_module(name)


def _call_pass(fn: Callable[[nn.Module], nn.Module], model: nn.Module, phase: int) -> nn.Module:
    try:
        return fn(model)
    except NotImplementedError as e:
        if str(e).startswith("TODO(human)"):
            raise VariantUnavailable(f"phase {phase} exercise not solved yet") from e
        raise


def fuse_linear_relu(model: nn.Module) -> nn.Module:
    return _call_pass(load_phase("manual_fusion", 2).fuse_linear_relu, model, 2)


def fuse_matmul_add_relu(model: nn.Module) -> nn.Module:
    return _call_pass(load_phase("pattern_rewriter", 3).fuse_matmul_add_relu, model, 3)


def fuse_conv_bn(model: nn.Module) -> nn.Module:
    return _call_pass(load_phase("conv_bn_fusion", 5).fuse_conv_bn, model.eval(), 5)


class AddcmulChain(nn.Module):
    """``relu(x*a + b)*c + x`` hand-fused into three kernels instead of five, with PyTorch's own fused ops.

    There is no FX pass for elementwise chains in phases 2/3/5 (a single generated kernel is what torch.compile —
    and phase 6's regions — are for), so this variant shows how far existing fused ops take you: ``addcmul`` is
    ``input + t1 * t2`` in one pass.
    """

    def __init__(self, chain: models.ElementwiseChain):
        super().__init__()
        self.a, self.b, self.c = chain.a, chain.b, chain.c

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., d)
        h = torch.addcmul(self.b, x, self.a)  # b + x*a: one kernel instead of two
        h = torch.relu_(h)  # in place: h is ours
        return torch.addcmul(x, h, self.c)  # x + h*c: one kernel instead of two


def hand_fuse_chain(model: nn.Module) -> nn.Module:
    return AddcmulChain(copy.deepcopy(model))


def _linear_relu(k: int, n: int, seed: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(k, n), nn.ReLU())


@dataclass
class Workload:
    key: str
    title: str
    shape: str
    build: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]  # float32, CPU, eval mode
    fuse: Callable[[nn.Module], nn.Module]
    fused_label: str
    channels_last: bool = False
    # more variants built from the FX-fused float32 model: (name, label, build(fused, config)); build raises
    # VariantUnavailable with the reason when the variant cannot run here
    extras: tuple[tuple[str, str, Callable[[nn.Module, Config], nn.Module]], ...] = ()


def cudnn_epilogue_after_fold(folded: nn.Module, config: Config) -> nn.Module:
    """Phase 5's folded model + :func:`fuse_conv_relu_epilogue`, on CUDA with cuDNN only."""
    why = cudnn_epilogue_unavailable(config.device, config.dtype)
    if why:
        raise VariantUnavailable(why)
    return fuse_conv_relu_epilogue(folded)


def workloads(config: Config) -> list[Workload]:
    s, seed = SIZES[config.sizes], config.seed
    (m1, k1, n1), (m2, k2, n2) = s.linear_memory, s.linear_compute
    mb, dims = s.matmul
    cb, cin, cw, cs = s.conv
    er, ed = s.elementwise
    cuda = config.device == "cuda"
    mm_shape = " → ".join(map(str, dims))
    return [
        Workload(
            "linear_relu_memory",
            "Linear+ReLU, memory-bound",
            f"x {m1}×{k1} @ W {k1}×{n1}",
            lambda: (_linear_relu(k1, n1, seed), models.matmul_inputs(m1, k1, seed=seed + 1)),
            fuse_linear_relu,
            "FX phase 2: FusedLinearReLU",
        ),
        Workload(
            "linear_relu_compute",
            "Linear+ReLU, compute-bound",
            f"x {m2}×{k2} @ W {k2}×{n2}",
            lambda: (_linear_relu(k2, n2, seed), models.matmul_inputs(m2, k2, seed=seed + 1)),
            fuse_linear_relu,
            "FX phase 2: FusedLinearReLU",
        ),
        Workload(
            "matmul_add_relu",
            "relu(x@w+b), 2 layers",
            f"x {mb}×{dims[0]}, {mm_shape}",
            lambda: (models.MatmulAddReLU(*dims, seed=seed), models.matmul_inputs(mb, dims[0], seed=seed + 1)),
            fuse_matmul_add_relu,
            "FX phase 3: fused_matmul_add_relu",
        ),
        Workload(
            "conv_bn_relu",
            "Conv+BN+ReLU net",
            f"x {cb}×{cin}×{cs}×{cs}, width {cw}" + (", channels_last" if cuda else ""),
            lambda: (
                models.ConvBNNet(cin, cw, seed=seed).eval(),
                models.conv_inputs(cb, cin, cs, seed=seed + 1),
            ),
            fuse_conv_bn,
            "FX phase 5: Conv+BN folded",
            channels_last=cuda,
            extras=(("fx_epilogue", "FX phase 5 + cuDNN epilogue", cudnn_epilogue_after_fold),),
        ),
        Workload(
            "elementwise_chain",
            "relu(x*a+b)*c + x",
            f"x {er}×{ed}",
            lambda: (models.ElementwiseChain(ed, seed=seed), models.elementwise_inputs(er, ed, seed=seed + 1)),
            hand_fuse_chain,
            "hand-fused: addcmul, relu_, addcmul",
        ),
    ]


def _prepare(model: nn.Module, config: Config, channels_last: bool) -> nn.Module:
    """Device, dtype and layout for a float32 CPU model (fuse first, in float32: folding is more exact there)."""
    model = model.to(device=config.device, dtype=config.dtype).eval().requires_grad_(False)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    wrong = [
        n
        for n, t in (*model.named_parameters(), *model.named_buffers())
        if t.is_floating_point() and (t.dtype != config.dtype or t.device.type != config.device)
    ]
    if wrong:
        raise RuntimeError(f"{type(model).__name__}: {wrong[:3]} did not move to {config.device}/{config.dtype}")
    return model


def _prepare_inputs(inputs: Sequence[torch.Tensor], config: Config, channels_last: bool) -> tuple[torch.Tensor, ...]:
    out = []
    for x in inputs:
        x = x.to(device=config.device, dtype=config.dtype)
        if channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        out.append(x)
    return tuple(out)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_memory(fn: Callable[[], object], device: str) -> int | None:
    """Peak bytes allocated *above what was already resident* during one call (CUDA only; None on CPU)."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def _event_device_us(e: object) -> float:
    """A profiler event's time on the device, in µs. Attribute names differ across torch versions."""
    rng = getattr(e, "time_range", None)
    if rng is not None and hasattr(rng, "elapsed_us"):
        return float(rng.elapsed_us())
    for attr in ("device_time_total", "cuda_time_total", "self_device_time_total", "self_cuda_time_total"):
        if hasattr(e, attr):
            return float(getattr(e, attr))
    return 0.0


def gpu_profile(fn: Callable[[], object], calls: int = 20, top: int = 4) -> dict | None:
    """What the GPU did during ``calls`` calls of ``fn`` (torch.profiler, CUDA activity): per call, the sum of the
    kernel times, the number of kernels, and the ``top`` kernels by time. None if the profiler is unavailable.

    Wall time per call minus GPU time per call is time the GPU sat idle, waiting for the CPU (Python, dispatch,
    kernel launch): with asynchronous launches a call costs max(CPU time, GPU time), so a gap means the CPU sets the
    pace — overhead, not bytes.
    """
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Profiler clears events at the end of each cycle": one cycle here
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
        device_types = {torch.autograd.DeviceType.CUDA}
        kernels = [e for e in prof.events() if getattr(e, "device_type", None) in device_types]
    except Exception as e:  # a profiler that does not work here must not cost the timings
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(_event_device_us(e))
    total_us = sum(sum(ts) for ts in by_name.values())
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    return {
        "calls": calls,
        "gpu_s": total_us / calls / 1e6,
        "kernels_per_call": len(kernels) / calls,
        "top": [
            {"name": name, "per_call": len(ts) / calls, "us_per_call": sum(ts) / calls, "share": sum(ts) / total_us}
            for name, ts in ranked[:top]
        ]
        if total_us
        else [],
    }


def _rel_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref64 = ref.detach().double()
    scale = ref64.abs().max().item() or 1.0
    return (out.detach().double() - ref64).abs().max().item() / scale


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-3 if dtype in (torch.float32, torch.float64) else 5e-2


@dataclass
class Variant:
    name: str  # "eager" | "fx" | "compile"
    label: str
    available: bool = True
    reason: str = ""
    times_s: list[float] = field(default_factory=list)
    median_s: float | None = None
    iqr_s: float | None = None
    speedup_vs_eager: float | None = None
    predicted_speedup: float | None = None
    pct_of_limit: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    peak_memory_bytes: int | None = None
    intermediate_bytes: int | None = None
    bytes_removed: int | None = None
    kernels_bound_s: float | None = None
    kernels: int | None = None
    max_rel_diff: float | None = None
    outputs_match: bool | None = None
    compile_s: float | None = None
    fusion_report: list[dict] | None = None
    kernel_paths: list[str] = field(default_factory=list)
    gpu: dict | None = None  # CUDA: gpu_profile() of one call (kernel time, kernels per call, top kernels)
    gpu_speedup: float | None = None  # eager's GPU kernel time / this one's: what the roofline's bytes predict
    overhead_s: float | None = None  # median wall time - GPU kernel time: the part of a call the GPU did not work


def _report_rows(gm: nn.Module) -> list[dict] | None:
    try:
        rep = report_of(gm)
    except (KeyError, AttributeError):
        return None
    return [{"pattern": d.pattern, "nodes": list(d.nodes), "fused": d.fused, "reason": d.reason} for d in rep.decisions]


def run_workload(w: Workload, config: Config, peaks: Peaks, threads: int, log: Callable[[str], None]) -> dict:
    """Build, check and time the variants of one workload; return its raw numbers as a dict."""
    s = SIZES[config.sizes]
    model32, inputs32 = w.build()
    variants: dict[str, Variant] = {"eager": Variant("eager", "eager")}
    modules: dict[str, nn.Module] = {}

    fused32 = None
    try:
        fused32 = w.fuse(model32)
    except VariantUnavailable as e:
        variants["fx"] = Variant("fx", w.fused_label, available=False, reason=str(e))
    except Exception as e:  # a broken pass must not cost the other measurements; the table says what happened
        variants["fx"] = Variant("fx", w.fused_label, available=False, reason=f"failed: {type(e).__name__}: {e}")
    eager = _prepare(model32, config, w.channels_last)
    inputs = _prepare_inputs(inputs32, config, w.channels_last)
    modules["eager"] = eager
    if fused32 is not None:
        variants["fx"] = Variant("fx", w.fused_label, fusion_report=_report_rows(fused32))
        modules["fx"] = _prepare(fused32, config, w.channels_last)
    for name, label, build in w.extras:
        try:
            if fused32 is None:
                raise VariantUnavailable("it is built on the FX-fused model, which is not available")
            extra32 = build(fused32, config)
        except VariantUnavailable as e:
            variants[name] = Variant(name, label, available=False, reason=str(e))
        except Exception as e:
            variants[name] = Variant(name, label, available=False, reason=f"failed: {type(e).__name__}: {e}")
        else:
            variants[name] = Variant(name, label, fusion_report=_report_rows(extra32))
            modules[name] = _prepare(extra32, config, w.channels_last)
    del model32, fused32, inputs32

    # Costs: every node of the eager graph and of the fused graph, from ShapeProp's shapes on the real inputs.
    eager_costs = graph_costs(trace_module(eager), *inputs)
    ref = eager(*inputs)
    workload_roof = roofline(sum(c.flops for c in eager_costs), min_bytes(eager, inputs, ref), peaks)
    eager_kernels_s = kernels_bound(eager_costs, peaks)
    eager_inter = intermediate_bytes(eager_costs)
    costs = {"eager": eager_costs}
    for name, mod in modules.items():
        if name != "eager":  # torch.compile comes later; its kernels are not ours to count
            costs[name] = graph_costs(mod if isinstance(mod, fx.GraphModule) else trace_module(mod), *inputs)

    if config.compile:
        variants["compile"] = Variant("compile", "torch.compile(eager)")
        note = " (on CPU Inductor generates and builds C++: tens of seconds)" if config.device == "cpu" else ""
        log(f"    torch.compile: compiling {w.key}{note} ...")
        compiled = torch.compile(eager)
        t0 = time.perf_counter()
        try:
            compiled(*inputs)
            _sync(config.device)
            modules["compile"] = compiled
            variants["compile"].compile_s = time.perf_counter() - t0
            log(f"    torch.compile: first call took {variants['compile'].compile_s:.1f} s")
        except Exception as e:
            variants["compile"].available = False
            variants["compile"].reason = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            log(f"    torch.compile failed: {variants['compile'].reason}")

    # Same answer first: a fast wrong model is not a result.
    for name, mod in modules.items():
        v = variants[name]
        out = mod(*inputs)
        v.max_rel_diff = _rel_diff(out, ref) if name != "eager" else 0.0
        v.outputs_match = v.max_rel_diff <= _tolerance(config.dtype)
        if not v.outputs_match:
            log(f"    WARNING: {name} differs from eager by {v.max_rel_diff:.2e} (relative to max |eager|)")
        del out

    def caller(mod: nn.Module) -> Callable[[], object]:
        return lambda: mod(*inputs)

    fns = {name: caller(mod) for name, mod in modules.items()}
    for fn in fns.values():  # warm-up: cuDNN autotuning, caches, lazy inits
        for _ in range(3):
            fn()
    _sync(config.device)
    for name, fn in fns.items():
        variants[name].peak_memory_bytes = peak_memory(fn, config.device)

    times = time_interleaved(
        fns, rounds=s.rounds, min_run_time=s.min_run_time, threads=threads, timer=make_timer(config.device)
    )
    if config.device == "cuda":  # what the GPU did per call: kernel time, kernel count, the top kernels
        for name, fn in fns.items():
            variants[name].gpu = gpu_profile(fn)

    eager_median = summarize(times["eager"])[0]
    for name, v in variants.items():
        if name not in times:
            continue
        v.times_s = times[name]
        v.median_s, v.iqr_s = summarize(times[name])
        if name in costs:
            v.intermediate_bytes = intermediate_bytes(costs[name])
            v.kernel_paths = sorted({c.kernel_path for c in costs[name] if c.kernel_path})
            v.bytes_removed = eager_inter - v.intermediate_bytes
            v.kernels_bound_s = kernels_bound(costs[name], peaks)
            v.kernels = len(costs[name])
        else:  # torch.compile: we cannot see its kernels; predict the ideal of one kernel per workload
            v.kernels_bound_s = workload_roof.bound_s
        m = row_metrics(v.median_s, eager_median, workload_roof, eager_kernels_s, v.kernels_bound_s)
        v.speedup_vs_eager, v.pct_of_limit, v.gbps, v.tflops = m.speedup_vs_eager, m.pct_of_limit, m.gbps, m.tflops
        v.predicted_speedup = m.predicted_speedup
        eager_gpu = variants["eager"].gpu
        if v.gpu and eager_gpu and v.gpu.get("gpu_s") and eager_gpu.get("gpu_s"):
            v.gpu_speedup = eager_gpu["gpu_s"] / v.gpu["gpu_s"]
            v.overhead_s = v.median_s - v.gpu["gpu_s"]

    result = {
        "key": w.key,
        "title": w.title,
        "shape": w.shape,
        "dtype": str(config.dtype).removeprefix("torch."),
        "channels_last": w.channels_last,
        "flops": workload_roof.flops,
        "min_bytes": workload_roof.nbytes,
        "intensity": workload_roof.intensity,
        "bound_s": workload_roof.bound_s,
        "bound_by": workload_roof.bound_by,
        "eager_kernels_bound_s": eager_kernels_s,
        "eager_intermediate_bytes": eager_inter,
        "nodes": {name: [asdict(c) for c in cs] for name, cs in costs.items()},
        "variants": [asdict(v) for v in variants.values()],
    }
    return result


def _record_error(result: dict, w: Workload, e: BaseException, log: Callable[[str], None]) -> None:
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    log(f"    FAILED: {w.key}: {type(e).__name__}: {e}\n{text}")
    result["errors"].append({"workload": w.key, "error": f"{type(e).__name__}: {e}", "traceback": text})


def _free(config: Config) -> None:
    """Drop the last workload's models and compiled code before the next one (GPU memory, Dynamo's caches)."""
    if config.compile:
        torch._dynamo.reset()
    gc.collect()
    if config.device == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------------------------------
# The whole benchmark


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def benchmark(config: Config, log: Callable[[str], None] = print, json_path: str | None = None) -> dict:
    """Run every workload under ``config``; return (and, with ``json_path``, save after each workload) every number."""
    if config.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"--device cuda, but CUDA is not available (torch {torch.__version__}, built with CUDA "
            f"{torch.version.cuda}). Fix: run with --device cpu, or on a machine with a GPU"
        )
    threads = config.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(config.seed)
    if config.device == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick its fastest conv for every variant
    result: dict = {
        "schema": SCHEMA_VERSION,
        "complete": False,
        "meta": {
            "device": config.device,
            "device_name": device_name(config.device),
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "python_version": platform.python_version(),
            "platform": platform.platform(),
            "threads": threads,
            "cpu_count": os.cpu_count(),
            "seed": config.seed,
            "dtype": str(config.dtype).removeprefix("torch."),
            "sizes": config.sizes,
            "quick": config.quick,
            "compile": config.compile,
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if config.device == "cuda" else None,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        },
        "workloads": [],
        "errors": [],
    }
    with torch.no_grad():
        log(f"measuring this machine's peaks ({config.device}, {result['meta']['dtype']}) ...")
        peaks = measure_peaks(config, threads)
        result["peaks"] = asdict(peaks)
        log(
            f"  bandwidth {peaks.bytes_per_s / 1e9:.1f} GB/s (copy of {peaks.copy_bytes / 2e6:.0f} MB, read+write), "
            f"compute {peaks.flops_per_s / 1e12:.3g} TFLOP/s ({peaks.matmul_n}³ matmul), "
            f"ridge {peaks.ridge:.1f} FLOP/byte"
        )
        for w in workloads(config):
            log(f"  {w.key}: {w.shape}")
            try:
                result["workloads"].append(run_workload(w, config, peaks, threads, log))
            except NotImplementedError as e:
                if is_todo(e):
                    raise  # an unsolved exercise of this phase: the lesson runner shows it as TODO
                _record_error(result, w, e, log)
            except Exception as e:  # one broken workload (an OOM, a pass bug) must not cost the others
                _record_error(result, w, e, log)
            _free(config)
            if json_path:
                save_json(result, json_path)
    result["complete"] = True
    result["targets"] = check_targets(result)
    if json_path:
        save_json(result, json_path)
    return result


def save_json(result: dict, path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, allow_nan=True)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------------------
# Entry points


def run(
    quick: bool = False,
    *,
    device: str | None = None,
    compile: bool = True,
    json_path: str | None = None,
    plot_path: str | None = None,
    sizes: str | None = None,
    threads: int = 0,
) -> None:
    """The lesson: measure the peaks, run every workload, print the table (and save JSON / the picture)."""
    config = default_config(device, quick=quick, compile=compile)
    config = dataclasses.replace(config, sizes=sizes or config.sizes, threads=threads or config.threads)
    if not config.compile:
        why = "--quick" if quick else "--no-compile"
        print(f"(torch.compile skipped: {why})")
    elif config.device == "cpu":
        print("(torch.compile on CPU: Inductor writes and compiles C++ for each workload — tens of seconds each)")

    def log(msg: str) -> None:
        print(msg, flush=True)

    result = benchmark(config, log=log, json_path=json_path)
    print_report(result)
    if json_path:
        print(f"\nraw numbers: {json_path}")
    if plot_path:
        plot_roofline(result, plot_path)
        print(f"roofline picture: {plot_path}")
    if result["errors"]:
        failed = ", ".join(e["workload"] for e in result["errors"])
        raise RuntimeError(f"{len(result['errors'])} workload(s) failed: {failed} (tracebacks above and in the JSON)")


def main(argv: Sequence[str] | None = None) -> int:
    first = (__doc__ or "").strip().splitlines()[0]
    p = argparse.ArgumentParser(prog="python -m fusion.benchmark", description=first)
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available, else cpu")
    p.add_argument("--quick", action="store_true", help="smaller CPU sizes, fewer rounds, no torch.compile (CI)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    p.add_argument("--json", metavar="PATH", help="write every raw number (and device, torch, threads, date) here")
    p.add_argument("--plot", metavar="PATH", help="save a roofline picture (needs matplotlib: uv run --extra plot)")
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads (default: torch.get_num_threads(); 1 with --quick on CPU)"
    )
    p.add_argument("--tiny", action="store_true", help="toy shapes: checks the harness in seconds, numbers meaningless")
    args = p.parse_args(argv)
    if args.plot and not have_matplotlib():
        print(PLOT_HINT, file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"--device cuda: CUDA is not available here (torch {torch.__version__}). Fix: --device cpu", file=sys.stderr
        )
        return 2
    return run_lesson(
        lambda: run(
            quick=args.quick,
            device=args.device,
            compile=not args.no_compile,
            json_path=args.json,
            plot_path=args.plot,
            sizes="tiny" if args.tiny else None,
            threads=args.threads,
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
