"""Phase 2 — manual fusion: a hand-written torch.fx pass that turns Linear+ReLU into one fused module.

Run it:   uv run python -m fusion.manual_fusion
Test it:  uv run pytest -m phase2

What you learn
--------------
* The four steps of every graph rewrite, done by hand on ``gm.graph.nodes``:

  1. **match**   — find a ``call_module`` node whose module is an ``nn.Linear`` and whose only user is a ReLU,
     in any of its six spellings (``nn.ReLU``, ``F.relu``, ``torch.relu``, ``torch.relu_``, ``x.relu()``,
     ``x.relu_()``; in-place or not).
  2. **replace** — put a :class:`FusedLinearReLU` (sharing the Linear's parameters) into the GraphModule and add a
     ``call_module`` node that calls it.
  3. **rewire**  — ``relu.replace_all_uses_with(fused)``: everyone who read the ReLU's output now reads the fused one.
  4. **clean up** — erase the old nodes; ``graph.lint()``, dead-code elimination, ``delete_all_unused_submodules()``,
     ``recompile()``. (Careful: fx's default dead-code elimination deletes an in-place statement such as
     ``h.relu_()`` whose result nobody reads, although it changes ``h``; :func:`fusion.common.finish_rewrite`
     keeps those.)

* **Legality before speed.** Fusing hides the Linear's pre-ReLU output. If anything else reads it (a residual add,
  a second ReLU, the return statement), fusing would hand that reader the wrong value, so the pass leaves the pair
  alone and its :class:`~fusion.common.FusionReport` says why. Same for a ReLU that is not *directly* after the
  Linear, an uninitialized ``LazyLinear``, a Linear subclass that overrides ``forward``, and modules with hooks
  (the fused module would not run them).
  One ``nn.Linear`` called at several sites stays correct at every site: each site is judged on its own, and the
  fused module shares the Linear's parameters, so the sites keep sharing one set of weights.

* **Why bother: the fused kernel is real.** ``torch._addmm_activation(bias, x, weight.t())`` asks cuBLASLt to apply
  the bias and the ReLU in the GEMM's *epilogue*, while the output tile is still in registers: the ``(M, N)`` output
  is written once instead of written, read back and written again by a separate ReLU kernel (Phase 4 times the
  difference). PyTorch gives ``_addmm_activation`` no backward and leaves it off CUDA's autocast list;
  :func:`addmm_relu` supplies both. On the CPU PyTorch has no such kernel; the fused module runs ``addmm`` then an
  in-place ``relu_``, which is exact.
  :meth:`FusedLinearReLU.kernel_path` tells you which path an input takes; the phase run also *profiles* the
  kernels that actually ran.

Where the report lives: ``fusion.common.report_of(gm)`` (the same object as ``gm.meta["fusion_report"]``).

    >>> import torch
    >>> from fusion import models
    >>> from fusion.common import report_of
    >>> model = models.FunctionalMLP()
    >>> gm = fuse_linear_relu(model)
    >>> [d.nodes for d in report_of(gm).fused]
    [('fc1', 'relu'), ('fc2', 'relu_1'), ('fc3', 'relu_2'), ('fc4', 'relu_3')]
    >>> (x,) = models.mlp_inputs()
    >>> torch.testing.assert_close(gm(x), model(x))
"""

from __future__ import annotations

import math
import os
import warnings
from collections import Counter

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from fusion import models
from fusion.common import (
    FusionReport,
    aten_ops,
    attach_report,
    copy_to_graph_module,
    finish_rewrite,
    heading,
    lesson_cli,
    max_abs_diff,
    node_table,
    report_of,
    shorten,
    table,
    target_name,
)

PATTERN = "Linear+ReLU"

# ----------------------------------------------------------------------------------------------------------------------
# The kernel paths FusedLinearReLU can take, and how to predict which one an input takes

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

    Pure Python on plain values, so it is testable without a GPU. The CUDA rule mirrors PyTorch's own test for
    handing ``addmm`` to cuBLASLt (``aten/src/ATen/native/cuda/Blas.cpp``): a contiguous 1-D bias of length ``n``
    (always true here), a floating dtype, both dimensions of ``W.T`` larger than 1, and ``DISABLE_ADDMM_CUDA_LT``
    unset. It was checked against the profiler on the lent H100 with torch 2.11 (``m == 1`` still took cuBLASLt
    there; some newer PyTorch sources also require ``m > 1``). cuBLASLt picks the kernels itself: usually one, but
    for some fp32 shapes it splits K and adds a separate epilogue kernel. The phase run profiles what really ran.

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


def _any_autocast() -> bool:
    """Is autocast on for any device? One C call (~0.1 µs): the hot path of :func:`addmm_relu` asks this before
    building ``x.device`` (~0.4 µs) for :func:`_autocast_dtype`. A memory-bound Linear+ReLU on a GPU takes ~15 µs,
    so the Python around the kernel shows in Phase 4's timings. Older torch without the helper: assume it might be."""
    probe = getattr(torch._C, "_is_any_autocast_enabled", None)
    return True if probe is None else probe()


def _autocast_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a matmul really runs in: autocast turns float32 (not float64) into its lower precision."""
    if dtype == torch.float32 and device_type in ("cuda", "cpu") and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return dtype


# ----------------------------------------------------------------------------------------------------------------------
# The fused op: relu(x @ W.T + b) in one call


class _AddmmReLUFunction(torch.autograd.Function):
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
    """``relu(x2d @ weight.T + bias)`` through ``torch._addmm_activation``, made safe to use anywhere.

    Three things PyTorch leaves to the caller: a backward (see :class:`_AddmmReLUFunction`; skipped when nothing
    needs a gradient, so inference pays nothing for it), autocast (``_addmm_activation`` is not on CUDA's autocast
    list: without the explicit cast a bf16 autocast region would run this GEMM in fp32, or fail on mixed dtypes),
    and a missing bias (the epilogue needs a bias vector: a zero one adds exactly nothing).
    """
    if x2d.dtype != weight.dtype or _any_autocast():  # rare; the common path skips it (see _any_autocast)
        dtype = _autocast_dtype(x2d.device.type, x2d.dtype)
        if dtype != x2d.dtype or dtype != weight.dtype:  # do autocast's cast ourselves, where autograd can see it
            x2d, weight = x2d.to(dtype), weight.to(dtype)
            bias = bias.to(dtype) if bias is not None else None
    if bias is None:
        bias = weight.new_zeros(weight.shape[0])  # (N,): x + 0.0 == x, and the ReLU makes -0.0 and 0.0 alike
    if torch.is_grad_enabled() and (x2d.requires_grad or weight.requires_grad or bias.requires_grad):
        return _AddmmReLUFunction.apply(x2d, weight, bias)
    return torch._addmm_activation(bias, x2d, weight.t())


@torch.fx.wrap  # a graph that calls this stays a graph: re-tracing a fused model records one call, not its insides
def fused_linear_relu(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``relu(F.linear(input, weight, bias))`` as one fused call: ``input (..., K)``, ``weight (N, K)`` -> ``(..., N)``.

    On CUDA: ``torch._addmm_activation`` (bias + ReLU in the cuBLASLt epilogue). Elsewhere, or when ``K == 0``:
    ``addmm`` then ``relu_`` in place, which is exact. Any number of leading dims; ``bias`` may be None.
    """
    if input.dim() == 0:
        raise ValueError("fused_linear_relu needs an input with at least 1 dimension (..., in_features), got a scalar")
    # TODO(human): compute relu(input @ weight.T + bias) for an input of shape (..., K). Hint: flatten the leading dims to one with reshape, call addmm_relu on CUDA when K > 0, else torch.addmm (or torch.mm without bias) then relu_, and reshape back to (..., N)
    # BEGIN SOLUTION
    *lead, k = input.shape
    n = weight.shape[0]
    flat = len(lead) != 1  # a 2-D input needs no reshape (and a reshape costs a dispatcher call even when it is free)
    x2d = input.reshape(math.prod(lead), k) if flat else input  # (M, K), M = product of the leading dims
    if input.is_cuda and k > 0:
        out = addmm_relu(x2d, weight, bias)  # (M, N): one cuBLASLt call with the bias+ReLU epilogue
    else:
        out = torch.addmm(bias, x2d, weight.t()) if bias is not None else torch.mm(x2d, weight.t())  # (M, N)
        out = out.relu_()  # in place is safe: addmm's backward never reads its output
    return out.reshape(*lead, n) if flat else out  # (..., N)
    # END SOLUTION


def _linear_refusal(linear: nn.Module, check_hooks: bool = True) -> str | None:
    """Why this module must not be replaced by a FusedLinearReLU, or None if it may."""
    if not isinstance(linear, nn.Linear):
        return f"{type(linear).__name__} is not an nn.Linear"
    if type(linear).forward is not nn.Linear.forward:
        return f"{type(linear).__name__} overrides nn.Linear.forward: the fused module would not compute what it does"
    if isinstance(linear.weight, nn.parameter.UninitializedParameter):
        return f"{type(linear).__name__} is not initialized yet: run one forward pass first"
    if not isinstance(linear.weight, nn.Parameter):
        return "its weight is computed on access (a parametrization?), not a Parameter the fused module can share"
    if check_hooks and (linear._forward_hooks or linear._forward_pre_hooks):
        return "it has forward hooks, which the fused module would not run"
    return None


class FusedLinearReLU(nn.Module):
    """``relu(linear(x))`` in one fused call, built from an existing ``nn.Linear``.

    It **shares** the Linear's Parameter objects (``fused.weight is linear.weight``), it does not copy them: tied
    weights stay tied, an optimizer over either module updates both, and one Linear fused at several call sites
    is still one set of parameters. Its state_dict keys are the Linear's (``weight``, ``bias``). It does not run
    the Linear's hooks.

    >>> linear = nn.Linear(4, 3)
    >>> fused = FusedLinearReLU(linear)
    >>> fused.weight is linear.weight
    True
    >>> x = torch.randn(2, 5, 4)
    >>> torch.testing.assert_close(fused(x), torch.relu(linear(x)))
    >>> fused.kernel_path(x)
    'addmm+relu_'
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        refusal = _linear_refusal(linear, check_hooks=False)
        if refusal:
            raise TypeError(f"FusedLinearReLU needs a plain nn.Linear: {refusal}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_parameter("weight", linear.weight)  # (N, K): the same Parameter object, shared
        self.register_parameter("bias", linear.bias)  # (N,) or None

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # input: (..., in_features) -> (..., out_features)
        params = self._parameters  # a dict lookup: self.weight goes through nn.Module.__getattr__ (~0.5 µs each)
        if "weight" not in params:  # parametrized after fusing: the computed weight lives elsewhere
            return fused_linear_relu(input, self.weight, self.bias)
        return fused_linear_relu(input, params["weight"], params["bias"])

    def kernel_path(self, x: torch.Tensor, explain: bool = False) -> str:
        """Which kernel path ``self(x)`` takes (a key of :data:`KERNEL_PATHS`); ``explain=True`` adds the why."""
        m = math.prod(x.shape[:-1])
        dtype = _autocast_dtype(x.device.type, torch.promote_types(x.dtype, self.weight.dtype))
        path, why = select_kernel_path(x.device.type, dtype, m, self.in_features, self.out_features)
        if path in (CUBLASLT_EPILOGUE, CUDA_GEMM_THEN_RELU) and self.bias is None:
            why += " (this Linear has no bias: one tiny fill kernel first makes the zero bias the epilogue reads)"
        return f"{path}: {why}" if explain else path

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


# ----------------------------------------------------------------------------------------------------------------------
# Matching: a ReLU in any spelling

RELU_FUNCTIONS = (F.relu, torch.relu, torch.relu_, torch.Tensor.relu, torch.Tensor.relu_)  # F.relu_ is torch.relu_
RELU_METHODS = ("relu", "relu_")


def relu_spelling(node: fx.Node, modules: dict[str, nn.Module]) -> str | None:
    """How ``node`` spells a ReLU ("nn.ReLU(inplace=True)", "F.relu", "Tensor.relu_", ...), or None if it is none."""
    if node.op == "call_module" and isinstance(modules.get(node.target), nn.ReLU):
        return "nn.ReLU(inplace=True)" if modules[node.target].inplace else "nn.ReLU"
    if node.op == "call_function" and node.target in RELU_FUNCTIONS:
        inplace = node.kwargs.get("inplace", node.args[1] if len(node.args) > 1 else False)
        name = target_name(node).replace("torch.nn.functional.", "F.").replace("torch.Tensor.", "Tensor.")
        return f"{name}(inplace=True)" if inplace is True else name
    if node.op == "call_method" and node.target in RELU_METHODS:
        return f"Tensor.{node.target}"
    return None


def relu_input(node: fx.Node) -> object:
    """The value a ReLU node reads (its first argument, positional or ``input=``/``self=``)."""
    return node.args[0] if node.args else node.kwargs.get("input", node.kwargs.get("self"))


def _relu_refusal(node: fx.Node, modules: dict[str, nn.Module]) -> str | None:
    if node.op != "call_module":
        return None
    relu = modules[node.target]
    if type(relu).forward is not nn.ReLU.forward:
        return f"{type(relu).__name__} overrides nn.ReLU.forward"
    if relu._forward_hooks or relu._forward_pre_hooks:
        return f"the ReLU module {node.target} has forward hooks, which the fused module would not run"
    return None


# ----------------------------------------------------------------------------------------------------------------------
# Replacing: install the fused module


def _free_name(gm: fx.GraphModule, base: str) -> str:
    name, i = base, 1
    while hasattr(gm, name):
        name, i = f"{base}_{i}", i + 1
    return name


def install_fused(gm: fx.GraphModule, linear_target: str, call_sites: Counter, installed: dict[str, str]) -> str:
    """Put a :class:`FusedLinearReLU` for the Linear at ``linear_target`` into ``gm``; return its qualified name.

    A Linear called at one site is replaced *in place* (same name, so the state_dict keys do not change). A Linear
    called at several sites keeps its name for the sites that are not fused; the fused ones call a new module
    (``<name>_relu``) sharing its parameters. Each Linear gets at most one fused module (``installed`` remembers).
    """
    if linear_target in installed:
        return installed[linear_target]
    fused = FusedLinearReLU(gm.get_submodule(linear_target))
    if call_sites[linear_target] == 1:
        name = linear_target
        parent, _, leaf = linear_target.rpartition(".")
        setattr(gm.get_submodule(parent), leaf, fused)
    else:
        name = _free_name(gm, linear_target.replace(".", "_") + "_relu")
        gm.add_submodule(name, fused)
    installed[linear_target] = name
    return name


# ----------------------------------------------------------------------------------------------------------------------
# Cleaning up without losing in-place statements


# ----------------------------------------------------------------------------------------------------------------------
# The pass


def fuse_linear_relu(model: nn.Module) -> fx.GraphModule:
    """Fuse every ``nn.Linear`` whose output's only user is a ReLU into a :class:`FusedLinearReLU`.

    Accepts an ``nn.Module`` or a ``GraphModule`` and never mutates it: the pass works on a traced deep copy
    (:func:`fusion.common.copy_to_graph_module`). Every Linear it looked at is in the returned module's report,
    fused or skipped with the reason: ``fusion.common.report_of(gm)``. An untraceable model raises
    :class:`fusion.common.UntraceableModelError` naming the model, the line and the fix.
    """
    gm = copy_to_graph_module(model, what="fuse_linear_relu")
    graph = gm.graph
    report = FusionReport("fuse_linear_relu")
    modules = dict(gm.named_modules())
    call_sites = Counter(n.target for n in graph.nodes if n.op == "call_module")
    installed: dict[str, str] = {}  # Linear's qualified name -> its FusedLinearReLU's qualified name

    # TODO(human): fuse each Linear whose only user is a ReLU of it, and report every Linear fused or skipped with why. Hint: node.users, relu_spelling, relu_input, install_fused, graph.inserting_after, replace_all_uses_with, erase_node
    # BEGIN SOLUTION
    for node in list(graph.nodes):
        if node.op != "call_module" or not isinstance(modules[node.target], nn.Linear):
            continue
        # 1. match: the Linear's output must have exactly one user, and that user must be a ReLU of it
        users = list(node.users)
        if len(users) != 1:
            why = (
                "its output is never used"
                if not users
                else (
                    f"its output has {len(users)} users ({', '.join(u.name for u in users)}): "
                    "fusing would hide the pre-ReLU value that all but one of them read"
                )
            )
            report.skip(PATTERN, [node.name], why)
            continue
        relu = users[0]
        spelling = relu_spelling(relu, modules)
        if spelling is None or relu_input(relu) is not node:
            report.skip(
                PATTERN,
                [node.name, relu.name],
                f"its only user is {target_name(relu)}, not a ReLU of it: the ReLU must come directly after",
            )
            continue
        refusal = _linear_refusal(modules[node.target]) or _relu_refusal(relu, modules)
        if refusal:
            report.skip(PATTERN, [node.name, relu.name], refusal)
            continue
        # 2. replace: a fused module sharing the Linear's parameters, called by a new node with the Linear's inputs
        target = install_fused(gm, node.target, call_sites, installed)
        with graph.inserting_after(relu):
            fused = graph.create_node("call_module", target, node.args, node.kwargs, name=f"{node.name}_relu")
        fused.meta.update(relu.meta)  # it produces what the ReLU produced (shape, dtype, source location)
        # 3. rewire: whoever read the ReLU now reads the fused node
        relu.replace_all_uses_with(fused)
        # 4. clean up: the ReLU first (it reads the Linear), then the Linear
        graph.erase_node(relu)
        graph.erase_node(node)
        report.fuse(PATTERN, [node.name, relu.name], replacement=target, reason=f"ReLU spelled {spelling}")
    # END SOLUTION

    finish_rewrite(gm)  # lint, dead-code elimination, delete_all_unused_submodules, recompile
    return attach_report(gm, report)


# ----------------------------------------------------------------------------------------------------------------------
# Seeing which kernels really ran


def launched_kernels(fn, *args: torch.Tensor) -> list[str]:
    """Run ``fn(*args)`` once and return what really ran, measured rather than predicted: the CUDA kernels it
    launched (from the profiler) for CUDA inputs, else the ATen ops it dispatched (below autograd, where each op
    is one CPU kernel call). Compare with :meth:`FusedLinearReLU.kernel_path`."""
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


# ----------------------------------------------------------------------------------------------------------------------
# The lesson


def _show_pass(title: str, model: nn.Module, x: torch.Tensor) -> fx.GraphModule:
    heading(title, "-")
    print("Before:")
    print(node_table(copy_to_graph_module(model)))
    gm = fuse_linear_relu(model)
    print("\nAfter fuse_linear_relu:")
    print(node_table(gm))
    print("\nReport (report_of(gm)):")
    print(report_of(gm).table())

    # forward and gradient equivalence against the unfused model, on the same random input
    x_ref, x_fused = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y_fused = model(x_ref), gm(x_fused)
    y_ref.square().sum().backward()
    y_fused.square().sum().backward()
    fused_params = dict(gm.named_parameters())  # single-site Linears are replaced in place: same names
    grad_diff = max(max_abs_diff(p.grad, fused_params[name].grad) for name, p in model.named_parameters())
    print(
        f"\nmax |fused - unfused| on x{tuple(x.shape)}: output {max_abs_diff(y_fused, y_ref):.3g}, "
        f"input grad {max_abs_diff(x_fused.grad, x_ref.grad):.3g}, parameter grads {grad_diff:.3g}"
    )
    model.zero_grad(set_to_none=True)
    return gm


def run(quick: bool = False) -> None:
    torch.manual_seed(0)
    heading("Phase 2 — manual fusion: Linear+ReLU -> FusedLinearReLU")
    print("match (a Linear whose only user is a ReLU) -> replace (a FusedLinearReLU) -> rewire (replace_all_uses_with)")
    print("-> clean up (erase, lint, DCE, delete unused submodules, recompile)")

    x = torch.randn(2, 3, 32)  # (B, T, d_in): leading dims are flattened and restored by the fused module
    _show_pass(
        "MLP: nested Sequentials, and `skip`, whose output feeds the ReLU *and* the residual add", models.MLP(), x
    )
    print("`skip` stays unfused: `act` would get the fused output, but the add needs skip's output *before* the ReLU.")
    gm = _show_pass("FunctionalMLP: F.relu, torch.relu, .relu(), F.relu(inplace=True)", models.FunctionalMLP(), x)
    print("\ngm.code:")
    print(gm.code.strip())

    heading("Which kernel path FusedLinearReLU takes on this device", "-")
    if torch.cuda.is_available():
        size = 1024 if quick else 4096
        device, dtype, shape = "cuda", torch.bfloat16, (64, size, size)
    else:
        device, dtype, shape = "cpu", torch.float32, (64, 256, 256)
    m, k, n = shape
    linear = nn.Linear(k, n, device=device, dtype=dtype)
    fused = FusedLinearReLU(linear)
    xk = torch.randn(m, k, device=device, dtype=dtype)
    print(f"device {device}, {str(dtype).removeprefix('torch.')}, x ({m}, {k}), weight ({n}, {k}):")
    path = fused.kernel_path(xk)
    print(f"  predicted path: {path} = {KERNEL_PATHS[path]}")
    print(f"  why: {fused.kernel_path(xk, explain=True).split(': ', 1)[1]}")
    kind = "CUDA kernels (profiler)" if device == "cuda" else "ATen ops (dispatcher)"
    for label, fn in (("unfused relu(linear(x))", lambda t: torch.relu(linear(t))), ("FusedLinearReLU", fused)):
        names = launched_kernels(fn, xk)
        print(f"  measured, {label}: {len(names)} {kind}")
        for name in names:
            print(f"    {shorten(name, 70)}")
    with torch.no_grad():
        print(f"  max |fused - unfused| = {max_abs_diff(fused(xk), torch.relu(linear(xk))):.3g}")
    if device != "cuda":
        print("No GPU here: on CUDA the same module calls torch._addmm_activation, one cuBLASLt GEMM whose epilogue")
        print("adds the bias and applies the ReLU. The table below is what kernel_path predicts there:")
    rows = []
    for dev, dt, mm_, kk, nn_ in [
        ("cuda", torch.bfloat16, 64, 4096, 4096),
        ("cuda", torch.float32, 8, 32, 64),
        ("cuda", torch.float32, 8, 32, 1),
        ("cuda", torch.float32, 8, 0, 64),
        ("cpu", torch.float32, 64, 4096, 4096),
    ]:
        p, why = select_kernel_path(dev, dt, mm_, kk, nn_)
        rows.append((dev, str(dt).removeprefix("torch."), f"({mm_}, {kk}) x ({kk}, {nn_})", p))
    print(table(rows, ["device", "dtype", "x @ W.T", "predicted path"]))


def main(argv: list[str] | None = None) -> int:
    return lesson_cli(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
