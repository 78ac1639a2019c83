"""Phase 2's kernel back-end: ``relu(x @ W.T + b)`` as one cuBLASLt GEMM whose epilogue adds the bias and applies the
ReLU, made safe to call anywhere (autograd, autocast, no bias), and the rule that predicts which kernels an input
really gets. The lesson (``fusion/manual_fusion.py``) calls :func:`addmm_relu`, :func:`predict_kernel_path` and
:func:`show_kernel_paths`; nothing here needs reading to do its exercises, and nothing here imports a lesson.

* :func:`addmm_relu` — ``torch._addmm_activation(bias, x, W.T)``: PyTorch gives it no backward and leaves it off
  CUDA's autocast list; this supplies both (:class:`AddmmReLUFunction`, :func:`autocast_dtype`).
* :func:`select_kernel_path` — pure Python on plain values (testable without a GPU): which of :data:`KERNEL_PATHS`
  ``relu(x @ W.T + b)`` takes on a device, dtype and shape.
* :func:`launched_kernels` — what really ran, measured: CUDA kernels from the profiler, else ATen ops dispatched;
  :func:`show_kernel_paths` prints prediction and measurement side by side (the lesson's last section).
"""

from __future__ import annotations

import math
import os
import warnings

import torch

from fusion.common import aten_ops, max_abs_diff, shorten, table

CUBLASLT_EPILOGUE = "cublaslt-epilogue"  # CUDA: one cuBLASLt GEMM call; bias and ReLU run in its epilogue
CUDA_GEMM_THEN_RELU = "cuda-gemm+relu"  # CUDA, cuBLASLt refused: _addmm_activation itself does copy, GEMM, relu_
ADDMM_THEN_RELU = "addmm+relu_"  # no fused kernel (CPU, ...): addmm, then relu_ in place on its output
EMPTY = "empty"  # the output has no elements: no kernel runs at all

KERNEL_PATHS = {
    CUBLASLT_EPILOGUE: "cuBLASLt GEMM with the bias+ReLU epilogue: the output is written once",
    CUDA_GEMM_THEN_RELU: "bias copy, cuBLAS GEMM, then a separate ReLU kernel (three passes over the output)",
    ADDMM_THEN_RELU: "addmm, then relu_ in place (two passes over the output; exact, autograd-safe)",
    EMPTY: "empty output: nothing to compute",
}

_LT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def select_kernel_path(device_type: str, dtype: torch.dtype, m: int, k: int, n: int) -> tuple[str, str]:
    """Predict the kernel path of ``relu(x @ W.T + b)`` for ``x: (m, k)``, ``W: (n, k)``; return ``(path, why)``.

    The CUDA rule mirrors PyTorch's own test for handing ``addmm`` to cuBLASLt (``aten/src/ATen/native/cuda/Blas.cpp``):
    a contiguous 1-D bias of length ``n`` (always true here), a floating dtype, both dimensions of ``W.T`` larger
    than 1, and ``DISABLE_ADDMM_CUDA_LT`` unset. It was checked against the profiler on the lent H100 with torch 2.11
    (``m == 1`` still took cuBLASLt there; some newer PyTorch sources also require ``m > 1``). cuBLASLt picks the
    kernels itself: usually one, but for some fp32 shapes it splits K and adds a separate epilogue kernel. The phase
    run profiles what really ran.

    >>> select_kernel_path("cuda", torch.bfloat16, 64, 4096, 4096)[0]
    'cublaslt-epilogue'
    >>> select_kernel_path("cpu", torch.float32, 64, 4096, 4096)[0]
    'addmm+relu_'
    """
    if m == 0 or n == 0:
        return EMPTY, f"the output is ({m}, {n}): nothing to compute"
    if device_type != "cuda":
        return ADDMM_THEN_RELU, f"PyTorch has no fused Linear+ReLU kernel on {device_type}: addmm, then relu_ in place"
    if k == 0:
        return ADDMM_THEN_RELU, (
            "in_features == 0: torch._addmm_activation on CUDA returns the bias *without* the ReLU for an empty "
            "reduction (a PyTorch short-circuit), so the fused module uses addmm then relu_"
        )
    if os.environ.get("DISABLE_ADDMM_CUDA_LT") == "1":
        return CUDA_GEMM_THEN_RELU, "DISABLE_ADDMM_CUDA_LT=1 turns PyTorch's cuBLASLt path for addmm off"
    if dtype not in _LT_DTYPES:
        return CUDA_GEMM_THEN_RELU, f"cuBLASLt's addmm path takes float64/32/16 and bfloat16, not {dtype}"
    if k <= 1 or n <= 1:
        return CUDA_GEMM_THEN_RELU, (
            f"cuBLASLt's addmm path needs in_features > 1 and out_features > 1 (got {k} and {n}): "
            "_addmm_activation falls back to a GEMM plus a separate ReLU kernel"
        )
    return CUBLASLT_EPILOGUE, (
        f"CUDA, {str(dtype).removeprefix('torch.')}, K={k}, N={n}: torch._addmm_activation hands bias+ReLU to "
        "cuBLASLt as the GEMM's epilogue"
    )


def predict_kernel_path(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, explain: bool = False) -> str:
    """:func:`select_kernel_path` for ``relu(F.linear(x, weight, bias))`` with ``x: (..., K)``: the leading dims
    flatten to M, autocast decides the dtype; ``explain=True`` returns ``"<path>: <why>"``."""
    n, k = weight.shape
    m = math.prod(x.shape[:-1])  # M: the leading dims, flattened
    dtype = autocast_dtype(x.device.type, torch.promote_types(x.dtype, weight.dtype))
    path, why = select_kernel_path(x.device.type, dtype, m, k, n)
    if path in (CUBLASLT_EPILOGUE, CUDA_GEMM_THEN_RELU) and bias is None:
        why += " (this Linear has no bias: one tiny fill kernel first makes the zero bias the epilogue reads)"
    return f"{path}: {why}" if explain else path


# ----------------------------------------------------------------------------------------------------------------------
# Autocast: _addmm_activation is not on CUDA's autocast list, so the fused op does autocast's cast itself


def any_autocast() -> bool:
    """Is autocast on for any device? One C call (~0.1 µs): the hot path of :func:`addmm_relu` asks this before
    building ``x.device`` (~0.4 µs) for :func:`autocast_dtype`. A memory-bound Linear+ReLU on a GPU takes ~15 µs,
    so the Python around the kernel shows in Phase 4's timings. Older torch without the helper: assume it might be."""
    probe = getattr(torch._C, "_is_any_autocast_enabled", None)
    return True if probe is None else bool(probe())


def autocast_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a matmul really runs in: autocast turns float32 (not float64) into its lower precision."""
    if dtype == torch.float32 and device_type in ("cuda", "cpu") and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return dtype


# ----------------------------------------------------------------------------------------------------------------------
# The fused op with a backward: relu(x @ W.T + b) in one call


class AddmmReLUFunction(torch.autograd.Function):
    """``torch._addmm_activation(bias, x, W.T)`` with a backward: PyTorch defines none for ``_addmm_activation``
    ("derivative for aten::_addmm_activation is not implemented"), so training through it needs this.

    The backward is exactly what autograd does for ``relu(addmm(b, x, W.T))``: ReLU's own backward
    (``threshold_backward(grad, out, 0)``, reading the *output*, which is all the fused kernel keeps), then the three
    matmul/sum gradients of addmm.
    """

    @staticmethod
    def forward(ctx, x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        out = torch._addmm_activation(bias, x2d, weight.t())  # (M, N), bias and ReLU fused into the GEMM
        ctx.save_for_backward(x2d, weight, out)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x2d, weight, out = ctx.saved_tensors
        grad_pre = torch.ops.aten.threshold_backward(grad_out, out, 0)  # (M, N): zero where the ReLU clipped
        grad_x = grad_pre @ weight if ctx.needs_input_grad[0] else None  # (M, N) @ (N, K) -> (M, K)
        grad_w = grad_pre.t() @ x2d if ctx.needs_input_grad[1] else None  # (N, M) @ (M, K) -> (N, K)
        grad_b = grad_pre.sum(0) if ctx.needs_input_grad[2] else None  # (N,)
        return grad_x, grad_w, grad_b


def addmm_relu(x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``relu(x2d @ weight.T + bias)`` for ``x2d: (M, K)``, ``weight: (N, K)`` through ``torch._addmm_activation``
    (on CUDA: one cuBLASLt GEMM with the bias+ReLU epilogue), made safe to use anywhere.

    Three things PyTorch leaves to the caller: a backward (see :class:`AddmmReLUFunction`; skipped when nothing
    needs a gradient, so inference pays nothing for it), autocast (``_addmm_activation`` is not on CUDA's autocast
    list: without the explicit cast a bf16 autocast region would run this GEMM in fp32, or fail on mixed dtypes),
    and a missing bias (the epilogue needs a bias vector: a zero one adds exactly nothing). Careful: on CUDA with
    ``K == 0`` PyTorch returns the bias without the ReLU (see :func:`select_kernel_path`); callers avoid that case.
    """
    if x2d.dtype != weight.dtype or any_autocast():  # rare; the common path skips it (see any_autocast)
        dtype = autocast_dtype(x2d.device.type, x2d.dtype)
        if dtype != x2d.dtype or dtype != weight.dtype:  # do autocast's cast ourselves, where autograd can see it
            x2d, weight = x2d.to(dtype), weight.to(dtype)
            bias = bias.to(dtype) if bias is not None else None
    if bias is None:
        bias = weight.new_zeros(weight.shape[0])  # (N,): x + 0.0 == x, and the ReLU makes -0.0 and 0.0 alike
    if torch.is_grad_enabled() and (x2d.requires_grad or weight.requires_grad or bias.requires_grad):
        return AddmmReLUFunction.apply(x2d, weight, bias)
    return torch._addmm_activation(bias, x2d, weight.t())


# ----------------------------------------------------------------------------------------------------------------------
# Seeing which kernels really ran


def launched_kernels(fn, *args: torch.Tensor) -> list[str]:
    """Run ``fn(*args)`` once and return what really ran, measured rather than predicted: the CUDA kernels it
    launched (from the profiler) for CUDA inputs, else the ATen ops it dispatched (below autograd, where each op
    is one CPU kernel call). Compare with :func:`predict_kernel_path`."""
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    with torch.no_grad():
        if cuda:
            from torch.profiler import ProfilerActivity, profile

            fn(*args)  # warm up: cuBLAS handles, heuristics, lazy init
            torch.cuda.synchronize()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Profiler clears events at the end of each cycle": one cycle here
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    fn(*args)
                    torch.cuda.synchronize()
                return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

        return [f"aten::{op}" for op in aten_ops(fn, *args)]


def show_kernel_paths(fused, unfused, x: torch.Tensor) -> None:
    """Print the kernel path ``fused(x)`` is predicted to take, what ``fused`` and ``unfused`` really ran on ``x``
    (a ``(M, K)`` input), and the paths predicted for a few CUDA shapes: Phase 2's "why bother"."""
    (m, k), dtype = x.shape, str(x.dtype).removeprefix("torch.")
    print(f"device {x.device.type}, {dtype}, x ({m}, {k}), weight {tuple(fused.weight.shape)}:")
    path, why = fused.kernel_path(x, explain=True).split(": ", 1)
    print(f"  predicted path: {path} = {KERNEL_PATHS[path]}")
    print(f"  why: {why}")
    kind = "CUDA kernels (profiler)" if x.is_cuda else "ATen ops (dispatcher)"
    for label, fn in (("unfused relu(linear(x))", unfused), ("FusedLinearReLU", fused)):
        names = launched_kernels(fn, x)
        print(f"  measured, {label}: {len(names)} {kind}")
        for name in names:
            print(f"    {shorten(name, 70)}")
    with torch.no_grad():
        print(f"  max |fused - unfused| = {max_abs_diff(fused(x), unfused(x)):.3g}")
    if not x.is_cuda:
        print("No GPU here: on CUDA the same module calls torch._addmm_activation, one cuBLASLt GEMM whose epilogue")
        print("adds the bias and applies the ReLU. The table below is what kernel_path predicts there:")
    rows = []
    for device, dt, mm, kk, nn in [
        ("cuda", torch.bfloat16, 64, 4096, 4096),
        ("cuda", torch.float32, 8, 32, 64),
        ("cuda", torch.float32, 8, 32, 1),
        ("cuda", torch.float32, 8, 0, 64),
        ("cpu", torch.float32, 64, 4096, 4096),
    ]:
        path, _ = select_kernel_path(device, dt, mm, kk, nn)
        rows.append((device, str(dt).removeprefix("torch."), f"({mm}, {kk}) x ({kk}, {nn})", path))
    print(table(rows, ["device", "dtype", "x @ W.T", "predicted path"]))
