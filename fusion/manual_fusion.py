"""Phase 2 — manual fusion: a hand-written torch.fx pass that turns Linear+ReLU into one fused module.

Run it:   uv run python -m fusion.manual_fusion
Test it:  uv run pytest -m phase2

What you learn
--------------
* The four steps of every graph rewrite, done by hand on ``gm.graph.nodes``:

  1. **match**   — find a ``call_module`` node whose module is an ``nn.Linear`` and whose only user is a ReLU of it,
     in any spelling (``nn.ReLU``, ``F.relu``, ``torch.relu``, ``torch.relu_``, ``x.relu()``, ``x.relu_()``;
     in-place or not).
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
  Linear, and for whatever the fused module would not reproduce (:func:`linear_refusal`, :func:`relu_refusal`): an
  uninitialized ``LazyLinear``, a subclass that overrides ``forward``, a weight computed on access, hooks.
  One ``nn.Linear`` called at several sites stays correct at every site: each site is judged on its own, and the
  fused module shares the Linear's parameters, so the sites keep sharing one set of weights.

* **Why bother: the fused kernel is real.** On CUDA ``torch._addmm_activation(bias, x, weight.t())`` asks cuBLASLt to
  apply the bias and the ReLU in the GEMM's *epilogue*, while the output tile is still in registers: the ``(M, N)``
  output is written once instead of written, read back and written again by a separate ReLU kernel (Phase 4 times
  the difference). On the CPU PyTorch has no such kernel: the fused module runs ``addmm`` then an in-place
  ``relu_``, which is exact. The machinery (a backward and autocast for ``_addmm_activation``, the rule that
  predicts the kernel path, the profiler) lives in ``fusion/kernels/cublaslt.py``; the run shows what really ran.

Where the report lives: ``fusion.common.report_of(gm)`` (the same object as ``gm.meta["fusion_report"]``).

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
from collections import Counter

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from fusion import models
from fusion.common import (
    FusionReport,
    attach_report,
    copy_to_graph_module,
    finish_rewrite,
    heading,
    lesson_cli,
    max_abs_diff,
    shorten,
    show_rewrite,
    table,
    target_name,
)
from fusion.compiler import registry
from fusion.kernels.cublaslt import KERNEL_PATHS, addmm_relu, predict_kernel_path, show_kernel_paths  # noqa: F401

PATTERN = "Linear+ReLU"


# ----------------------------------------------------------------------------------------------------------------------
# The pass


def fuse_linear_relu(model: nn.Module) -> fx.GraphModule:
    """Fuse every ``nn.Linear`` call whose output's only user is a ReLU of it into a :class:`FusedLinearReLU`.

    Accepts an ``nn.Module`` or a ``GraphModule`` and never mutates it: the pass works on a traced deep copy
    (:func:`fusion.common.copy_to_graph_module`). Every Linear call it looked at is in the returned module's report,
    fused or skipped with the reason: ``fusion.common.report_of(gm)``. An untraceable model raises
    :class:`fusion.common.UntraceableModelError` naming the model, the line and the fix.
    """
    gm = copy_to_graph_module(model, what="fuse_linear_relu")
    graph = gm.graph
    report = FusionReport("fuse_linear_relu")
    modules = dict(gm.named_modules())
    call_sites = Counter(n.target for n in graph.nodes if n.op == "call_module")
    installed: dict[str, str] = {}  # Linear's qualified name -> its FusedLinearReLU's qualified name

    # TODO(human): for every call_module node of an nn.Linear: if its output has exactly one user, that user is a ReLU reading it (relu_spelling, relu_input), and linear_refusal and relu_refusal give no reason, replace the two nodes by one call of the module install_fused returns and report.fuse(PATTERN, [linear.name, relu.name]); otherwise report.skip(PATTERN, [linear.name, ...], reason). Hint: node.users tells who reads the Linear; the helpers below the pass name the legality rules; the report lists every Linear call once. More: iterate over a copy of the node list, since the graph changes as you go; the new call reads the Linear's own args and must come after everything the ReLU reads, so insert it at the ReLU (graph.inserting_after); the ReLU's users then read the new node (Node.replace_all_uses_with), and the two old nodes leave the graph, each after its users (Graph.erase_node)
    # BEGIN SOLUTION
    for node in list(graph.nodes):
        if node.op != "call_module" or not isinstance(modules[node.target], nn.Linear):
            continue
        # 1. match: the Linear's output must have exactly one user, and that user must be a ReLU of it
        users = list(node.users)
        if len(users) != 1:
            names = ", ".join(u.name for u in users)
            why = f"{len(users)} users ({names}): the others read the pre-ReLU value" if users else "output unused"
            report.skip(PATTERN, [node.name], why)
            continue
        relu = users[0]
        spelling = relu_spelling(relu, modules)
        if spelling is None or relu_input(relu) is not node:
            why = f"its only user, {target_name(relu)}, is not a ReLU of it"
            report.skip(PATTERN, [node.name, relu.name], why)
            continue
        refusal = linear_refusal(modules[node.target]) or relu_refusal(relu, modules)
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
# The fused module: relu(x @ W.T + b) in one call


@torch.fx.wrap  # a graph that calls this stays a graph: re-tracing a fused model records one call, not its insides
def fused_linear_relu(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``relu(F.linear(input, weight, bias))`` as one fused call: ``input (..., K)``, ``weight (N, K)`` -> ``(..., N)``.

    On CUDA: :func:`~fusion.kernels.cublaslt.addmm_relu` (bias + ReLU in the cuBLASLt epilogue). Elsewhere, or when
    ``K == 0``: ``addmm`` then ``relu_`` in place, which is exact. Any number of leading dims; ``bias`` may be None.
    """
    if input.dim() == 0:
        raise ValueError("fused_linear_relu needs an input with at least 1 dimension (..., in_features), got a scalar")
    # TODO(human): return relu(input @ weight.T + bias) of shape (..., N) for input (..., K) with any number of leading dims (none too), computed on input viewed as (M, K): on CUDA with K > 0 by one addmm_relu call, otherwise by torch.addmm (torch.mm when bias is None) then relu_ in place. Hint: addmm and addmm_relu take 2-D inputs only; M is the product of the leading dims. More: fold every leading dim into M (math.prod of no dims is 1, so a 1-D input works too), compute on the (M, K) view, and give the (M, N) result its leading dims back; the weight is (N, K) and addmm multiplies by a (K, N) matrix: a transpose is a view, not a copy
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
        refusal = linear_refusal(linear, check_hooks=False)
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
        return predict_kernel_path(x, self.weight, self.bias, explain=explain)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


# ----------------------------------------------------------------------------------------------------------------------
# What the pass calls: a ReLU in any spelling, the legality rules, installing the fused module

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


def _hooks(module: nn.Module) -> str:
    """The per-module hooks ``module`` has ('' for none): a fused module would run none of them."""
    kinds = (
        ("forward hooks", module._forward_hooks),
        ("forward pre-hooks", module._forward_pre_hooks),
        ("backward hooks", module._backward_hooks),
        ("backward pre-hooks", module._backward_pre_hooks),
    )
    return ", ".join(kind for kind, hooks in kinds if hooks)


def linear_refusal(linear: nn.Module, check_hooks: bool = True) -> str | None:
    """Why this module must not be replaced by a FusedLinearReLU (a non-empty reason), or None if it may."""
    if not isinstance(linear, nn.Linear):
        return f"{type(linear).__name__} is not an nn.Linear"
    if type(linear).forward is not nn.Linear.forward:
        return f"{type(linear).__name__} overrides nn.Linear.forward: the fused module would not compute what it does"
    if isinstance(linear.weight, nn.parameter.UninitializedParameter):
        return f"{type(linear).__name__} is not initialized yet: run one forward pass first"
    if not isinstance(linear.weight, nn.Parameter):
        return "its weight is computed on access (a parametrization?), not a Parameter the fused module can share"
    if check_hooks and _hooks(linear):
        return f"the Linear has {_hooks(linear)}: the fused module would not run them"
    return None


def relu_refusal(node: fx.Node, modules: dict[str, nn.Module]) -> str | None:
    """Why the ReLU ``node`` must not be fused away (a non-empty reason), or None if it may. Only a ReLU *module*
    can refuse: a subclass overriding ``forward`` computes something else, and its hooks would not run."""
    if node.op != "call_module":
        return None
    relu = modules[node.target]
    if type(relu).forward is not nn.ReLU.forward:
        return f"{type(relu).__name__} overrides nn.ReLU.forward"
    if _hooks(relu):
        return f"the ReLU has {_hooks(relu)}: the fused module would not run them"
    return None


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
        name, i = linear_target.replace(".", "_") + "_relu", 1
        while hasattr(gm, name):
            name, i = f"{linear_target.replace('.', '_')}_relu_{i}", i + 1
        gm.add_submodule(name, fused)
    installed[linear_target] = name
    return name


# ----------------------------------------------------------------------------------------------------------------------
# The lesson


def module_table(gm: fx.GraphModule) -> str:
    """One row per node, with the class of each called module: a Linear turned FusedLinearReLU shows here."""
    rows = [
        (
            n.op,
            n.name,
            shorten(target_name(n), 24),
            type(gm.get_submodule(n.target)).__name__ if n.op == "call_module" else "",
            shorten(n.args, 34),
            ", ".join(u.name for u in n.users),
        )
        for n in gm.graph.nodes
    ]
    return table(rows, ["opcode", "name", "target", "module", "args", "users"])


def _show_pass(title: str, model: nn.Module, x: torch.Tensor) -> fx.GraphModule:
    after = "fuse_linear_relu (the `module` column: which Linears became a FusedLinearReLU)"
    gm = show_rewrite(title, model, fuse_linear_relu, module_table, after)

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
    device, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
    k = n = (1024 if quick else 4096) if device == "cuda" else 256
    linear = nn.Linear(k, n, device=device, dtype=dtype)
    x = torch.randn(64, k, device=device, dtype=dtype)  # (M, K)
    show_kernel_paths(FusedLinearReLU(linear), lambda t: torch.relu(linear(t)), x)


def main(argv: list[str] | None = None) -> int:
    return lesson_cli(run, __doc__, argv)


registry.register(2, fuse_linear_relu=fuse_linear_relu)  # what Phase 4 measures (fusion/compiler/registry.py)
if __name__ == "__main__":
    raise SystemExit(main())
