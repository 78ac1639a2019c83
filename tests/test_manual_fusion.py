"""Phase 2: FusedLinearReLU (forward, gradients, kernel path), its kernel back-end (fusion.kernels.cublaslt), and the
fuse_linear_relu pass: every legality rule for every ReLU spelling, on demo models and on torchvision models.

The pass tests check the property — which Linear calls were fused, which skipped, and that the fused model computes
the same values and gradients (float64) — never the wording of a skip reason: a reason only has to be non-empty.
"""

import ast
import copy
import functools
import inspect
import re

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.utils import parametrize

from fusion import manual_fusion, models
from fusion.common import UntraceableModelError, report_of
from fusion.kernels import cublaslt
from fusion.kernels.cublaslt import (
    ADDMM_THEN_RELU,
    CUBLASLT_EPILOGUE,
    CUDA_GEMM_THEN_RELU,
    EMPTY,
    KERNEL_PATHS,
    addmm_relu,
    launched_kernels,
    select_kernel_path,
)
from fusion.manual_fusion import (
    FusedLinearReLU,
    fuse_linear_relu,
    fused_linear_relu,
    linear_refusal,
    module_table,
    relu_refusal,
)
from fusion.practice import is_workspace

pytestmark = pytest.mark.phase2

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

leading_dims = st.lists(st.integers(0, 4), min_size=0, max_size=3)  # 0–3 leading dims, an empty batch now and then
features = st.integers(1, 9)  # feature sizes, 1 included


def _linear(k: int, n: int, bias: bool = True, seed: int = 0, dtype=torch.float64, device="cpu") -> nn.Linear:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Linear(k, n, bias=bias).to(device=device, dtype=dtype)


def _randn(*shape, seed: int = 1, dtype=torch.float64, device="cpu") -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(device)


def _sgd_step(module: nn.Module, lr: float = 0.1) -> None:
    """One plain SGD step (torch.optim would import torch._dynamo: seconds, for a one-line update)."""
    with torch.no_grad():
        for p in module.parameters():
            p -= lr * p.grad


def _outputs(y) -> tuple[torch.Tensor, ...]:
    return tuple(y) if isinstance(y, tuple | list) else (y,)


def assert_same_forward_and_grads(model: nn.Module, fused: nn.Module, x: torch.Tensor, **tol) -> None:
    """fused(x) == model(x), and the input and parameter gradients of a non-trivial loss agree too. Both run under
    the same seed, so a LazyLinear initializes to the same values in each."""
    x_ref, x_fused = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        y_ref = _outputs(model(x_ref))
        torch.manual_seed(0)
        y_fused = _outputs(fused(x_fused))
    assert len(y_fused) == len(y_ref)
    loss_ref = loss_fused = 0
    for a, b in zip(y_fused, y_ref, strict=True):
        torch.testing.assert_close(a, b, **tol)
        w = torch.linspace(-1, 1, b.numel(), dtype=b.dtype, device=b.device).reshape(b.shape)
        loss_ref, loss_fused = loss_ref + (b * w).sum(), loss_fused + (a * w).sum()  # a gradient differing per element
    loss_ref.backward()
    loss_fused.backward()
    torch.testing.assert_close(x_fused.grad, x_ref.grad, **tol)
    fused_params = dict(fused.named_parameters())
    for name, p in model.named_parameters():
        # same name (a Linear replaced in place), else the fused module sharing it (a Linear fused at several sites)
        q = (
            fused_params[name]
            if name in fused_params
            else next((q for q in fused_params.values() if torch.equal(q, p)), None)
        )
        assert q is not None, f"the fused model lost parameter {name}"
        torch.testing.assert_close(q.grad, p.grad, **tol)


# ----------------------------------------------------------------------------------------------------------------------
# FusedLinearReLU (the exercise in fused_linear_relu)


@given(lead=leading_dims, k=features, n=features, bias=st.booleans(), permuted=st.booleans())
def test_fused_module_matches_linear_relu(lead, k, n, bias, permuted):
    linear = _linear(k, n, bias=bias)
    reference = nn.Sequential(linear, nn.ReLU())
    fused = FusedLinearReLU(linear)  # shares linear's parameters: one set of grads to compare
    x = _randn(k, *lead).movedim(0, -1) if permuted else _randn(*lead, k)  # (..., K), non-contiguous when permuted
    x_ref, x_fused = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y_fused = reference(x_ref), fused(x_fused)
    assert y_fused.shape == (*lead, n)
    torch.testing.assert_close(y_fused, y_ref)
    y_ref.sum().backward()
    ref = [x_ref.grad] + [p.grad.clone() for p in linear.parameters()]
    linear.zero_grad()
    y_fused.sum().backward()
    for got, want in zip([x_fused.grad] + [p.grad for p in linear.parameters()], ref, strict=True):
        torch.testing.assert_close(got, want)


def test_fused_module_is_bitwise_equal_on_cpu_float32():
    linear = _linear(32, 16, dtype=torch.float32)
    x = _randn(8, 32, dtype=torch.float32)
    assert torch.equal(FusedLinearReLU(linear)(x), torch.relu(linear(x)))  # same addmm, same relu: exact


def test_one_dimensional_input():
    linear = _linear(5, 3)
    x = _randn(5)
    y = FusedLinearReLU(linear)(x)
    assert y.shape == (3,)
    torch.testing.assert_close(y, torch.relu(linear(x)))


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_zero_in_features_still_applies_relu():
    linear = _linear(0, 4)
    with torch.no_grad():
        linear.bias.copy_(torch.tensor([1.0, -2.0, 0.5, -0.1], dtype=torch.float64))
    x = _randn(3, 0)
    torch.testing.assert_close(FusedLinearReLU(linear)(x), torch.relu(linear(x)))
    torch.testing.assert_close(addmm_relu(x, linear.weight, linear.bias), torch.relu(linear(x)))


def test_scalar_input_is_refused():
    with pytest.raises(ValueError, match="at least 1 dimension"):
        FusedLinearReLU(_linear(1, 1))(torch.tensor(1.0, dtype=torch.float64))


def test_functional_matches_f_linear():
    w, b, x = _randn(6, 4, seed=2), _randn(6, seed=3), _randn(2, 3, 4)
    torch.testing.assert_close(fused_linear_relu(x, w, b), F.relu(F.linear(x, w, b)))
    torch.testing.assert_close(fused_linear_relu(x, w), F.relu(F.linear(x, w)))


def test_fused_module_shares_parameters_and_trains_the_linear():
    linear = _linear(4, 3)
    fused = FusedLinearReLU(linear)
    assert fused.weight is linear.weight and fused.bias is linear.bias
    assert list(fused.state_dict()) == ["weight", "bias"]
    before = linear.weight.detach().clone()
    fused(_randn(5, 4)).sum().backward()
    _sgd_step(fused)
    assert not torch.equal(linear.weight.detach(), before)  # training the fused module trained the Linear
    assert FusedLinearReLU(_linear(4, 3, bias=False)).bias is None


class ScaledLinear(nn.Linear):
    """A Linear subclass that overrides forward. fx treats every module from torch.nn as a leaf (a call_module node),
    which is how a real one such as torch.ao.nn.qat.Linear reaches the pass: this one poses as one of them."""

    __module__ = "torch.nn.test_scaled"

    def forward(self, input):
        return 2 * super().forward(input)


class ShiftedReLU(nn.ReLU):
    """A ReLU subclass that overrides forward, posing as a torch.nn module so that fx keeps it a leaf."""

    __module__ = "torch.nn.test_shifted"

    def forward(self, input):
        return super().forward(input - 0.5)


def test_fused_module_refuses_what_it_cannot_stand_for():
    # the error names the module it cannot stand for (which class, not which words)
    with pytest.raises(TypeError, match="Conv1d"):
        FusedLinearReLU(nn.Conv1d(2, 2, 1))
    with pytest.raises(TypeError, match="ScaledLinear"):
        FusedLinearReLU(ScaledLinear(3, 3))
    with pytest.raises(TypeError, match="LazyLinear"):
        FusedLinearReLU(nn.LazyLinear(3))


# ----------------------------------------------------------------------------------------------------------------------
# The kernel back-end, fusion/kernels/cublaslt.py: addmm_relu (torch._addmm_activation + a hand-written backward,
# autocast) runs on the CPU too; which kernel path is predicted from plain values (no GPU needed) and checked against
# what really ran.


def test_kernel_names_other_code_reads_from_the_lesson_are_reexported():
    assert manual_fusion.KERNEL_PATHS is cublaslt.KERNEL_PATHS  # Phase 4's report describes the paths with it
    assert manual_fusion.addmm_relu is cublaslt.addmm_relu  # scripts/gpu_check.py times it


def test_kernel_module_does_not_import_the_lessons():
    """Dependencies point from lessons to machinery, never back."""
    from fusion.main import PHASES

    tree = ast.parse(inspect.getsource(cublaslt))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    lessons = {f"fusion.{p.module}" for p in PHASES}
    assert lessons and not imported & lessons, imported & lessons


@given(m=st.integers(1, 5), k=features, n=features, bias=st.booleans())
def test_addmm_relu_backward_matches_autograd(m, k, n, bias):
    x, w = _randn(m, k, seed=1).requires_grad_(), _randn(n, k, seed=2).requires_grad_()
    b = _randn(n, seed=3).requires_grad_() if bias else None
    out = addmm_relu(x, w, b)
    ref = torch.relu(F.linear(x, w, b))
    torch.testing.assert_close(out, ref)
    inputs = [t for t in (x, w, b) if t is not None]
    g = _randn(m, n, seed=4)
    for got, want in zip(torch.autograd.grad(out, inputs, g), torch.autograd.grad(ref, inputs, g), strict=True):
        torch.testing.assert_close(got, want)


def test_addmm_relu_gradcheck():
    x, w, b = (t.requires_grad_() for t in (_randn(3, 4, seed=1), _randn(5, 4, seed=2), _randn(5, seed=3)))
    assert torch.autograd.gradcheck(addmm_relu, (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: addmm_relu(x, w, None), (x, w))


def test_addmm_relu_without_grad_builds_no_graph():
    w = _randn(5, 4).requires_grad_()
    with torch.no_grad():
        assert addmm_relu(_randn(3, 4), w, None).grad_fn is None
    assert addmm_relu(_randn(3, 4), w, None).grad_fn is not None


def test_autocast_runs_in_lower_precision_like_linear():
    linear = _linear(16, 8, dtype=torch.float32)
    x = _randn(4, 16, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.relu(linear(x))
        got_module = FusedLinearReLU(linear)(x)
        got_addmm = addmm_relu(x, linear.weight.detach().requires_grad_(), linear.bias)  # the CUDA branch
    assert got_module.dtype == got_addmm.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got_module, want)
    torch.testing.assert_close(got_addmm, want, atol=2e-2, rtol=2e-2)
    got_addmm.float().sum().backward()  # the cast is visible to autograd: the float32 parameters get float32 grads
    assert linear.bias.grad.dtype == torch.float32


@pytest.mark.parametrize(
    "device, dtype, mkn, path",
    [
        ("cuda", torch.bfloat16, (64, 4096, 4096), CUBLASLT_EPILOGUE),
        ("cuda", torch.float16, (8, 32, 64), CUBLASLT_EPILOGUE),
        ("cuda", torch.float32, (8, 32, 64), CUBLASLT_EPILOGUE),
        ("cuda", torch.float64, (8, 32, 64), CUBLASLT_EPILOGUE),
        ("cuda", torch.float32, (1, 32, 64), CUBLASLT_EPILOGUE),  # measured on torch 2.11: m == 1 takes cuBLASLt
        ("cuda", torch.float32, (8, 1, 64), CUDA_GEMM_THEN_RELU),
        ("cuda", torch.float32, (8, 32, 1), CUDA_GEMM_THEN_RELU),
        ("cuda", torch.complex64, (8, 32, 64), CUDA_GEMM_THEN_RELU),
        ("cuda", torch.float32, (8, 0, 64), ADDMM_THEN_RELU),  # _addmm_activation would skip the ReLU
        ("cuda", torch.float32, (0, 32, 64), EMPTY),
        ("cpu", torch.float32, (64, 4096, 4096), ADDMM_THEN_RELU),
        ("cpu", torch.float32, (8, 32, 0), EMPTY),
        ("mps", torch.float16, (8, 32, 64), ADDMM_THEN_RELU),
    ],
)
def test_select_kernel_path(device, dtype, mkn, path):
    got, why = select_kernel_path(device, dtype, *mkn)
    assert got == path
    assert got in KERNEL_PATHS and why


def test_disabling_cublaslt_is_predicted(monkeypatch):
    monkeypatch.setenv("DISABLE_ADDMM_CUDA_LT", "1")
    path, why = select_kernel_path("cuda", torch.bfloat16, 64, 64, 64)
    assert path == CUDA_GEMM_THEN_RELU and "DISABLE_ADDMM_CUDA_LT" in why


def test_kernel_path_of_module_on_cpu_and_what_really_ran():
    """The TODO's task names the CPU ops (addmm, or mm without a bias, then relu_ in place): kernel_path predicts
    them, and the dispatcher shows them."""
    fused = FusedLinearReLU(_linear(8, 4, dtype=torch.float32))
    x = _randn(2, 3, 8, dtype=torch.float32)
    assert fused.kernel_path(x) == ADDMM_THEN_RELU
    assert fused.kernel_path(x, explain=True).startswith(f"{ADDMM_THEN_RELU}: ")
    assert fused.kernel_path(x[:0]) == EMPTY
    ran = launched_kernels(fused, x)  # the ATen ops the CPU really dispatched
    assert "aten::addmm" in ran and "aten::relu_" in ran and "aten::_addmm_activation" not in ran
    no_bias = launched_kernels(FusedLinearReLU(_linear(8, 4, bias=False, dtype=torch.float32)), x)
    assert "aten::mm" in no_bias and "aten::relu_" in no_bias


# ----------------------------------------------------------------------------------------------------------------------
# The pass: one Linear and one ReLU, in every spelling and every wiring, against every legality rule


def _fused_calls(gm: fx.GraphModule) -> list[fx.Node]:
    return [
        n for n in gm.graph.nodes if n.op == "call_module" and isinstance(gm.get_submodule(n.target), FusedLinearReLU)
    ]


def _fused_modules(gm: fx.GraphModule) -> list[str]:
    return [n.target for n in _fused_calls(gm)]


def _relu_nodes(gm: fx.GraphModule) -> list[str]:
    return [
        n.name
        for n in gm.graph.nodes
        if (n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.ReLU))
        or (n.op == "call_function" and n.target in (F.relu, torch.relu, torch.relu_))
        or (n.op == "call_method" and n.target in ("relu", "relu_"))
    ]


def _linear_calls(model: nn.Module) -> list[str]:
    """The names of the Linear call nodes in the traced model (what the report must account for, each once)."""
    graph = fx.Tracer().trace(model)  # the graph alone: no copy, and the model is left as it was
    return [
        n.name for n in graph.nodes if n.op == "call_module" and isinstance(model.get_submodule(n.target), nn.Linear)
    ]


def check_fusion(model: nn.Module, fused: list[str], x: torch.Tensor | None = None) -> fx.GraphModule:
    """fuse_linear_relu(model) fuses exactly the Linear calls ``fused`` (node names), reports every Linear call once
    (fused, or skipped with a non-empty reason), calls one FusedLinearReLU per fused site, and — given ``x`` —
    computes the same values and gradients as ``model`` in float64."""
    gm = fuse_linear_relu(model)
    report = report_of(gm)
    assert sorted(d.nodes[0] for d in report.fused) == sorted(fused), report.table()
    assert sorted(d.nodes[0] for d in report.decisions) == sorted(_linear_calls(model)), report.table()
    assert all(isinstance(d.reason, str) and d.reason.strip() for d in report.skipped), report.table()
    assert len(_fused_calls(gm)) == len(fused), gm.code
    if x is not None:
        assert_same_forward_and_grads(model, gm, x)
    return gm


SPELLINGS = {  # name -> (how forward applies it to h, the nn.ReLU module it needs or None)
    "nn.ReLU": (lambda self, h: self.relu(h), nn.ReLU),
    "nn.ReLU(inplace=True)": (lambda self, h: self.relu(h), functools.partial(nn.ReLU, inplace=True)),
    "F.relu": (lambda self, h: F.relu(h), None),
    "F.relu(inplace=True)": (lambda self, h: F.relu(h, inplace=True), None),
    "F.relu(h, True)": (lambda self, h: F.relu(h, True), None),
    "F.relu(input=h)": (lambda self, h: F.relu(input=h), None),
    "torch.relu": (lambda self, h: torch.relu(h), None),
    "torch.relu_": (lambda self, h: torch.relu_(h), None),
    "F.relu_": (lambda self, h: F.relu_(h), None),
    "h.relu()": (lambda self, h: h.relu(), None),
    "h.relu_()": (lambda self, h: h.relu_(), None),
}
IN_PLACE = {"nn.ReLU(inplace=True)", "F.relu(inplace=True)", "F.relu(h, True)", "torch.relu_", "F.relu_", "h.relu_()"}
MODULE_SPELLINGS = ["nn.ReLU", "nn.ReLU(inplace=True)"]

LOOKALIKES = {  # activations that are not a ReLU: a pass that matches by name, or by "clips at zero", fuses them
    "F.relu6": (lambda self, h: F.relu6(h), None),
    "nn.ReLU6": (lambda self, h: self.relu(h), nn.ReLU6),
    "F.leaky_relu": (lambda self, h: F.leaky_relu(h, 0.1), None),
    "nn.LeakyReLU": (lambda self, h: self.relu(h), nn.LeakyReLU),
    "F.hardtanh(h, 0, 1)": (lambda self, h: F.hardtanh(h, 0.0, 1.0), None),
    "torch.clamp(h, min=0.25)": (lambda self, h: torch.clamp(h, min=0.25), None),
    "torch.threshold(h, 0.25, 0)": (lambda self, h: torch.threshold(h, 0.25, 0.0), None),
    "F.elu": (lambda self, h: F.elu(h), None),
    "F.gelu": (lambda self, h: F.gelu(h), None),
}


class Site(nn.Module):
    """One Linear ``fc`` and one activation spelling, wired as ``wiring`` says (see WIRINGS)."""

    def __init__(self, spelling: str, wiring: str = "direct", fc: nn.Module | None = None, relu=None, d=6, d_out=6):
        super().__init__()
        self.act, make_relu = {**SPELLINGS, **LOOKALIKES}[spelling]
        self.fc = fc if fc is not None else _linear(d, d_out)
        self.relu = relu if relu is not None else (make_relu() if make_relu else None)
        self.drop = nn.Dropout(0.5)
        self.wiring = wiring

    def forward(self, x):
        act, fc, wiring = (lambda h: self.act(self, h)), self.fc, self.wiring
        if wiring == "direct":
            return act(fc(x))
        if wiring == "Linear called with input=":  # the fused call must take the Linear's kwargs too
            return act(fc(input=x))
        if wiring == "returned too":
            h = fc(x)
            return act(h), h
        if wiring == "read after the ReLU":  # an in-place ReLU changes h for this reader too
            h = fc(x)
            y = act(h)
            return y * 2 + h
        if wiring == "two ReLUs":
            h = fc(x)
            return act(h) + F.relu(h)
        if wiring == "after an add":
            return act(fc(x) + 0.5)
        if wiring == "after dropout":
            return act(self.drop(fc(x)))
        if wiring == "shared, one site fused":
            return fc(act(fc(x))) * 3
        if wiring == "shared, both sites fused":
            return act(fc(act(fc(x))))
        raise AssertionError(wiring)


WIRINGS = {  # wiring -> the Linear calls a correct pass fuses (fx names the two calls of one `fc` fc and fc_1)
    "direct": ["fc"],
    "Linear called with input=": ["fc"],
    "returned too": [],  # the pre-ReLU value is an output
    "read after the ReLU": [],  # a second user
    "two ReLUs": [],  # two users, both ReLUs
    "after an add": [],  # the ReLU is not directly after the Linear
    "after dropout": [],  # nor here (in eval mode dropout is the identity, and still not a ReLU)
    "shared, one site fused": ["fc"],  # each call site is judged on its own
    "shared, both sites fused": ["fc", "fc_1"],
}


@pytest.mark.parametrize("wiring", WIRINGS)
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_each_wiring_in_each_relu_spelling(spelling, wiring):
    model = Site(spelling, wiring).eval()
    gm = check_fusion(model, WIRINGS[wiring], _randn(3, 6))
    if wiring == "shared, one site fused":  # the unfused site still calls the Linear, which shares its parameters
        (fused,) = {gm.get_submodule(t) for t in _fused_modules(gm)}
        assert isinstance(gm.fc, nn.Linear) and fused.weight is gm.fc.weight and fused.bias is gm.fc.bias
        assert len(list(gm.parameters())) == 2
    if wiring == "direct":
        assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_module", "output"], gm.code
        assert _relu_nodes(gm) == [] and list(gm.state_dict()) == list(model.state_dict())


@given(
    spelling=st.sampled_from(list(SPELLINGS)),
    lead=leading_dims,
    d=features,
    d_out=features,
    bias=st.booleans(),
    permuted=st.booleans(),
)
def test_relu_spellings_are_fused_on_any_shape(spelling, lead, d, d_out, bias, permuted):
    model = Site(spelling, fc=_linear(d, d_out, bias=bias))
    x = _randn(d, *lead).movedim(0, -1) if permuted else _randn(*lead, d)  # (..., d), non-contiguous when permuted
    check_fusion(model, ["fc"], x)


def _hooked(register, hook):
    """A factory: the given module with ``hook`` registered through ``register`` (e.g. nn.Module.register_forward_hook)."""

    def make(module: nn.Module) -> nn.Module:
        register(module, hook)
        return module

    return make


def _parametrized(linear: nn.Linear) -> nn.Linear:
    class Double(nn.Module):
        def forward(self, w):
            return 2 * w

    parametrize.register_parametrization(linear, "weight", Double())
    return linear


LINEAR_RULES = {  # a Linear the fused module cannot stand for, whatever the ReLU's spelling
    "forward hook": lambda: _hooked(nn.Module.register_forward_hook, lambda m, args, out: out + 1)(_linear(6, 6)),
    "forward pre-hook": lambda: _hooked(nn.Module.register_forward_pre_hook, lambda m, args: (args[0] * 2,))(
        _linear(6, 6)
    ),
    "backward hook": lambda: _hooked(nn.Module.register_full_backward_hook, lambda m, gi, go: (gi[0] * 3,))(
        _linear(6, 6)
    ),
    "backward pre-hook": lambda: _hooked(nn.Module.register_full_backward_pre_hook, lambda m, go: (go[0] * 3,))(
        _linear(6, 6)
    ),
    "uninitialized LazyLinear": lambda: nn.LazyLinear(6, dtype=torch.float64),
    "subclass overriding forward": lambda: ScaledLinear(6, 6, dtype=torch.float64),
    "weight computed by a parametrization": lambda: _parametrized(_linear(6, 6)),
}

RELU_RULES = {  # a ReLU module the fused module cannot stand for
    "forward hook": lambda make: _hooked(nn.Module.register_forward_hook, lambda m, args, out: out * 2)(make()),
    "forward pre-hook": lambda make: _hooked(nn.Module.register_forward_pre_hook, lambda m, args: (args[0] - 0.5,))(
        make()
    ),
    "backward hook": lambda make: _hooked(nn.Module.register_full_backward_hook, lambda m, gi, go: (gi[0] * 3,))(
        make()
    ),
    "subclass overriding forward": lambda make: ShiftedReLU(inplace=make().inplace),
}


def _check_not_fused(model: nn.Module, x: torch.Tensor) -> None:
    """Nothing fused, every Linear reported; and the fused model behaves as the model does: the same values and
    gradients, or — where eager itself refuses (a full backward hook before an in-place op) — the same error."""
    try:
        with torch.random.fork_rng(devices=[]):
            copy.deepcopy(model)(x.clone().requires_grad_())
    except RuntimeError:
        gm = check_fusion(model, [])
        with pytest.raises(RuntimeError):
            gm(x.clone().requires_grad_())
        return
    check_fusion(model, [], x)


@pytest.mark.parametrize("rule", LINEAR_RULES)
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_linear_rules_in_each_relu_spelling(spelling, rule):
    _check_not_fused(Site(spelling, fc=LINEAR_RULES[rule]()).eval(), _randn(3, 6))


@pytest.mark.parametrize("rule", RELU_RULES)
@pytest.mark.parametrize("spelling", MODULE_SPELLINGS)
def test_relu_module_rules(spelling, rule):
    relu = RELU_RULES[rule](SPELLINGS[spelling][1])
    _check_not_fused(Site(spelling, relu=relu).eval(), _randn(3, 6))


@pytest.mark.parametrize("spelling", LOOKALIKES)
def test_activations_that_are_not_a_relu_are_not_fused(spelling):
    check_fusion(Site(spelling).eval(), [], _randn(3, 6))


class LinearIsNotTheReluInput(nn.Module):
    """The Linear's only user is an F.relu, but of another tensor: the Linear's output is its `inplace` flag."""

    def __init__(self):
        super().__init__()
        self.fc = _linear(6, 1)

    def forward(self, x):
        return F.relu(x * 1.0, inplace=self.fc(x))  # x: (1, 6); fc(x): (1, 1), truthy or not


def test_a_relu_that_does_not_read_the_linear_is_not_fused():
    model = LinearIsNotTheReluInput()
    gm = check_fusion(model, [])
    for seed in range(4):
        x = _randn(1, 6, seed=seed)
        torch.testing.assert_close(gm(x), model(x))


def test_refusal_helpers_name_a_reason_for_each_rule_and_none_otherwise():
    """linear_refusal/relu_refusal (named in the TODO's hint) say yes to a plain module and no, with a reason, to each
    rule; the wording is theirs to choose."""
    assert linear_refusal(_linear(6, 6)) is None and linear_refusal(_linear(3, 3, bias=False)) is None
    for rule, make in LINEAR_RULES.items():
        reason = linear_refusal(make())
        assert isinstance(reason, str) and reason.strip(), rule
    modules = {"relu": nn.ReLU()}
    graph = fx.Graph()
    node = graph.call_module("relu", (graph.placeholder("x"),))
    assert relu_refusal(node, modules) is None
    for rule, make in RELU_RULES.items():
        reason = relu_refusal(node, {"relu": make(nn.ReLU)})
        assert isinstance(reason, str) and reason.strip(), rule


def test_a_real_linear_subclass_that_overrides_forward_is_not_fused():
    """torch.ao.nn.qat.Linear (quantization-aware training) fake-quantizes its weight in forward."""
    qat = pytest.importorskip("torch.ao.nn.qat")
    from torch.ao.quantization import get_default_qat_qconfig

    fc = qat.Linear(6, 6, qconfig=get_default_qat_qconfig("fbgemm"))
    model = Site("F.relu", fc=fc).eval()
    gm = check_fusion(model, [])
    x = _randn(3, 6, dtype=torch.float32)
    torch.testing.assert_close(gm(x), model(x))


# ----------------------------------------------------------------------------------------------------------------------
# The pass on the demo models, nested and shared modules, and the caller's model


def test_mlp_fuses_the_encoder_and_leaves_the_multi_user_linear_alone():
    model = models.MLP()
    gm = check_fusion(model, ["encoder_0_0", "encoder_1_0"])
    report = report_of(gm)
    assert report is gm.meta["fusion_report"]
    # the task names what a fused decision holds: the Linear's and the ReLU's node names
    assert sorted(d.nodes for d in report.fused) == [("encoder_0_0", "encoder_0_1"), ("encoder_1_0", "encoder_1_1")]
    assert _fused_modules(gm) == ["encoder.0.0", "encoder.1.0"]  # replaced in place: same names, same state_dict
    assert list(gm.state_dict()) == list(model.state_dict())
    assert {d.nodes[0] for d in report.skipped} == {"skip", "head"}
    assert _relu_nodes(gm) == ["act"]  # the ReLU after `skip` stays
    names = dict(gm.named_modules())
    assert isinstance(names["skip"], nn.Linear) and "encoder.0.1" not in names  # the fused-away ReLU module is gone
    (x,) = models.mlp_inputs()
    torch.testing.assert_close(gm(x), model(x))


@given(lead=leading_dims, d_in=features, hidden=features, d_out=features)
def test_fused_mlp_forward_and_gradients_match(lead, d_in, hidden, d_out):
    model = models.MLP(d_in, hidden, d_out).double()
    check_fusion(model, ["encoder_0_0", "encoder_1_0"], _randn(*lead, d_in))


@given(lead=leading_dims, d_in=features, hidden=features, d_out=features)
def test_fused_functional_mlp_forward_and_gradients_match(lead, d_in, hidden, d_out):
    model = models.FunctionalMLP(d_in, hidden, d_out).double()
    gm = check_fusion(model, ["fc1", "fc2", "fc3", "fc4"], _randn(*lead, d_in))
    assert _relu_nodes(gm) == []


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.inner = nn.Sequential(nn.Identity(), nn.ModuleDict({"fc": nn.Linear(d, d)}))

    def forward(self, x):
        return F.relu(self.inner[1]["fc"](self.inner[0](x)))


class Nested(nn.Module):
    def __init__(self, d: int = 5):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(2))
        self.head = nn.Sequential(nn.Sequential(nn.Linear(d, d), nn.ReLU()))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_nested_submodules_are_fused_in_place_and_load_the_same_state_dict():
    model = Nested().double()
    gm = fuse_linear_relu(model)
    assert _fused_modules(gm) == ["blocks.0.inner.1.fc", "blocks.1.inner.1.fc", "head.0.0"]
    assert list(gm.state_dict()) == list(model.state_dict())
    other = Nested().double()
    gm.load_state_dict(other.state_dict())  # a checkpoint of the unfused model loads into the fused one
    assert_same_forward_and_grads(other, gm, _randn(2, 3, 5))


def test_linear_shared_between_two_fused_sites():
    model = Site("torch.relu", "shared, both sites fused")
    gm = check_fusion(model, ["fc", "fc_1"])
    (target,) = set(_fused_modules(gm))  # one fused module, called twice
    assert len(_fused_modules(gm)) == 2 and not hasattr(gm, "fc")  # the Linear itself is unused now, and deleted
    x = _randn(4, 6)
    torch.testing.assert_close(gm(x), model(x))
    gm(x).sum().backward()
    model(x).sum().backward()
    torch.testing.assert_close(gm.get_submodule(target).weight.grad, model.fc.weight.grad)  # both sites' grads add up


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = _linear(6, 6, seed=1), _linear(6, 6, seed=2)
        self.fc2.weight = self.fc1.weight

    def forward(self, x):
        return F.relu(self.fc2(F.relu(self.fc1(x))))


def test_tied_weights_stay_tied():
    model = Tied()
    gm = check_fusion(model, ["fc1", "fc2"], _randn(3, 6))
    assert gm.fc1.weight is gm.fc2.weight


def test_callers_model_is_unchanged():
    model = models.MLP()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modules = [(name, type(m)) for name, m in model.named_modules()]
    params = list(model.parameters())
    gm = fuse_linear_relu(model)
    assert [(name, type(m)) for name, m in model.named_modules()] == modules
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k])
    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    assert all(p is not q for p, q in zip(gm.parameters(), params, strict=False))  # a copy: training gm leaves it
    (x,) = models.mlp_inputs()
    gm(x).sum().backward()
    assert all(p.grad is None for p in model.parameters())


def test_graph_module_input_is_unchanged_and_refusable_twice():
    traced = fx.symbolic_trace(models.FunctionalMLP())
    code, nodes = traced.code, [n.name for n in traced.graph.nodes]
    gm = fuse_linear_relu(traced)
    assert traced.code == code and [n.name for n in traced.graph.nodes] == nodes
    assert all(isinstance(getattr(traced, f"fc{i}"), nn.Linear) for i in range(1, 5))
    assert len(report_of(gm).fused) == 4
    again = fuse_linear_relu(gm)  # a fused model traces to calls of fused_linear_relu: nothing left to fuse
    assert report_of(again).fused == [] and "fused_linear_relu" in again.code
    (x,) = models.mlp_inputs()
    torch.testing.assert_close(again(x), traced(x))
    torch.testing.assert_close(gm(x), traced(x))


@pytest.mark.parametrize("model", [models.TransformerMLP(), models.ElementwiseChain(), nn.Sequential(nn.Linear(4, 4))])
def test_nothing_to_fuse_comes_back_equivalent(model):
    gm = fuse_linear_relu(model)
    report = report_of(gm)
    assert report.fused == [] and _fused_modules(gm) == []
    x = (
        torch.randn(2, 8, 64)
        if isinstance(model, models.TransformerMLP)
        else torch.randn(3, 64 if isinstance(model, models.ElementwiseChain) else 4)
    )
    torch.testing.assert_close(gm(x), model(x))
    assert report.table()  # prints, even when empty


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:
            return torch.relu(h)
        return h


def test_untraceable_model_gets_a_clear_error():
    with pytest.raises(UntraceableModelError) as info:
        fuse_linear_relu(DataDependent())
    msg = str(info.value)
    assert "DataDependent" in msg and "if h.sum() > 0" in msg and "Proxy" in msg and "Fix" in msg


def test_non_module_gets_a_type_error():
    with pytest.raises(TypeError, match="nn.Module"):
        fuse_linear_relu(models.MLP)


def test_one_training_step_matches():
    model = models.FunctionalMLP(8, 16, 4).double()
    gm = fuse_linear_relu(model)
    ref_model = copy.deepcopy(model)
    for m in (ref_model, gm):
        for step in range(3):
            m.zero_grad()
            (m(_randn(5, 8, seed=step)) ** 2).mean().backward()
            _sgd_step(m)
    fused_params = dict(gm.named_parameters())
    for name, p in ref_model.named_parameters():
        torch.testing.assert_close(fused_params[name], p)


# ----------------------------------------------------------------------------------------------------------------------
# Real models: torchvision architectures with Linear+ReLU pairs (random init, small inputs)


def test_faster_rcnn_box_head_is_fused():
    """torchvision's Faster R-CNN box head: flatten, then F.relu(fc6(x)), F.relu(fc7(x))."""
    from torchvision.models.detection.faster_rcnn import TwoMLPHead

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        head = TwoMLPHead(in_channels=2 * 3 * 3, representation_size=8).double()
    check_fusion(head, ["fc6", "fc7"], _randn(4, 2, 3, 3))


def test_alexnet_classifier_is_fused_exactly():
    """torchvision's AlexNet: Dropout, Linear, ReLU(inplace), Dropout, Linear, ReLU(inplace), Linear. The adaptive
    pooling makes a 64x64 input enough; float64, forward and every gradient."""
    torchvision = pytest.importorskip("torchvision")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = torchvision.models.alexnet(num_classes=10).double().eval()
    layers = list(model.classifier)
    pairs = [
        f"classifier_{i}"
        for i, (m, after) in enumerate(zip(layers, layers[1:], strict=False))
        if isinstance(m, nn.Linear) and isinstance(after, nn.ReLU)
    ]
    assert len(pairs) == 2
    gm = check_fusion(model, pairs, _randn(1, 3, 64, 64))
    assert sum(isinstance(m, nn.Conv2d) for m in gm.modules()) == 5  # the features are left as they were


# ----------------------------------------------------------------------------------------------------------------------
# Output that teaches: the After table shows each fused Linear as a FusedLinearReLU


def _rows(text: str) -> dict[str, str]:
    """A module_table's rows by node name."""
    return {line.split()[1]: line for line in text.splitlines()[2:] if len(line.split()) > 1}


@pytest.mark.parametrize(
    "model", [models.MLP(), models.FunctionalMLP(), Site("h.relu_()", "shared, both sites fused")], ids=type
)
def test_after_table_shows_each_fused_site_as_a_fused_linear_relu(model):
    gm = fuse_linear_relu(model)
    before, after = module_table(fx.symbolic_trace(copy.deepcopy(model))), module_table(gm)
    assert "FusedLinearReLU" not in before
    rows = _rows(after)
    fused_nodes = {n.name for n in _fused_calls(gm)}
    assert len(fused_nodes) == len(report_of(gm).fused) > 0
    for name, row in rows.items():
        assert ("FusedLinearReLU" in row) == (name in fused_nodes), row
    for n in gm.graph.nodes:  # every other called module shows its own class
        if n.op == "call_module" and n.name not in fused_nodes:
            assert type(gm.get_submodule(n.target)).__name__ in rows[n.name]


def test_phase_runs_and_its_after_tables_show_the_fused_modules(capsys):
    manual_fusion.run(quick=True)
    out = capsys.readouterr().out
    assert "predicted path" in out and "measured" in out and "max |fused - unfused|" in out
    afters = [part.split("\nReport")[0] for part in out.split("After fuse_linear_relu")[1:]]
    befores = [part.split("After fuse_linear_relu")[0] for part in out.split("Before:")[1:]]
    rows = [[line for line in a.splitlines() if line.startswith("call_module")] for a in afters]
    assert [sum("FusedLinearReLU" in r for r in rs) for rs in rows] == [
        2,
        4,
    ]  # MLP: the encoder's two; FunctionalMLP: 4
    assert all("FusedLinearReLU" not in b for b in befores)


def test_lesson_has_no_empty_section_and_two_level_hints():
    source = inspect.getsource(manual_fusion).splitlines()
    rule = "# " + "-" * 50
    headers = [i for i, line in enumerate(source) if line.startswith(rule)]
    for i in headers:  # a header is a rule line and a title line; code follows before the next header
        following = [line for line in source[i + 2 :] if line.strip()]
        assert following and not following[0].startswith(rule), f"empty section: {source[i + 1]}"
    todos = [line.strip() for line in source if line.strip().startswith("# TODO(human):")]
    assert len(todos) == 2
    for todo in todos:  # a practice workspace shows the task and the first hint (the second: `practice hint 2 --more`)
        assert re.fullmatch(r"# TODO\(human\): .+\. Hint: .+" + ("" if is_workspace() else r"\. More: .+"), todo), todo


# ----------------------------------------------------------------------------------------------------------------------
# On a GPU: the cuBLASLt path itself


@cuda
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("bias", [True, False])
def test_cuda_forward_and_gradients(dtype, tol, bias):
    linear = _linear(64, 48, bias=bias, dtype=dtype, device="cuda")
    fused = nn.Sequential(FusedLinearReLU(copy.deepcopy(linear)))  # its own parameters: gradients compared by name
    x = _randn(2, 16, 64, dtype=dtype, device="cuda")
    assert fused[0].kernel_path(x) == CUBLASLT_EPILOGUE
    for shape in ((2, 16, 64), (7, 64)):
        reference = nn.Sequential(linear, nn.ReLU())
        reference.zero_grad(), fused.zero_grad()
        assert_same_forward_and_grads(reference, fused, _randn(*shape, dtype=dtype, device="cuda"), atol=tol, rtol=tol)


@cuda
@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("mkn", [(1, 32, 64), (8, 1, 64), (8, 32, 1), (5, 0, 4), (0, 8, 8)])
def test_cuda_edge_shapes(mkn):
    m, k, n = mkn
    linear = _linear(k, n, device="cuda")
    with torch.no_grad():
        linear.bias.copy_(torch.linspace(-1, 1, n, dtype=torch.float64))  # negative biases: the ReLU must act
    x = _randn(m, k, device="cuda")
    torch.testing.assert_close(FusedLinearReLU(linear)(x), torch.relu(linear(x)))


@cuda
def test_cuda_kernel_path_matches_the_profiler():
    linear = _linear(512, 512, dtype=torch.bfloat16, device="cuda")
    fused = FusedLinearReLU(linear)
    x = _randn(64, 512, dtype=torch.bfloat16, device="cuda")
    assert fused.kernel_path(x) == CUBLASLT_EPILOGUE
    fused_kernels = launched_kernels(fused, x)
    unfused_kernels = launched_kernels(lambda t: torch.relu(linear(t)), x)
    assert len(fused_kernels) < len(unfused_kernels), (fused_kernels, unfused_kernels)
    narrow = FusedLinearReLU(_linear(512, 1, dtype=torch.bfloat16, device="cuda"))
    assert narrow.kernel_path(x) == CUDA_GEMM_THEN_RELU
    assert len(launched_kernels(narrow, x)) >= 2  # GEMM plus a separate ReLU (and a bias copy)


@cuda
def test_cuda_autocast_matches_linear():
    linear = _linear(64, 32, dtype=torch.float32, device="cuda")
    fused = FusedLinearReLU(linear)
    x = _randn(8, 64, dtype=torch.float32, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want, got = torch.relu(linear(x)), fused(x)
        assert fused.kernel_path(x) == CUBLASLT_EPILOGUE
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    got.float().sum().backward()
    assert linear.weight.grad.dtype == torch.float32


@cuda
def test_cuda_fused_model_matches():
    model = models.MLP().cuda()
    gm = fuse_linear_relu(model)
    (x,) = models.mlp_inputs()
    with torch.no_grad():
        torch.testing.assert_close(gm(x.cuda()), model(x.cuda()), atol=1e-4, rtol=1e-4)
