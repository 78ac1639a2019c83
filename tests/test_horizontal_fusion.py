"""Phase 7: fuse_horizontal — sibling Linears/Conv2ds that read one value become one wide module plus a slice each."""

import copy

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from fusion import models
from fusion.common import report_of
from fusion.horizontal_fusion import fuse_horizontal, main, merge_modules, run

pytestmark = pytest.mark.phase7

D64 = torch.float64


def _rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=_rng(seed), dtype=D64)


def _seeded(module: nn.Module, seed: int) -> nn.Module:
    """Random, non-zero parameters (biases included) in float64, from a private generator."""
    g = _rng(seed)
    with torch.no_grad():
        for p in module.parameters():
            if not isinstance(p, nn.parameter.UninitializedParameter):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def _linear(k: int, n: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    return _seeded(nn.Linear(k, n, bias=bias, dtype=D64), seed)


def _conv(c_in: int, c_out: int, seed: int = 0, **kw) -> nn.Conv2d:
    kw.setdefault("kernel_size", 1)
    return _seeded(nn.Conv2d(c_in, c_out, dtype=D64, **kw), seed)


def fused_groups(gm: fx.GraphModule) -> list[set[str]]:
    return [set(d.nodes) for d in report_of(gm).fused]


def skipped_nodes(gm: fx.GraphModule) -> set[str]:
    return {n for d in report_of(gm).skipped for n in d.nodes}


def called_modules(gm: fx.GraphModule) -> list[str]:
    return [n.target for n in gm.graph.nodes if n.op == "call_module"]


def assert_exact(model: nn.Module, gm: nn.Module, *inputs: torch.Tensor, grad: bool = True) -> None:
    """Same outputs (float64), and the same input gradients of a loss that weighs every element differently."""
    xs = [x.clone().requires_grad_(grad) for x in inputs]
    ys = [x.clone().requires_grad_(grad) for x in inputs]
    with torch.set_grad_enabled(grad):
        ref, out = model(*xs), gm(*ys)
    ref, out = (ref if isinstance(ref, tuple) else (ref,)), (out if isinstance(out, tuple) else (out,))
    for r, o in zip(ref, out, strict=True):
        torch.testing.assert_close(o, r)
    if not grad:
        return
    loss = lambda outs: sum((o * torch.linspace(-1, 2, o.numel(), dtype=D64).reshape(o.shape)).sum() for o in outs)  # noqa: E731
    loss(ref).backward()
    loss(out).backward()
    for a, b in zip(xs, ys, strict=True):
        torch.testing.assert_close(b.grad, a.grad)


class Siblings(nn.Module):
    """``mods[i](x)`` called in ``call_order``, each result used right away (so users sit between siblings), the
    results concatenated in ``use_order``; ``returned`` sibling outputs are also returned as they are."""

    def __init__(self, mods, call_order, use_order, returned=(), dim=-1):
        super().__init__()
        self.mods = nn.ModuleList(mods)
        self.call_order, self.use_order, self.returned, self.dim = call_order, use_order, returned, dim

    def forward(self, x):
        raw, used = {}, {}
        for i in self.call_order:
            raw[i] = self.mods[i](x)
            used[i] = torch.tanh(raw[i]) if i % 2 else raw[i] * 2
        out = torch.cat([used[i] for i in self.use_order], dim=self.dim)
        return (out, *(raw[i] for i in self.returned))


orders = st.integers(2, 5).flatmap(
    lambda n: st.tuples(
        st.just(n), st.permutations(range(n)), st.permutations(range(n)), st.sets(st.integers(0, n - 1))
    )
)


# ----------------------------------------------------------------------------------------------------------------------
# Exactness


@given(
    spec=orders,
    data=st.data(),
    k=st.integers(1, 9),
    lead=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    transposed=st.booleans(),
)
def test_sibling_linears_merge_exactly(spec, data, k, lead, transposed):
    n, call_order, use_order, returned = spec
    widths = data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    biases = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    mods = [_linear(k, w, b, seed=i) for i, (w, b) in enumerate(zip(widths, biases, strict=True))]
    model = Siblings(mods, list(call_order), list(use_order), tuple(sorted(returned)))
    x = _randn(*lead, k).transpose(0, -1).contiguous().transpose(0, -1) if transposed else _randn(*lead, k)
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{f"mods_{i}" for i in range(n)}]
    assert len(called_modules(gm)) == 1
    assert_exact(model, gm, x)
    outs = gm(x)
    for r in outs[1:]:  # a returned sibling is the caller's own tensor, as before: contiguous, not a view
        assert r.is_contiguous() and r._base is None


@given(
    spec=orders,
    data=st.data(),
    c_in=st.integers(1, 4),
    kernel=st.integers(1, 3),
    stride=st.integers(1, 2),
    padding=st.integers(0, 2),
    dilation=st.integers(1, 2),
    batched=st.booleans(),
)
def test_sibling_convs_merge_exactly(spec, data, c_in, kernel, stride, padding, dilation, batched):
    n, call_order, use_order, returned = spec
    widths = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    biases = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    hyper = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation)
    mods = [_conv(c_in, w, bias=b, seed=i, **hyper) for i, (w, b) in enumerate(zip(widths, biases, strict=True))]
    model = Siblings(mods, list(call_order), list(use_order), tuple(sorted(returned)), dim=-3)
    size = dilation * (kernel - 1) + 1 + data.draw(st.integers(0, 3))
    x = _randn(2, c_in, size, size + 1) if batched else _randn(c_in, size, size + 1)  # unbatched: channels at dim 0
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{f"mods_{i}" for i in range(n)}]
    assert_exact(model, gm, x)


def test_merged_module_computes_every_sibling():
    for mods, x in (
        ([_linear(5, 3, True, 1), _linear(5, 4, False, 2), _linear(5, 1, True, 3)], _randn(2, 5)),
        ([_conv(3, 2, 1, bias=False), _conv(3, 4, 2), _conv(3, 1, 3, bias=False)], _randn(2, 3, 4, 4)),
    ):
        merged = merge_modules(mods)
        dim = -1 if isinstance(mods[0], nn.Linear) else -3
        torch.testing.assert_close(merged(x), torch.cat([m(x) for m in mods], dim))
        assert type(merged) is type(mods[0]) and merged.weight.dtype == D64
        assert all(merged.weight is not m.weight for m in mods)
    no_bias = merge_modules([_linear(5, 3, False, 1), _linear(5, 2, False, 2)])
    assert no_bias.bias is None


def test_attention_qkv_merge_and_the_caller_is_untouched():
    model = models.QKVAttention().double()
    before = copy.deepcopy(model.state_dict())
    params = {name: p for name, p in model.named_parameters()}
    code = fx.symbolic_trace(model).code
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"q", "k", "v"}]
    assert "out" in skipped_nodes(gm)
    merged = gm.get_submodule(called_modules(gm)[0])
    torch.testing.assert_close(merged.weight, torch.cat([model.q.weight, model.k.weight, model.v.weight]))
    torch.testing.assert_close(merged.bias[-model.v.out_features :], torch.zeros(model.v.out_features, dtype=D64))
    assert all(merged.weight is not p for p in params.values())  # new parameters: the caller's are not shared
    assert_exact(model, gm, *(x.double() for x in models.attention_inputs()))
    # the caller's model: same parameter objects, same values, same graph
    assert {name: p for name, p in model.named_parameters()} == params
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)
    assert fx.symbolic_trace(model).code == code and not hasattr(model, "q_k_v")


def test_inception_only_the_compatible_subset_merges():
    model = models.InceptionBlock().double()
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"b1", "b2_reduce", "b3_reduce"}]
    assert {"b5", "pool_proj"} <= skipped_nodes(gm)
    assert_exact(model, gm, *(x.double() for x in models.inception_inputs()))


class SumOfSiblings(nn.Module):
    """Each sibling's output reduced to (B, 1) and summed: siblings whose output shapes differ can share a model."""

    def __init__(self, mods):
        super().__init__()
        self.mods = nn.ModuleList(mods)

    def forward(self, x):
        return sum(m(x).flatten(1).square().sum(1, keepdim=True) for m in self.mods)


K1, K3 = dict(kernel_size=1), dict(kernel_size=3, padding=1)


@pytest.mark.parametrize(
    "base, odd",
    [
        (K1, K3),
        (K1, dict(kernel_size=1, stride=2)),
        (K1, dict(kernel_size=1, padding=1)),
        (K3, dict(kernel_size=3, padding=2, dilation=2)),
        (K3, dict(kernel_size=3, padding=1, padding_mode="reflect")),
        (K3, dict(kernel_size=3, padding="same")),
        (K3, dict(kernel_size=3, padding=1, padding_mode="replicate")),
        (K3, dict(kernel_size=3, padding=1, padding_mode="circular")),
        (dict(K3, padding_mode="reflect"), dict(kernel_size=3, padding=1, padding_mode="circular")),
        (dict(kernel_size=3, stride=(1, 2)), dict(kernel_size=3, stride=(2, 1))),
        (dict(kernel_size=3, padding=(1, 0)), dict(kernel_size=3, padding=(0, 1))),
        (dict(kernel_size=2, dilation=(1, 2)), dict(kernel_size=2, dilation=(2, 1))),
        (dict(kernel_size=(3, 1)), dict(kernel_size=(1, 3))),
        (dict(kernel_size=1, padding="valid"), dict(kernel_size=1, padding="same")),
    ],
    ids=[
        *("kernel_size", "stride", "padding", "dilation", "padding_mode", "padding-same", "replicate", "circular"),
        *("reflect-vs-circular", "stride-hw", "padding-hw", "dilation-hw", "kernel-hw", "valid-vs-same"),
    ],
)
def test_convs_with_other_hyperparameters_stay_apart(base, odd):
    mods = [_conv(4, 3, 0, **base), _conv(4, 2, 1, **odd), _conv(4, 5, 2, **base)]
    model = SumOfSiblings(mods)
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"mods_0", "mods_2"}]
    assert "mods_1" in skipped_nodes(gm)
    assert_exact(model, gm, _randn(2, 4, 7, 7))


MODES = ["zeros", "reflect", "replicate", "circular"]
HYPER = {  # every Conv2d hyper-parameter the merged conv must keep, in the forms nn.Conv2d accepts
    **{f"padding_mode={m}": dict(kernel_size=3, padding=1, padding_mode=m) for m in MODES},
    "asymmetric padding, reflect": dict(kernel_size=(3, 2), padding=(2, 1), padding_mode="reflect"),
    "padding=same, circular": dict(kernel_size=3, padding="same", padding_mode="circular"),
    "padding=same, dilation 2": dict(kernel_size=(3, 2), padding="same", dilation=2),
    "padding=valid": dict(kernel_size=2, padding="valid"),
    "stride (1, 2)": dict(kernel_size=3, stride=(1, 2), padding=(0, 1)),
    "dilation (2, 1), replicate": dict(kernel_size=2, dilation=(2, 1), padding=(1, 2), padding_mode="replicate"),
}


@pytest.mark.parametrize("hyper", HYPER.values(), ids=HYPER.keys())
def test_merged_conv_keeps_every_hyperparameter(hyper):
    mods = [_conv(3, 2, 0, **hyper), _conv(3, 4, 1, bias=False, **hyper), _conv(3, 1, 2, **hyper)]
    x = _randn(2, 3, 7, 6)  # odd sizes: a wrong padding or stride shows in the shape or the border values
    merged = merge_modules(mods)
    torch.testing.assert_close(merged(x), torch.cat([m(x) for m in mods], -3))
    model = Siblings(mods, [2, 0, 1], [0, 1, 2], dim=-3)
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"mods_0", "mods_1", "mods_2"}]
    assert_exact(model, gm, x)


# ----------------------------------------------------------------------------------------------------------------------
# Refusals: the odd sibling stays a call of its own module; the compatible ones still merge


class DoubleForwardLinear(nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


class OwnConvForward(nn.Conv2d):  # nn.Conv2d.forward calls _conv_forward: overriding that changes the result too
    def _conv_forward(self, x, weight, bias):
        return super()._conv_forward(x, weight, bias) + 1


# symbolic_trace keeps only torch's own modules as leaves (call_module nodes); a user's subclass is traced through.
# Pretend this one ships with a library built on torch.nn, so that it stays a call_module the pass must refuse.
OwnConvForward.__module__ = "torch.nn.modules.conv"


def _qat(kind: str) -> nn.Module:
    """torch.ao's quantization-aware-training Linear/Conv2d: leaf subclasses whose forward fake-quantizes weights."""
    import torch.ao.nn.qat as qat

    qconfig = torch.ao.quantization.get_default_qat_qconfig()
    m = qat.Linear(4, 3, qconfig=qconfig) if kind == "Linear" else qat.Conv2d(4, 3, 1, qconfig=qconfig)
    return _seeded(m.double(), 5)  # float64 like its siblings (same merge key); the run converts all to float32


class Scale(nn.Module):
    def forward(self, w):
        return 3 * w


def _odd(kind: str, case: str, calls: list) -> nn.Module:
    """The odd sibling for ``kind`` ("Linear"/"Conv2d") and refusal ``case``; ``calls`` records hook calls."""
    linear = kind == "Linear"
    plain = (lambda **kw: _linear(4, 3, seed=5, **kw)) if linear else (lambda **kw: _conv(4, 3, seed=5, **kw))
    if case == "forward hook":
        m = plain()
        m.register_forward_hook(lambda mod, args, out: calls.append(1) or out + 1)
    elif case == "forward pre-hook":
        m = plain()
        m.register_forward_pre_hook(lambda mod, args: (calls.append(1) or args[0] * 2,))
    elif case == "backward hook":
        m = plain()
        m.register_full_backward_hook(lambda mod, gin, gout: calls.append(1))
    elif case == "subclass":
        m = _qat(kind)
    elif case == "conv_forward subclass":
        m = _seeded(OwnConvForward(4, 3, 1).double(), 5)
    elif case == "lazy":
        m = nn.LazyLinear(3, dtype=D64) if linear else nn.LazyConv2d(3, 1, dtype=D64)
    elif case == "parametrized":
        m = plain()
        torch.nn.utils.parametrize.register_parametrization(m, "weight", Scale())
    elif case == "frozen":
        m = plain()
        m.requires_grad_(False)
    elif case == "grouped":
        m = _conv(4, 4, seed=5, groups=2)
    elif case == "float32":
        m = plain().float()
    elif case == "meta device":
        m = plain().to("meta")
    return m


REFUSALS = ["forward hook", "forward pre-hook", "backward hook", "subclass", "lazy", "parametrized", "frozen"]
CASES = [("Linear", c) for c in REFUSALS] + [("Conv2d", c) for c in [*REFUSALS, "conv_forward subclass", "grouped"]]
RUN_CASES = [c for c in CASES if c[1] != "lazy"]  # a lazy module would infer its shape on the first call


def _model_with_odd(kind, case, calls):
    make = (lambda s: _linear(4, 2 + s, seed=s)) if kind == "Linear" else (lambda s: _conv(4, 2 + s, seed=s))
    return SumOfSiblings([make(0), _odd(kind, case, calls), make(1)])


@pytest.mark.parametrize("kind, case", CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_refused_sibling_stays_alone(kind, case):
    calls = []
    model = _model_with_odd(kind, case, calls)
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"mods_0", "mods_2"}]
    assert "mods_1" in skipped_nodes(gm)
    assert "mods.1" in called_modules(gm)
    if (kind, case) in RUN_CASES:
        x = _randn(3, 4) if kind == "Linear" else _randn(2, 4, 5, 5)
        if case == "subclass":  # torch.ao's fake-quantize observers work in float32
            model, gm, x = model.float(), gm.float(), x.float()
        assert_exact(model, gm, x)
        if "hook" in case:
            assert len(calls) == 2  # once in the model, once in the fused model


@pytest.mark.parametrize("kind", ["Linear", "Conv2d"])
def test_a_bias_frozen_apart_from_its_weight_stays_alone(kind):
    make = (lambda s: _linear(4, 2 + s, seed=s)) if kind == "Linear" else (lambda s: _conv(4, 2 + s, seed=s))
    odd = make(5)
    odd.bias.requires_grad_(False)  # trainable weight, frozen bias: one merged bias cannot carry both flags
    mods = [make(0), odd, make(1)]
    model = SumOfSiblings(mods)
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"mods_0", "mods_2"}]
    assert "mods_1" in skipped_nodes(gm)
    for m in (mods[0], mods[2]):
        m.requires_grad_(False)  # frozen weight, trainable bias, both siblings
        m.bias.requires_grad_(True)
    assert fused_groups(fuse_horizontal(SumOfSiblings([mods[0], mods[2]]))) == []


class MixedKinds(nn.Module):
    """Two Linears (over the last dim), two Conv2ds, two Conv3ds and two ConvTranspose2ds read x; two Conv1ds x[0]."""

    def __init__(self):
        super().__init__()
        self.l0, self.l1 = _linear(6, 2, seed=0), _linear(6, 3, seed=1)
        self.c0, self.c1 = _conv(4, 2, seed=2), _conv(4, 3, seed=3)
        self.d0, self.d1 = (_seeded(nn.Conv1d(5, 2, 1, dtype=D64), s) for s in (4, 5))  # x[0]: (N=4, C=5, L=6)
        self.e0, self.e1 = (_seeded(nn.Conv3d(2, 2, 1, dtype=D64), s) for s in (6, 7))  # x: unbatched (C=2, D, H, W)
        self.t0, self.t1 = (_seeded(nn.ConvTranspose2d(4, 2, 1, dtype=D64), s) for s in (8, 9))  # transposed

    def forward(self, x):
        h = x[0]
        parts = [self.l0(x), self.l1(x), self.c0(x), self.c1(x), self.d0(h), self.d1(h), self.e0(x), self.e1(x)]
        parts += [self.t0(x), self.t1(x)]
        return sum(p.square().sum() for p in parts)


def test_siblings_of_another_kind_stay_apart():
    model = MixedKinds()
    gm = fuse_horizontal(model)
    assert sorted(map(sorted, fused_groups(gm))) == [["c0", "c1"], ["l0", "l1"]]
    assert {"d0", "d1", "e0", "e1", "t0", "t1"} <= set(called_modules(gm))  # kinds the pass leaves as they are
    assert_exact(model, gm, _randn(2, 4, 5, 6))


def test_grouped_convs_never_merge():
    mods = [_conv(4, 4, 0, groups=2), _conv(4, 2, 1, groups=2), _conv(4, 6, 2, groups=2)]  # one merge_key: same shape
    model = SumOfSiblings(mods)
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == []
    assert {"mods_0", "mods_1", "mods_2"} <= skipped_nodes(gm)
    assert_exact(model, gm, _randn(2, 4, 5, 5))


def test_a_plain_subclass_merges_with_its_base():
    from torch.nn.modules.linear import NonDynamicallyQuantizableLinear  # nn.MultiheadAttention's out_proj

    plain_subclass = _seeded(NonDynamicallyQuantizableLinear(4, 3).double(), 1)
    model = SumOfSiblings([_linear(4, 2, seed=0), plain_subclass])
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"mods_0", "mods_1"}]
    assert_exact(model, gm, _randn(3, 4))


def test_a_user_subclass_is_traced_through_and_its_siblings_merge():
    model = SumOfSiblings(
        [_linear(4, 2, seed=0), _seeded(DoubleForwardLinear(4, 3).double(), 1), _linear(4, 1, seed=2)]
    )
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"mods_0", "mods_2"}]
    assert_exact(model, gm, _randn(3, 4))


@pytest.mark.parametrize("kind", ["Linear", "Conv2d"])
@pytest.mark.parametrize("case", ["float32", "meta device"])
def test_siblings_of_another_dtype_or_device_stay_apart(kind, case):
    model = _model_with_odd(kind, case, [])
    gm = fuse_horizontal(model)  # traced, never run: such a model only runs under autocast / after a .to()
    assert fused_groups(gm) == [{"mods_0", "mods_2"}]
    assert "mods_1" in skipped_nodes(gm)
    odd = gm.get_submodule("mods.1")
    assert (odd.weight.dtype, odd.weight.device.type) == (model.mods[1].weight.dtype, model.mods[1].weight.device.type)


@pytest.mark.parametrize("kind", ["Linear", "Conv2d"])
def test_merged_parameters_of_trainable_siblings_are_trainable(kind):
    make = (lambda s: _linear(4, 2 + s, seed=s)) if kind == "Linear" else (lambda s: _conv(4, 2 + s, seed=s))
    gm = fuse_horizontal(SumOfSiblings([make(0), make(1)]))
    (merged,) = called_modules(gm)
    params = dict(gm.get_submodule(merged).named_parameters())
    assert set(params) == {"weight", "bias"} and all(p.requires_grad for p in params.values())


def test_merged_parameters_keep_requires_grad():
    mods = [_linear(4, 2, seed=0), _linear(4, 3, seed=1)]
    for m in mods:
        m.requires_grad_(False)
    gm = fuse_horizontal(SumOfSiblings(mods))
    assert fused_groups(gm) and not any(p.requires_grad for p in gm.parameters())


# ----------------------------------------------------------------------------------------------------------------------
# What "the same value" means


class DifferentValues(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (_linear(4, 2 + i, seed=i) for i in range(4))

    def forward(self, x, y):
        return self.a(x).sum(-1) + self.b(x).sum(-1) + self.c(x + 1).sum(-1) + self.d(y).sum(-1)


def test_siblings_that_read_different_values_stay_apart():
    model = DifferentValues()
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"a", "b"}]
    assert {"c", "d"} <= skipped_nodes(gm)
    assert_exact(model, gm, _randn(3, 4), _randn(3, 4, seed=2))


class Keywords(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (_linear(4, 2 + i, seed=i) for i in range(3))

    def forward(self, x):
        return self.a(input=x).sum(-1) + self.b(input=x).sum(-1) + self.c(x).sum(-1)


def test_same_args_and_kwargs_merge():
    model = Keywords()
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"a", "b"}]  # c(x) passes x positionally: other arguments, left alone
    assert_exact(model, gm, _randn(3, 4))


class MutateBetween(nn.Module):
    """``a(x)``; then an in-place op that may write ``x`` (through ``x`` itself or a view of it); then ``b``, ``c``."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.a, self.b, self.c = (_linear(4, 2 + i, seed=i) for i in range(3))

    def forward(self, x):
        x = x * 1
        h = self.a(x)
        if self.how == "self":
            x.add_(1)
        elif self.how == "view":
            x.view(-1).mul_(2)
        elif self.how == "getitem":
            x[:, 0].mul_(2)  # x[...] is a call_function (operator.getitem), a view like x.view
        elif self.how == "other":  # writes a fresh tensor: x is untouched, so a, b, c all read one value
            h.relu_()
        return h.sum(-1) + self.b(x).sum(-1) + self.c(x).sum(-1)


@pytest.mark.parametrize(
    "how, groups",
    [("self", [{"b", "c"}]), ("view", [{"b", "c"}]), ("getitem", [{"b", "c"}]), ("other", [{"a", "b", "c"}])],
)
def test_an_in_place_write_between_siblings_cuts_the_group(how, groups):
    model = MutateBetween(how)
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == groups
    assert_exact(model, gm, _randn(3, 4), grad=False)
    if how == "self":
        assert "a" in skipped_nodes(gm)
    if how == "other":  # a's slice is written in place: it is a clone, so autograd's version checks stay happy
        assert_exact(model, gm, _randn(3, 4))


class WriteAnotherInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = _linear(4, 2, seed=0), _linear(4, 3, seed=1)

    def forward(self, x, y):
        h = self.a(x)
        y.add_(1)  # the caller may pass one tensor as both x and y: then this writes x too
        return h.sum(-1) + self.b(x).sum(-1)


def test_a_write_to_another_input_may_write_this_one():
    model = WriteAnotherInput()
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == []
    x, x2 = _randn(3, 4), _randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(gm(x2, x2), model(x, x))


def test_graph_with_in_place_op_between_siblings_runs_the_lesson_model():
    model = models.InPlaceBetweenSiblings()
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == []
    assert {"a", "b"} <= skipped_nodes(gm)


# ----------------------------------------------------------------------------------------------------------------------
# Slices are views: in-place users, .view users, memory introspection, one module called twice


class InPlaceOnSlice(nn.Module):
    def __init__(self, via_alias: bool):
        super().__init__()
        self.via_alias = via_alias
        self.a, self.b, self.c = (_linear(4, 3, seed=i) for i in range(3))

    def forward(self, x):
        h = self.a(x)
        if self.via_alias:
            h.view(h.shape)[..., 0].mul_(3)
        else:
            F.relu(h, inplace=True)
        k = self.b(x)
        s = k * k  # saves k for backward: an in-place op on a view of the same storage would break it
        v = self.c(x)
        v.add_(1)
        return h + s + v


@pytest.mark.parametrize("via_alias", [False, True])
def test_slices_modified_in_place_are_copies(via_alias):
    model = InPlaceOnSlice(via_alias)
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"a", "b", "c"}]
    assert_exact(model, gm, _randn(3, 5, 4))


class ViewUsers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = _linear(4, 3, seed=0), _linear(4, 2, seed=1)

    def forward(self, x):
        flat = self.a(x).view(-1)  # legal on a contiguous Linear output, impossible on a narrow of a wider one
        bits = self.b(x).view(torch.int64).view(x.dtype)  # reinterpreting bytes needs a copy, not a reshape
        return flat.sum() + bits.sum() + self.a(x).view_as(x[..., :3]).sum()


def test_view_users_still_work():
    model = ViewUsers()
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"a", "b", "a_1"}]
    assert_exact(model, gm, _randn(3, 5, 4), grad=False)
    assert_exact(model, gm, _randn(3, 5, 4))


class Strides(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = _linear(4, 3, seed=0), _linear(4, 2, seed=1)

    def forward(self, x):
        h = self.a(x)
        return h.stride(), h.is_contiguous(), self.b(x)


def test_memory_introspection_sees_what_it_saw():
    model = Strides()
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"a", "b"}]
    x = _randn(3, 4)
    assert gm(x)[:2] == model(x)[:2]


class CalledTwice(nn.Module):
    def __init__(self, with_sibling: bool):
        super().__init__()
        self.with_sibling = with_sibling
        self.a, self.b = _linear(4, 3, seed=0), _linear(4, 2, seed=1)

    def forward(self, x):
        h1 = self.a(x)
        h1.mul_(2)  # must not reach the other call site's result
        out = h1.sum(-1) + self.a(x).sum(-1)
        return out + self.b(x).sum(-1) if self.with_sibling else out


def test_one_module_called_twice_is_not_a_group():
    model = CalledTwice(with_sibling=False)
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == []
    assert {"a", "a_1"} <= skipped_nodes(gm)
    assert called_modules(gm) == ["a", "a"]


def test_one_module_called_twice_shares_one_slice_in_a_group():
    model = CalledTwice(with_sibling=True)
    gm = fuse_horizontal(model)
    assert fused_groups(gm) == [{"a", "a_1", "b"}]
    (merged,) = called_modules(gm)
    assert gm.get_submodule(merged).weight.shape == (5, 4)  # a's rows once, b's rows
    assert_exact(model, gm, _randn(3, 4), grad=False)


# ----------------------------------------------------------------------------------------------------------------------
# A real model, elementwise siblings, the lesson


def test_torchvision_googlenet_inception_branches_merge():
    torchvision = pytest.importorskip("torchvision")
    with torch.random.fork_rng(devices=[]):  # torchvision's default (random) init; no weights are downloaded
        torch.manual_seed(0)
        net = torchvision.models.googlenet(weights=None, aux_logits=False, init_weights=False).eval().double()
    gm = fuse_horizontal(net)
    groups = fused_groups(gm)
    assert len(groups) == 9  # one per Inception block: branch1, branch2[0], branch3[0] 1x1 convs read its input
    assert {"inception3a_branch1_conv", "inception3a_branch2_0_conv", "inception3a_branch3_0_conv"} in groups
    assert "cloned" not in " ".join(d.reason for d in report_of(gm).fused)  # the in-place ReLUs write BN outputs
    with torch.no_grad():
        x = _randn(1, 3, 32, 32)
        torch.testing.assert_close(gm(x), net(x))


def test_elementwise_siblings_share_one_region_with_two_outputs():
    from fusion.regions import build_fusion_regions, capture_aten, unique_regions

    (region,) = unique_regions(build_fusion_regions(capture_aten(models.PointwiseSiblings(), (torch.randn(8, 64),))))
    assert len(region.external_outputs) == 2
    assert region.total_bytes < region.unfused_bytes


def test_non_module_is_refused_clearly():
    with pytest.raises(TypeError, match="nn.Module"):
        fuse_horizontal(torch.randn(3))


def test_lesson_runs(capsys):
    run(quick=True)
    out = capsys.readouterr().out
    assert "q_k_v" in out and "fused" in out
    assert main(["--quick"]) == 0


@pytest.mark.parametrize("clone_outputs", [True, False])
def test_returned_siblings_are_copies_unless_asked_for_views(clone_outputs):
    model = models.QKVProjections().double()
    gm = fuse_horizontal(model, clone_outputs=clone_outputs)
    assert fused_groups(gm) == [{"q", "k", "v"}]
    (x,) = (t.double() for t in models.qkv_inputs())
    outs = gm(x)
    for out, ref in zip(outs, model(x), strict=True):
        torch.testing.assert_close(out, ref)
        assert (out._base is None) == clone_outputs  # views of the merged output only when asked for
