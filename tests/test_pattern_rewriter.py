"""Phase 3: pattern rewriting of relu(x @ w + b) into one fused call, in every spelling, legally."""

import copy
import functools
import itertools

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from fusion import models
from fusion.common import UntraceableModelError, report_of
from fusion.pattern_rewriter import (
    ADDS,
    MATMULS,
    RELUS,
    LeakyIntermediate,
    MixedSpellings,
    SpelledLayer,
    aten_ops,
    fuse_matmul_add_relu,
    fused_call_count,
    fused_matmul_add_relu,
    make_rule,
    pattern_counts,
    pattern_set,
    spelling_name,
)

pytestmark = pytest.mark.phase3

SPELLINGS = list(itertools.product(MATMULS, ADDS, RELUS))
UNFUSED_TARGETS = {torch.matmul, torch.mm, torch.add, torch.relu, F.relu}


class SpelledLayerBiasInput(SpelledLayer):
    """The same layer with the bias a graph input: ``forward(x, b)`` (``self.b`` is unused)."""

    def forward(self, x, b):
        return self.layer(x, b)


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def close(actual, expected, dtype=torch.float64):
    # float64: the algebra is the same, only the rounding order inside the GEMM may differ
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {}
    torch.testing.assert_close(actual, expected, **tol)


def leftover_ops(gm: fx.GraphModule) -> list[str]:
    """Unfused matmul/add/relu nodes still in the graph (any spelling)."""
    import operator

    return [
        n.name
        for n in gm.graph.nodes
        if (n.op == "call_function" and n.target in UNFUSED_TARGETS | {operator.matmul, operator.add})
        or (n.op == "call_method" and n.target in ("relu", "matmul", "mm", "add"))
    ]


class Functional(nn.Module):
    """One spelling with x, w and b all graph inputs: one fused graph serves every drawn shape."""

    def __init__(self, matmul, add, relu):
        super().__init__()
        self.spelling = (matmul, add, relu)

    def forward(self, x, w, b):
        matmul, add, relu = self.spelling
        return RELUS[relu](ADDS[add](MATMULS[matmul](x, w), b))


@functools.cache
def fused_functional(spelling):
    return fuse_matmul_add_relu(Functional(*spelling))


def smoke(spelling=("x @ w", "{h} + b", "torch.relu({h})")):
    """One fixed example before hypothesis draws any: an unsolved exercise fails here at once, with its TODO."""
    model, gm = Functional(*spelling), fused_functional(spelling)
    x, w, b = randn(2, 3), randn(3, 2, seed=1), randn(2, seed=2)
    close(gm(x, w, b), model(x, w, b))


# ----------------------------------------------------------------------------------------------------------------------
# The rules


def test_pattern_set_is_the_product_of_the_spelling_tables():
    rules = pattern_set()
    assert len(rules) == len(MATMULS) * len(ADDS) * len(RELUS) == 36
    assert len({r.name for r in rules}) == 36
    assert {r.name for r in rules} == {spelling_name(*s) for s in SPELLINGS}


@pytest.mark.parametrize("spelling", SPELLINGS, ids=lambda s: spelling_name(*s))
def test_make_rule_traces_to_the_spelling(spelling):
    matmul, add, relu = spelling
    pattern, replacement = make_rule(MATMULS[matmul], ADDS[add], RELUS[relu])
    got = [(n.op, n.target) for n in fx.symbolic_trace(pattern).graph.nodes if n.op not in ("placeholder", "output")]
    want = [
        (n.op, n.target)
        for n in fx.symbolic_trace(Functional(*spelling)).graph.nodes
        if n.op not in ("placeholder", "output")
    ]
    assert got == want and len(got) == 3
    rep = [n for n in fx.symbolic_trace(replacement).graph.nodes if n.op == "call_function"]
    assert [n.target for n in rep] == [fused_matmul_add_relu]  # a single leaf call, not traced into
    assert [n.name for n in fx.symbolic_trace(replacement).graph.nodes if n.op == "placeholder"] == ["x", "w", "b"]


# ----------------------------------------------------------------------------------------------------------------------
# Every spelling: fused once, equivalent on drawn shapes


@pytest.mark.parametrize("spelling", SPELLINGS, ids=lambda s: spelling_name(*s))
def test_every_spelling_is_fused_and_equivalent(spelling):
    smoke(spelling)
    model, gm = Functional(*spelling), fused_functional(spelling)
    assert fused_call_count(gm) == 1 and leftover_ops(gm) == []
    assert pattern_counts(gm)[spelling_name(*spelling)] == 1 and sum(pattern_counts(gm).values()) == 1

    @given(
        m=st.integers(1, 6),
        k=st.integers(1, 8),
        n=st.integers(1, 8),
        batch=st.one_of(st.just(()), st.tuples(st.integers(1, 3))),
        dtype=st.sampled_from([torch.float64, torch.float32]),
        seed=st.integers(0, 2**16),
    )
    def check(m, k, n, batch, dtype, seed):
        if spelling[0] == "torch.mm(x, w)":
            batch = ()  # torch.mm takes 2-D operands only
        x, w, b = (
            randn(*batch, m, k, dtype=dtype, seed=seed),
            randn(k, n, dtype=dtype, seed=seed + 1),
            randn(n, seed=seed + 2),
        )
        b = b.to(dtype)
        with torch.no_grad():
            close(gm(x, w, b), model(x, w, b), dtype)

    check()


def test_bias_as_parameter():
    smoke()

    @given(
        spelling=st.sampled_from(SPELLINGS),
        k=st.integers(1, 8),
        n=st.integers(1, 8),
        lead=st.lists(st.integers(1, 4), min_size=1, max_size=2),
        seed=st.integers(0, 2**16),
    )
    def check(spelling, k, n, lead, seed):
        if spelling[0] == "torch.mm(x, w)":
            lead = lead[:1]
        model = SpelledLayer(k, n, *spelling, seed=seed).double()
        gm = fuse_matmul_add_relu(model)
        assert fused_call_count(gm) == 1 and leftover_ops(gm) == []
        x = randn(*lead, k, seed=seed)
        with torch.no_grad():
            close(gm(x), model(x))

    check()


def test_bias_as_graph_input_of_any_broadcastable_shape():
    smoke()

    @given(
        spelling=st.sampled_from(SPELLINGS),
        m=st.integers(1, 5),
        k=st.integers(1, 6),
        n=st.integers(1, 6),
        bias_shape=st.sampled_from(["(N,)", "(1,)", "()", "(M, N)", "(M, 1)", "(2, M, N)"]),
        seed=st.integers(0, 2**16),
    )
    def check(spelling, m, k, n, bias_shape, seed):
        model = SpelledLayerBiasInput(k, n, *spelling, seed=seed).double()
        gm = fuse_matmul_add_relu(model)
        assert fused_call_count(gm) == 1 and leftover_ops(gm) == []
        shape = {"(N,)": (n,), "(1,)": (1,), "()": (), "(M, N)": (m, n), "(M, 1)": (m, 1), "(2, M, N)": (2, m, n)}
        x, b = randn(m, k, seed=seed), randn(*shape[bias_shape], seed=seed + 1)
        with torch.no_grad():
            out = gm(x, b)
            close(out, model(x, b))
        assert out.shape == torch.broadcast_shapes((m, n), b.shape)

    check()


def test_literal_bias_is_matched_and_correct():
    class LiteralBias(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(randn(4, 3))

        def forward(self, x):
            return F.relu(0.25 + x @ self.w)

    model = LiteralBias()
    gm = fuse_matmul_add_relu(model)
    assert fused_call_count(gm) == 1  # a pattern placeholder matches a Python literal too
    fused = next(n for n in gm.graph.nodes if n.target is fused_matmul_add_relu)
    assert 0.25 in (*fused.args, *fused.kwargs.values())  # passed by position or by name: either is a solution
    x = randn(5, 4)
    close(gm(x), model(x))


# ----------------------------------------------------------------------------------------------------------------------
# The fused op itself


def test_fused_op_matches_the_unfused_expression_on_every_input():
    smoke()

    @given(
        x_shape=st.sampled_from(["(K,)", "(M, K)", "(B, M, K)", "(A, B, M, K)"]),
        w_shape=st.sampled_from(["(K,)", "(K, N)"]),
        bias=st.sampled_from(["N", "1", "scalar", "float", "M1", "f32"]),
        m=st.integers(1, 4),
        k=st.integers(0, 5),
        n=st.integers(1, 4),
        seed=st.integers(0, 2**16),
    )
    def check(x_shape, w_shape, bias, m, k, n, seed):
        x = randn(
            *{"(K,)": (k,), "(M, K)": (m, k), "(B, M, K)": (2, m, k), "(A, B, M, K)": (2, 1, m, k)}[x_shape], seed=seed
        )
        w = randn(*{"(K,)": (k,), "(K, N)": (k, n)}[w_shape], seed=seed + 1)
        out_last = n if w.dim() == 2 else (m if x.dim() >= 2 else 1)
        b = {
            "N": randn(out_last, seed=seed + 2),
            "1": randn(1, seed=seed + 2),
            "scalar": randn(seed=seed + 2),
            "float": -0.5,
            "M1": randn(m, 1, seed=seed + 2),
            "f32": randn(out_last, seed=seed + 2, dtype=torch.float32),  # x @ w + b promotes; addmm would refuse
        }[bias]
        try:
            want = torch.relu(torch.matmul(x, w) + b)
        except RuntimeError:
            return  # a shape the original rejects (e.g. an (M, 1) bias on a 1-D result)
        got = fused_matmul_add_relu(x, w, b)
        assert got.dtype == want.dtype and got.shape == want.shape
        close(got, want)

    check()


# Views (reshape, view, expand, t) move no data: a solution may reshape a 2-D x too (Phase 2's test allows it).
FREE_OPS = {"view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand", "t", "transpose", "detach"}
FREE_OPS |= {"unsqueeze", "squeeze", "permute", "alias", "flatten", "unflatten"}


@pytest.mark.parametrize("lead", [(5,), (2, 5), (2, 3, 5)])
def test_fused_op_is_one_addmm_activation_kernel_for_a_column_bias(lead):
    x, w, b = randn(*lead, 4, dtype=torch.float32), randn(4, 3, dtype=torch.float32), randn(3, dtype=torch.float32)
    with torch.no_grad():
        ops = aten_ops(fused_matmul_add_relu, x, w, b)
    assert [op for op in ops if op not in FREE_OPS] == ["_addmm_activation"]  # one kernel; views are free


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
)
@pytest.mark.parametrize("lead", [(5,), (2, 5)])
def test_fused_op_with_no_inner_dim_is_relu_of_the_bias(lead, device):
    """K == 0: x @ w is all zeros, the result relu(b) broadcast over the rows. A fold by reshape(-1, 0) is ambiguous
    and raises; on CUDA torch._addmm_activation returns the bias without the ReLU (Phase 2's select_kernel_path)."""
    x, w = randn(*lead, 0).to(device), randn(0, 3).to(device)
    b = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64, device=device)
    want = torch.relu(torch.matmul(x, w) + b)
    with torch.no_grad():
        got = fused_matmul_add_relu(x, w, b)
    assert got.shape == want.shape
    close(got, want)


def test_a_reshape_of_a_2d_input_is_free():
    """The property is "one kernel", not "no view": folding every x, 2-D included, is a correct solution."""
    x, w, b = randn(5, 4, dtype=torch.float32), randn(4, 3, dtype=torch.float32), randn(3, dtype=torch.float32)
    ops = aten_ops(lambda: torch._addmm_activation(b, x.reshape(5, 4), w).view(5, 3))
    assert [op for op in ops if op not in FREE_OPS] == ["_addmm_activation"]


X_SHAPES = [(5, 4), (2, 5, 4)]  # every rule holds for a 2-D x and for a folded batched x


@pytest.mark.parametrize("x_shape", X_SHAPES, ids=["x 2-D", "x 3-D"])
@pytest.mark.parametrize("case", ["w 1-D", "b float32", "x, w float32"])
def test_fused_op_falls_back_where_addmm_activation_cannot_run(case, x_shape):
    """addmm needs a 2-D w and one dtype (the unfused + promotes): these inputs must take the unfused path."""
    x, w, b = randn(*x_shape), randn(4, 3), randn(3)
    if case == "w 1-D":
        w, b = randn(4), randn(x_shape[-2])
    elif case == "b float32":
        b = b.float()
    else:
        x, w = x.float(), w.float()
    want = torch.relu(torch.matmul(x, w) + b)
    got = fused_matmul_add_relu(x, w, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    close(got, want, want.dtype)


@pytest.mark.parametrize("x_shape", X_SHAPES, ids=["x 2-D", "x 3-D"])
@pytest.mark.parametrize("needs_grad", ["x", "w", "b"])
def test_fused_op_with_inputs_that_require_grad_has_gradients(needs_grad, x_shape):
    """_addmm_activation has no derivative: a call that needs gradients must still give the right ones."""
    x, w, b = randn(*x_shape, seed=1), randn(4, 3, seed=2), randn(3, seed=3)
    ref = [t.clone().requires_grad_(n == needs_grad) for n, t in zip("xwb", (x, w, b), strict=True)]
    got = [t.clone().requires_grad_(n == needs_grad) for n, t in zip("xwb", (x, w, b), strict=True)]
    g = randn(*x_shape[:-1], 3, seed=4)
    (torch.relu(torch.matmul(ref[0], ref[1]) + ref[2]) * g).sum().backward()
    (fused_matmul_add_relu(*got) * g).sum().backward()
    i = "xwb".index(needs_grad)
    close(got[i].grad, ref[i].grad)
    with torch.no_grad():  # and without autograd the same inputs take the one-kernel path again
        assert [op for op in aten_ops(fused_matmul_add_relu, *got) if op not in FREE_OPS] == ["_addmm_activation"]


@pytest.mark.parametrize("x_shape", [(5, 4), (2, 5, 4), (4,)], ids=["x 2-D", "x 3-D", "x 1-D"])
@pytest.mark.parametrize("bias", ["(M, 1)", "(1,)", "()", "float", "(2, M, N)"])
def test_fused_op_is_exact_for_every_bias_the_unfused_expression_accepts(bias, x_shape):
    """Which path a bias that is not one per column takes is the solution's choice (addmm would broadcast an (M, 1)
    bias of a 2-D x exactly, but not through the epilogue); the result must be the unfused expression's."""
    x, w = randn(*x_shape), randn(4, 3, seed=1)
    m = x_shape[-2] if len(x_shape) >= 2 else 1
    b = {"(M, 1)": randn(m, 1), "(1,)": randn(1), "()": randn(), "float": -0.25, "(2, M, N)": randn(2, m, 3)}[bias]
    try:
        want = torch.relu(torch.matmul(x, w) + b)
    except RuntimeError:
        pytest.skip("the unfused expression rejects this bias too")
    got = fused_matmul_add_relu(x, w, b)
    assert got.shape == want.shape
    close(got, want)


def test_the_lessons_row_bias_claim_is_what_is_measured():
    """The lesson says an (M, 1) bias is left to the unfused path because it is not the epilogue's bias, *not*
    because addmm would be wrong: measured, addmm agrees with the unfused expression to float32 rounding."""
    x, w, b = randn(6, 4, dtype=torch.float32), randn(4, 3, dtype=torch.float32), randn(6, 1, dtype=torch.float32)
    torch.testing.assert_close(torch._addmm_activation(b, x, w), torch.relu(x @ w + b))


def test_gradients_through_the_fused_call():
    smoke()

    @given(lead=st.sampled_from([(3,), (2, 3)]), k=st.integers(1, 5), n=st.integers(1, 5), seed=st.integers(0, 2**16))
    def check(lead, k, n, seed):
        model = models.MatmulAddReLU(k, n, 3, seed=seed).double()
        gm = fuse_matmul_add_relu(model)
        assert fused_call_count(gm) == 2
        x = randn(*lead, k, seed=seed)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        g = randn(*lead, 3, seed=seed + 1)
        (model(x1) * g).sum().backward()
        (gm(x2) * g).sum().backward()
        close(x2.grad, x1.grad)
        fused_params = dict(gm.named_parameters())
        for name, p in model.named_parameters():
            close(fused_params[name].grad, p.grad)

    check()


def test_gradcheck_fused_op():
    x, w, b = (randn(*s, seed=i).requires_grad_() for i, s in enumerate([(2, 3, 4), (4, 5), (5,)]))
    assert torch.autograd.gradcheck(fused_matmul_add_relu, (x, w, b))


# ----------------------------------------------------------------------------------------------------------------------
# Legality: intermediates with outside readers


class MatmulLeaks(nn.Module):
    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(randn(4, 3)), nn.Parameter(randn(3))

    def forward(self, x):
        m = x @ self.w
        return torch.relu(m + self.b) * m


class ReturnsIntermediate(MatmulLeaks):
    def forward(self, x):
        h = torch.matmul(x, self.w) + self.b
        return h.relu(), h


class ReluReadTwice(MatmulLeaks):
    def forward(self, x):
        y = F.relu(x @ self.w + self.b)
        return y * y.sum()  # the relu output (the returning node) may have any number of readers


@pytest.mark.parametrize("model_cls", [LeakyIntermediate, MatmulLeaks, ReturnsIntermediate])
def test_intermediate_with_an_outside_user_is_not_rewritten(model_cls):
    model = model_cls().double() if model_cls is LeakyIntermediate else model_cls()
    before = [(n.op, n.target) for n in copy.deepcopy(fx.symbolic_trace(model)).graph.nodes]
    gm = fuse_matmul_add_relu(model)
    assert fused_call_count(gm) == 0
    assert sum(pattern_counts(gm).values()) == 0
    assert [(n.op, n.target) for n in gm.graph.nodes] == before
    (skip,) = report_of(gm).skipped
    assert "outside the pattern" in skip.reason
    assert report_of(gm).fused == []
    x = randn(6, 32 if model_cls is LeakyIntermediate else 4)
    got, want = gm(x), model(x)
    for a, e in zip(
        got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,), strict=True
    ):
        close(a, e)


class LeakySpelling(nn.Module):
    """One spelling, with the add's output (the pre-ReLU value) read again outside the pattern."""

    def __init__(self, matmul, add, relu):
        super().__init__()
        self.spelling = (matmul, add, relu)

    def forward(self, x, w, b):
        matmul, add, relu = self.spelling
        h = ADDS[add](MATMULS[matmul](x, w), b)
        return RELUS[relu](h) * h


@pytest.mark.parametrize("spelling", SPELLINGS, ids=lambda s: spelling_name(*s))
def test_every_spelling_leaves_an_escaping_intermediate_alone(spelling):
    model = LeakySpelling(*spelling)
    gm = fuse_matmul_add_relu(model)
    assert fused_call_count(gm) == 0 and sum(pattern_counts(gm).values()) == 0
    x, w, b = randn(3, 4), randn(4, 2, seed=1), randn(2, seed=2)
    close(gm(x, w, b), model(x, w, b))


def test_relu_with_several_users_is_still_fused():
    model = ReluReadTwice()
    gm = fuse_matmul_add_relu(model)
    assert fused_call_count(gm) == 1 and leftover_ops(gm) == []
    x = randn(6, 4)
    close(gm(x), model(x))


class NotInTheSet(nn.Module):
    """Spellings outside the tables: each must be left alone (alpha=2 would be *wrong* if fused)."""

    def __init__(self, which):
        super().__init__()
        self.which = which
        self.w, self.b = nn.Parameter(randn(4, 4)), nn.Parameter(randn(4))
        self.act = nn.ReLU()

    def forward(self, x):
        if self.which == "method matmul":
            return torch.relu(x.matmul(self.w) + self.b)
        if self.which == "alpha":
            return torch.relu(torch.add(x @ self.w, self.b, alpha=2))
        if self.which == "inplace relu":
            return F.relu(x @ self.w + self.b, inplace=True)
        if self.which == "repeated operand":
            h = x @ self.w
            return torch.relu(h + h)
        if self.which == "square":
            return torch.relu(x @ x + self.b)
        if self.which == "relu module":
            return self.act(x @ self.w + self.b)
        raise AssertionError(self.which)


@pytest.mark.parametrize(
    "which, reason",
    [
        ("method matmul", "syntactic"),
        ("alpha", "keyword"),
        ("inplace relu", "keyword"),
        ("repeated operand", "one-to-one"),
        ("square", "one-to-one"),
        ("relu module", "syntactic"),
    ],
)
def test_spellings_outside_the_set_are_left_alone_and_reported(which, reason):
    model = NotInTheSet(which)
    gm = fuse_matmul_add_relu(model)
    assert fused_call_count(gm) == 0
    (skip,) = report_of(gm).skipped
    assert reason in skip.reason
    x = randn(4, 4)
    close(gm(x.clone()), model(x.clone()))


# ----------------------------------------------------------------------------------------------------------------------
# Back to back, mixed spellings, a smaller set


def test_back_to_back_chains_are_all_fused():
    smoke()

    @given(
        dims=st.lists(st.integers(1, 8), min_size=2, max_size=4),
        lead=st.sampled_from([(1,), (5,), (2, 3)]),
        seed=st.integers(0, 2**16),
    )
    def check(dims, lead, seed):
        model = models.MatmulAddReLU(*dims, seed=seed).double()
        gm = fuse_matmul_add_relu(model)
        gm.graph.lint()
        layers = len(dims) - 1
        assert fused_call_count(gm) == layers and leftover_ops(gm) == []
        assert pattern_counts(gm)["torch.relu(x @ w + b)"] == layers
        assert len(report_of(gm).fused) == layers and report_of(gm).skipped == []
        fused = [n for n in gm.graph.nodes if n.target is fused_matmul_add_relu]
        for first, second in itertools.pairwise(fused):
            assert first in second.all_input_nodes  # each layer reads the previous fused call
        x = randn(*lead, dims[0], seed=seed)
        with torch.no_grad():
            close(gm(x), model(x))

    check()


def test_the_dims_of_the_lesson_chain():
    gm = fuse_matmul_add_relu(models.MatmulAddReLU(32, 64, 16))
    gm.graph.lint()
    assert fused_call_count(gm) == 2
    assert [d.nodes for d in report_of(gm).fused] == [("matmul", "add", "relu"), ("matmul_1", "add_1", "relu_1")]
    assert [d.replacement for d in report_of(gm).fused] == ["fused_matmul_add_relu", "fused_matmul_add_relu_1"]


def test_one_handwritten_rule_misses_spellings_the_set_catches():
    model = MixedSpellings().double()
    x = randn(3, 32)
    (rule,) = [r for r in pattern_set() if r.name == "torch.relu(x @ w + b)"]
    one = fuse_matmul_add_relu(model, patterns=[rule])
    assert fused_call_count(one) == 1
    assert pattern_counts(one) == {"torch.relu(x @ w + b)": 1}
    assert len(report_of(one).skipped) == 2 and all("syntactic" in d.reason for d in report_of(one).skipped)
    full = fuse_matmul_add_relu(model)
    assert fused_call_count(full) == 3 and leftover_ops(full) == []
    assert {k: v for k, v in pattern_counts(full).items() if v} == {spelling_name(*s): 1 for s in model.SPELLINGS}
    assert list(pattern_counts(full)) == [r.name for r in pattern_set()]  # every rule, in the order tried
    with torch.no_grad():
        close(one(x), model(x))
        close(full(x), model(x))


def test_fusing_a_fused_graph_again_keeps_the_fused_calls():
    once = fuse_matmul_add_relu(models.MatmulAddReLU(8, 6, 4))
    twice = fuse_matmul_add_relu(once)  # re-traced: the wrapped call must stay one leaf node
    assert fused_call_count(twice) == 2 and sum(pattern_counts(twice).values()) == 0
    x = randn(3, 8, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(twice(x), once(x))


# ----------------------------------------------------------------------------------------------------------------------
# The caller's model, bad input, the lesson


def test_callers_module_is_unchanged():
    model = MixedSpellings()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modules = [(name, type(m)) for name, m in model.named_modules()]
    gm = fuse_matmul_add_relu(model)
    assert fused_call_count(gm) == 3
    assert [(name, type(m)) for name, m in model.named_modules()] == modules
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k])
    ptrs = {p.data_ptr() for p in model.parameters()}
    assert not ptrs & {p.data_ptr() for p in gm.parameters()}  # a copy, not shared storage


def test_callers_graph_module_is_unchanged():
    traced = fx.symbolic_trace(models.MatmulAddReLU(8, 6, 4))
    code, nodes = traced.code, [n.name for n in traced.graph.nodes]
    gm = fuse_matmul_add_relu(traced)
    assert fused_call_count(gm) == 2
    assert traced.code == code and [n.name for n in traced.graph.nodes] == nodes


def test_bad_input_gets_a_clear_error():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        fuse_matmul_add_relu(models.MatmulAddReLU)

    class Branchy(nn.Module):
        def forward(self, x):
            return x.relu() if x.sum() > 0 else x

    with pytest.raises(UntraceableModelError, match="Branchy"):
        fuse_matmul_add_relu(Branchy())


def test_pattern_counts_needs_a_fused_module():
    with pytest.raises(KeyError, match="fuse_matmul_add_relu"):
        pattern_counts(fx.symbolic_trace(models.MatmulAddReLU()))


def test_phase_runs(capsys):
    from fusion import pattern_rewriter

    pattern_rewriter.run(quick=True)
    out = capsys.readouterr().out
    assert "1 of 3 fused" in out and "3 of 3 fused" in out
    assert "outside the pattern" in out
    assert "fused calls: 2; graph.lint() passes" in out
    assert "_addmm_activation" in out
