"""Phase 2: FusedLinearReLU (forward, gradients, kernel path) and the fuse_linear_relu pass (legality, reports)."""

import copy

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from fusion import models
from fusion.common import UntraceableModelError, report_of
from fusion.manual_fusion import (
    ADDMM_THEN_RELU,
    CUBLASLT_EPILOGUE,
    CUDA_GEMM_THEN_RELU,
    EMPTY,
    KERNEL_PATHS,
    FusedLinearReLU,
    addmm_relu,
    fuse_linear_relu,
    fused_linear_relu,
    launched_kernels,
    select_kernel_path,
)

pytestmark = pytest.mark.phase2

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

leading_dims = st.lists(st.integers(0, 4), min_size=1, max_size=3)  # 1–3 leading dims, an empty batch now and then
features = st.integers(1, 9)  # feature sizes, 1 included


def _linear(k: int, n: int, bias: bool = True, seed: int = 0, dtype=torch.float64, device="cpu") -> nn.Linear:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Linear(k, n, bias=bias).to(device=device, dtype=dtype)


def _randn(*shape, seed: int = 1, dtype=torch.float64, device="cpu") -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(device)


def _grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad for name, p in module.named_parameters()}


def assert_same_forward_and_grads(model: nn.Module, fused: nn.Module, x: torch.Tensor, **tol) -> None:
    """fused(x) == model(x), and the input and parameter gradients of a non-trivial loss agree too."""
    x_ref, x_fused = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y_fused = model(x_ref), fused(x_fused)
    torch.testing.assert_close(y_fused, y_ref, **tol)
    w = torch.linspace(-1, 1, y_ref.numel(), dtype=y_ref.dtype, device=y_ref.device).reshape(y_ref.shape)
    (y_ref * w).sum().backward()  # a loss whose gradient differs per element
    (y_fused * w).sum().backward()
    torch.testing.assert_close(x_fused.grad, x_ref.grad, **tol)
    ref_grads, fused_grads = _grads(model), _grads(fused)
    for name, g in ref_grads.items():
        assert name in fused_grads, f"the fused model lost parameter {name}"
        torch.testing.assert_close(fused_grads[name], g, **tol)


# ----------------------------------------------------------------------------------------------------------------------
# FusedLinearReLU


@given(lead=leading_dims, k=features, n=features, bias=st.booleans())
def test_fused_module_matches_linear_relu(lead, k, n, bias):
    linear = _linear(k, n, bias=bias)
    reference = nn.Sequential(linear, nn.ReLU())
    fused = FusedLinearReLU(linear)  # shares linear's parameters: one set of grads to compare
    x = _randn(*lead, k)
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
    opt = torch.optim.SGD(fused.parameters(), lr=0.1)
    fused(_randn(5, 4)).sum().backward()
    opt.step()
    assert not torch.equal(linear.weight.detach(), before)  # training the fused module trained the Linear
    assert FusedLinearReLU(_linear(4, 3, bias=False)).bias is None


class _ScaledLinear(nn.Linear):
    def forward(self, input):
        return 2 * super().forward(input)


def test_fused_module_refuses_what_it_cannot_stand_for():
    with pytest.raises(TypeError, match="not an nn.Linear"):
        FusedLinearReLU(nn.Conv1d(2, 2, 1))
    with pytest.raises(TypeError, match="overrides"):
        FusedLinearReLU(_ScaledLinear(3, 3))
    with pytest.raises(TypeError, match="not initialized"):
        FusedLinearReLU(nn.LazyLinear(3))


# The CUDA branch, `addmm_relu` (torch._addmm_activation + a hand-written backward), runs on the CPU too: test it here.


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


# ----------------------------------------------------------------------------------------------------------------------
# Which kernel path: predicted from plain values (no GPU needed), and checked against what really ran


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
# The pass: what it fuses, what it leaves alone, and that it never touches the caller's model


def _fused_modules(gm: fx.GraphModule) -> list[str]:
    return [
        n.target
        for n in gm.graph.nodes
        if n.op == "call_module" and isinstance(gm.get_submodule(n.target), FusedLinearReLU)
    ]


def _relu_nodes(gm: fx.GraphModule) -> list[str]:
    return [
        n.name
        for n in gm.graph.nodes
        if (n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.ReLU))
        or (n.op == "call_function" and n.target in (F.relu, torch.relu, torch.relu_))
        or (n.op == "call_method" and n.target in ("relu", "relu_"))
    ]


def test_mlp_fuses_the_encoder_and_leaves_the_multi_user_linear_alone():
    model = models.MLP()
    gm = fuse_linear_relu(model)
    report = report_of(gm)
    assert report is gm.meta["fusion_report"]
    assert [d.nodes for d in report.fused] == [("encoder_0_0", "encoder_0_1"), ("encoder_1_0", "encoder_1_1")]
    assert _fused_modules(gm) == ["encoder.0.0", "encoder.1.0"]  # replaced in place: same names, same state_dict
    assert list(gm.state_dict()) == list(model.state_dict())
    skipped = {d.nodes[0]: d.reason for d in report.skipped}
    assert set(skipped) == {"skip", "head"}
    assert "2 users" in skipped["skip"] and "act" in skipped["skip"] and "add" in skipped["skip"]
    assert "not a ReLU" in skipped["head"]
    assert _relu_nodes(gm) == ["act"]  # the ReLU after `skip` stays
    names = dict(gm.named_modules())
    assert isinstance(names["skip"], nn.Linear) and "encoder.0.1" not in names  # the fused-away ReLU module is gone
    (x,) = models.mlp_inputs()
    torch.testing.assert_close(gm(x), model(x))


@given(lead=leading_dims, d_in=features, hidden=features, d_out=features)
def test_fused_mlp_forward_and_gradients_match(lead, d_in, hidden, d_out):
    model = models.MLP(d_in, hidden, d_out).double()
    gm = fuse_linear_relu(model)
    assert len(report_of(gm).fused) == 2
    assert_same_forward_and_grads(model, gm, _randn(*lead, d_in))


@given(lead=leading_dims, d_in=features, hidden=features, d_out=features)
def test_fused_functional_mlp_forward_and_gradients_match(lead, d_in, hidden, d_out):
    model = models.FunctionalMLP(d_in, hidden, d_out).double()
    gm = fuse_linear_relu(model)
    assert len(report_of(gm).fused) == 4 and _relu_nodes(gm) == []
    assert_same_forward_and_grads(model, gm, _randn(*lead, d_in))


class OneLinearThen(nn.Module):
    """``act(self.fc(x))`` with ``act`` one ReLU spelling."""

    def __init__(self, act, module: nn.Module | None = None, d: int = 6):
        super().__init__()
        self.fc = _linear(d, d)
        self.relu = module
        self.act = act

    def forward(self, x):
        return self.act(self, self.fc(x))


SPELLINGS = {
    "nn.ReLU": (lambda self, h: self.relu(h), nn.ReLU()),
    "nn.ReLU(inplace=True)": (lambda self, h: self.relu(h), nn.ReLU(inplace=True)),
    "F.relu": (lambda self, h: F.relu(h), None),
    "F.relu(inplace=True)": (lambda self, h: F.relu(h, inplace=True), None),
    "F.relu(h, True)": (lambda self, h: F.relu(h, True), None),
    "F.relu(input=h)": (lambda self, h: F.relu(input=h), None),
    "torch.relu": (lambda self, h: torch.relu(h), None),
    "torch.relu_": (lambda self, h: torch.relu_(h), None),
    "F.relu_": (lambda self, h: F.relu_(h), None),
    "Tensor.relu": (lambda self, h: h.relu(), None),
    "Tensor.relu_": (lambda self, h: h.relu_(), None),
}


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_every_relu_spelling_is_fused(spelling):
    act, module = SPELLINGS[spelling]
    model = OneLinearThen(act, module)
    gm = fuse_linear_relu(model)
    assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_module", "output"], gm.code
    assert _fused_modules(gm) == ["fc"] and _relu_nodes(gm) == []
    assert len(report_of(gm).fused) == 1 and not report_of(gm).skipped
    assert_same_forward_and_grads(model, gm, _randn(3, 6))


class Returns(nn.Module):
    """A Linear whose output is read by a ReLU *and* something else, in several ways."""

    def __init__(self, how: str):
        super().__init__()
        self.fc = _linear(6, 6)
        self.how = how

    def forward(self, x):
        h = self.fc(x)
        if self.how == "returned too":
            return torch.relu(h), h
        if self.how == "two relus":
            return F.relu(h) + torch.relu(h)
        if self.how == "in-place relu, then h":  # relu_ changes h in place; `h * 2` reads it after
            h.relu_()
            return h * 2
        raise AssertionError(self.how)


@pytest.mark.parametrize("how", ["returned too", "two relus", "in-place relu, then h"])
def test_multi_user_linear_is_not_fused(how):
    model = Returns(how)
    gm = fuse_linear_relu(model)
    report = report_of(gm)
    assert report.fused == [] and len(report.skipped) == 1
    assert "users" in report.skipped[0].reason
    assert _fused_modules(gm) == [] and isinstance(gm.fc, nn.Linear)
    x = _randn(3, 6)
    torch.testing.assert_close(gm(x), model(x))


class NotDirectlyAfter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = _linear(6, 6)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return torch.relu(self.fc(x) + 1) + F.relu(self.drop(self.fc(x)))


def test_relu_not_directly_after_the_linear_is_not_fused():
    model = NotDirectlyAfter().eval()
    gm = fuse_linear_relu(model)
    reasons = [d.reason for d in report_of(gm).skipped]
    assert report_of(gm).fused == [] and len(reasons) == 2
    assert all("not a ReLU" in r for r in reasons), reasons
    x = _randn(3, 6)
    torch.testing.assert_close(gm(x), model(x))


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


class SharedLinear(nn.Module):
    """One Linear called at two sites: followed by a ReLU at one of them (or both)."""

    def __init__(self, both: bool):
        super().__init__()
        self.fc = _linear(6, 6)
        self.both = both

    def forward(self, x):
        h = torch.relu(self.fc(x))
        h = self.fc(h)
        return torch.relu(h) if self.both else h * 3


def test_linear_shared_between_a_fused_and_an_unfused_site():
    model = SharedLinear(both=False)
    gm = fuse_linear_relu(model)
    assert len(report_of(gm).fused) == 1 and len(report_of(gm).skipped) == 1
    assert _fused_modules(gm) == ["fc_relu"]
    assert isinstance(gm.fc, nn.Linear)  # the unfused site still calls the Linear...
    assert gm.fc_relu.weight is gm.fc.weight and gm.fc_relu.bias is gm.fc.bias  # ...which shares its parameters
    assert len(list(gm.parameters())) == 2
    assert_same_forward_and_grads(model, gm, _randn(4, 6))


def test_linear_shared_between_two_fused_sites():
    model = SharedLinear(both=True)
    gm = fuse_linear_relu(model)
    assert len(report_of(gm).fused) == 2
    assert _fused_modules(gm) == ["fc_relu", "fc_relu"]  # one fused module, called twice
    assert not hasattr(gm, "fc")  # the Linear itself is unused now, and deleted
    x = _randn(4, 6)
    torch.testing.assert_close(gm(x), model(x))
    gm(x).sum().backward()
    model(x).sum().backward()
    torch.testing.assert_close(gm.fc_relu.weight.grad, model.fc.weight.grad)  # grads of both sites accumulate


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = _linear(6, 6, seed=1), _linear(6, 6, seed=2)
        self.fc2.weight = self.fc1.weight

    def forward(self, x):
        return F.relu(self.fc2(F.relu(self.fc1(x))))


def test_tied_weights_stay_tied():
    model = Tied()
    gm = fuse_linear_relu(model)
    assert len(report_of(gm).fused) == 2
    assert gm.fc1.weight is gm.fc2.weight
    assert_same_forward_and_grads(model, gm, _randn(3, 6))


class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.lazy, self.act = _linear(4, 4), nn.LazyLinear(4, dtype=torch.float64), nn.ReLU()
        self.fc.register_forward_hook(lambda module, args, out: out + 1)

    def forward(self, x):
        return self.act(self.fc(x)) + torch.relu(self.lazy(x))


def test_hooks_and_uninitialized_lazy_linears_are_not_fused_away():
    model = Hooked()
    gm = fuse_linear_relu(model)
    reasons = " | ".join(d.reason for d in report_of(gm).skipped)
    assert report_of(gm).fused == [] and "hooks" in reasons and "not initialized" in reasons
    x = _randn(2, 4)
    with torch.random.fork_rng(devices=[]):  # the first call initializes each LazyLinear: the same draws for both
        torch.manual_seed(0)
        y_fused = gm(x)
        torch.manual_seed(0)
        y_ref = model(x)
    torch.testing.assert_close(y_fused, y_ref)


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
    assert gm.code.count("fc") and gm.meta["fusion_report"] is report_of(gm)
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
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(3):
            opt.zero_grad()
            (m(_randn(5, 8, seed=step)) ** 2).mean().backward()
            opt.step()
    fused_params = dict(gm.named_parameters())
    for name, p in ref_model.named_parameters():
        torch.testing.assert_close(fused_params[name], p)


def test_phase_runs(capsys):
    from fusion import manual_fusion

    manual_fusion.run(quick=True)
    out = capsys.readouterr().out
    assert "After fuse_linear_relu" in out and "skipped" in out and "fused" in out
    assert "predicted path" in out and "measured" in out and "max |fused - unfused|" in out


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
