"""Phase 9: torch.compile(backend="fusion") — outputs equal eager, kernels really generated, legality of the passes.

Small shapes (the generated kernels run in Triton's interpreter on CPU); every test starts from reset().
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion import backend, models
from fusion.compiler import aten_passes

pytestmark = pytest.mark.phase9

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def fresh():
    backend.reset()
    yield
    backend.reset()


def folded(report) -> int:
    """Folds that happened, whatever the pass notes are called: the convolutions reading folded weights."""
    return sum(part.folded for part in report.parts)


def test_registered_once_and_reimport_is_fine():
    assert "fusion" in torch._dynamo.list_backends(exclude_tags=())
    importlib.reload(backend)  # a second registration under the same name must not fail
    f = torch.compile(lambda x: torch.relu(x * 2.0 + 1.0) - x, backend="fusion")
    x = torch.randn(3, 5)
    torch.testing.assert_close(f(x), torch.relu(x * 2.0 + 1.0) - x)
    assert len(backend.reports) == 1


def test_plain_function_uses_generated_kernels():
    def f(x, y):  # (B, N), (N,): a broadcast pointwise chain and a last-dim reduction
        h = torch.relu(x * y + 1.0) * 0.5 + x
        return h, h.sum(-1)

    x, y = torch.randn(4, 7), torch.randn(7)
    got, want = torch.compile(f, backend="fusion")(x, y), f(x, y)
    torch.testing.assert_close(got, want)
    (report,) = backend.reports
    assert report.kernels, report.table()
    assert all(k.source and k.name for k in report.kernels)
    part = report.part("inference")
    assert part is not None and part.compiled and not part.library_calls, report.table()


@settings(max_examples=6)
@given(
    rows=st.integers(1, 9),
    cols=st.integers(1, 13),
    broadcast_rows=st.booleans(),
    transposed=st.booleans(),
)
def test_pointwise_and_softmax_on_drawn_shapes(rows, cols, broadcast_rows, transposed):
    """Odd sizes, size-1 dims, a broadcast operand and non-contiguous inputs, each shape compiled afresh."""
    backend.reset()

    def f(x, y):  # (R, C), (1 or R, C)
        return torch.softmax(torch.tanh(x * y) - 0.5 * x, dim=-1) + y

    g = torch.Generator().manual_seed(rows * 100 + cols)
    x = torch.randn(cols, rows, generator=g).T if transposed else torch.randn(rows, cols, generator=g)
    y = torch.randn(1 if broadcast_rows else rows, cols, generator=g)
    torch.testing.assert_close(torch.compile(f, backend="fusion", dynamic=False)(x, y), f(x, y))
    assert backend.reports and all(r.parts[0].compiled for r in backend.reports)


def test_dynamic_shapes_run_as_aten_with_a_reason():
    def f(x):
        return torch.relu(x * 2.0 + 1.0)

    compiled = torch.compile(f, backend="fusion", dynamic=True)
    for n in (3, 5):
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x), f(x))
    assert any("dynamic" in why for r in backend.reports for _, why in r.fallbacks)


def test_data_dependent_control_flow_compiles_every_graph():
    model = models.DataDependentBlock(d=16).eval()
    (x,) = models.data_dependent_inputs(batch=4, d=16)
    compiled = torch.compile(model, backend="fusion")
    with torch.no_grad():
        branches = set()
        for inp in (x, -x, x + 3.0, x - 3.0):
            branches.add(bool(torch.tanh(model.fc(inp) * model.a + model.b).mean() > 0))
            torch.testing.assert_close(compiled(inp), model(inp))
    assert branches == {True, False}, "the inputs must take both branches"
    assert len(backend.reports) >= 3  # the graph before the branch, then one per branch taken
    assert all(r.parts and r.parts[0].compiled for r in backend.reports)
    assert sum(bool(r.kernels) for r in backend.reports[1:]) == 2, backend.summary(backend.reports)
    assert "graph" in backend.summary(backend.reports)


def test_transformer_encoder_layer():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).eval()
    src = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # the fused fast path would be one opaque op
    try:
        with torch.no_grad():
            got, want = torch.compile(layer, backend="fusion")(src), layer(src)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert sum(len(r.kernels) for r in backend.reports) >= 2  # LayerNorms (+ residual adds), ReLU...


def test_conv_bn_relu_net_folds_and_refolds_when_parameters_change():
    model = models.ConvBNNet(width=4).eval()
    (x,) = models.conv_inputs(batch=2, size=6)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    compiled = torch.compile(model, backend="fusion")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.state_dict(), before, rtol=0, atol=0)  # the fold never edits the model
        (report,) = backend.reports
        assert folded(report) == 3, report.table()
        assert report.kernels, report.table()
        ops = [n for n in report.parts[0].library_calls]
        assert not any("batch_norm" in op for op in ops), ops  # no BatchNorm left to run
        # In-place writes (optimizer step, load_state_dict, running stats) must reach the folded weights.
        model.bn1.running_var.mul_(3.0)
        model.stem[1].weight.add_(0.5)
        model.conv1.weight.mul_(-1.0)
        model.conv2.weight.add_(0.1)  # the depthwise conv's weight
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        model.bn2.bias.data = torch.randn(4)  # a new tensor object, not an in-place write
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert len(backend.reports) == 1  # no recompile needed: the fold refreshed itself
    if not torch.cuda.is_available():  # no cuDNN epilogue installed on a CPU
        assert not any("cudnn" in op for part in report.parts for op in part.library_calls), report.table()


@given(
    channels_last=st.booleans(),
    depthwise=st.booleans(),
    size=st.integers(1, 5),
    act=st.sampled_from(["relu", "relu6", "residual"]),
)
@settings(max_examples=6, deadline=None)
def test_conv_bias_joins_the_generated_kernel_after_the_conv(channels_last, depthwise, size, act):
    """A conv's (folded) bias becomes a pointwise add that the region after the conv takes: no separate bias pass."""
    torch._dynamo.reset()
    backend.reset()
    c = 4
    conv = nn.Conv2d(c, c, 3, padding=1, groups=c if depthwise else 1)

    def f(x):
        y = conv(x)
        if act == "relu":
            return torch.relu(y)
        return F.relu6(y) if act == "relu6" else y + x

    x = torch.randn(2, c, size, size + 1)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, backend="fusion")(x), f(x), rtol=1e-5, atol=1e-5)
    (report,) = backend.reports
    split = [p for part in report.parts for p in part.passes if p[0] == "conv bias"]
    assert split and split[0][2] == "split", report.table()
    assert any("add" in k.name for k in report.kernels), report.table()  # the bias add is inside a kernel


class FoldCases(nn.Module):
    """Three conv+BN pairs: only the transposed one may be folded."""

    def __init__(self, c: int = 4):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.conv_shared = nn.Conv2d(c, c, 3, padding=1)
            self.bn_shared = nn.BatchNorm2d(c)
            self.w = nn.Parameter(torch.randn(c, c, 3, 3) * 0.3)
            self.bn_computed = nn.BatchNorm2d(c)
            self.convt = nn.ConvTranspose2d(c, c, 3, padding=1, groups=2)
            self.bn_t = nn.BatchNorm2d(c)
        models.randomize_batchnorm_(self)

    def forward(self, x):  # (B, c, H, W)
        y = self.conv_shared(x)
        h1 = self.bn_shared(y) + y  # the conv output has a second user: folding would change it
        h2 = self.bn_computed(F.conv2d(x, self.w * 2.0, padding=1))  # a weight computed in the graph
        h3 = self.bn_t(self.convt(x))  # ConvTranspose2d, groups=2: [C_in, C_out/groups, k, k]
        return h1 + h2 + h3


def test_fold_legality_and_transposed_grouped_fold():
    model = FoldCases().double().eval()
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="fusion")(x), model(x), rtol=1e-10, atol=1e-10)
    (report,) = backend.reports
    assert folded(report) == 1, report.table()
    # The learner's notes, under any pass name: everything but the machinery's own epilogue notes.
    refused = [p for p in report.parts[0].passes if p[2] == "skipped" and p[0] != "cudnn epilogue"]
    assert len(refused) == 2 and all(p[3] for p in refused), report.table()


SOURCES = ("conv weight", "conv bias", "bn weight", "bn bias", "running mean", "running var")


class ComputedSource(nn.Module):
    """batch_norm(conv2d(x, w, b), rm, rv, bn_w, bn_b) in eval mode, with one source computed in the graph (× 2)."""

    def __init__(self, computed: str | None, c: int = 3):
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.computed = computed
        self.w = nn.Parameter(torch.randn(c, c, 3, 3, generator=g, dtype=torch.float64) * 0.3)
        for name in ("b", "bn_w", "bn_b"):
            setattr(self, name, nn.Parameter(torch.randn(c, generator=g, dtype=torch.float64)))
        self.register_buffer("rm", torch.randn(c, generator=g, dtype=torch.float64))
        self.register_buffer("rv", torch.rand(c, generator=g, dtype=torch.float64) + 0.5)

    def forward(self, x):  # (B, c, H, W)
        t = dict(zip(SOURCES, (self.w, self.b, self.bn_w, self.bn_b, self.rm, self.rv), strict=True))
        if self.computed:
            t[self.computed] = t[self.computed] * 2.0  # not a parameter any more: its value exists only in the call
        y = F.conv2d(x, t["conv weight"], t["conv bias"], padding=1)
        return F.batch_norm(y, t["running mean"], t["running var"], t["bn weight"], t["bn bias"], training=False)


@pytest.mark.parametrize("computed", [None, *SOURCES])
def test_fold_refuses_every_source_computed_in_the_graph(computed):
    """A fold reads its sources' values at run time, so each one (conv weight and bias, BN weight and bias, running
    mean and var) must be a graph input: a legality check that forgets one source must fail here."""
    model = ComputedSource(computed).eval()
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="fusion")(x), model(x), rtol=1e-10, atol=1e-10)
    (report,) = backend.reports
    assert not report.error and all(p.compiled for p in report.parts), report.table()
    assert folded(report) == (1 if computed is None else 0), report.table()


def test_an_exception_in_a_pass_surfaces_naming_where(monkeypatch):
    """A bug in a learner's pass (here a KeyError in find_conv_bn_folds) must not hide behind correct outputs of an
    uncompiled graph: in tests and practice workspaces it is raised, naming the function; a user's run falls back."""

    def broken(gm):
        return {}["conv"]

    monkeypatch.setattr(backend, "find_conv_bn_folds", broken)
    model = models.ConvBNNet(width=4).eval()
    (x,) = models.conv_inputs(batch=1, size=5)
    with torch.no_grad(), pytest.raises(Exception, match="KeyError") as info:
        torch.compile(model, backend="fusion")(x)
    assert "fusion/backend.py" in str(info.value) and "fold_batch_norm" in str(info.value)  # the lesson's caller
    backend.reset()
    monkeypatch.setenv("FUSION_STRICT", "0")  # a user's run: never a crash, the reason in the report
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="fusion")(x), model(x), rtol=1e-5, atol=1e-5)
    assert "KeyError" in (backend.reports[0].error or ""), backend.reports[0]


def test_max_pool_is_the_same_op_for_capture_aten_and_the_backend():
    """One decomposition table: Phase 6's capture and Phase 9's AOTAutograd lowering give max-pool the same ops."""
    from fusion.regions import capture_aten

    model = nn.Sequential(nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    x = torch.randn(1, 2, 6, 6)
    pools = {str(n.target) for n in capture_aten(model, (x,)).graph.nodes if "max_pool" in str(n.target)}
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="fusion")(x), model(x))
    (report,) = backend.reports
    seen = {op for part in report.parts for op in part.library_calls}
    seen |= {op for k in report.kernels for op in k.ops}
    assert pools and {p.split(".")[1] for p in pools} <= {op.split(".")[0] for op in seen}, (pools, report.table())


def test_training_mode_batch_norm_is_not_folded_and_updates_stats():
    eager = models.ConvBNNet(width=4).train()
    mine = models.ConvBNNet(width=4).train()
    (x,) = models.conv_inputs(batch=2, size=6)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(mine, backend="fusion")(x), eager(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine.bn1.running_mean, eager.bn1.running_mean)
    torch.testing.assert_close(mine.bn1.running_var, eager.bn1.running_var)
    assert not any(folded(r) for r in backend.reports)


def test_eval_model_with_gradients_is_not_folded():
    """Eval-mode BatchNorm, but grad enabled: a forward+backward graph, where a fold would change the gradients."""
    eager, mine = models.ConvBNNet(width=4).eval(), models.ConvBNNet(width=4).eval()
    (x,) = models.conv_inputs(batch=2, size=5)
    torch.compile(mine, backend="fusion")(x).square().sum().backward()
    eager(x).square().sum().backward()
    for (name, p), q in zip(mine.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert not any(folded(r) for r in backend.reports)


def test_gradients_of_a_training_graph():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 3))
    ref = [p.detach().clone().requires_grad_() for p in model.parameters()]
    x = torch.randn(5, 6)
    torch.compile(model, backend="fusion")(x).square().sum().backward()
    w1, b1, g, beta, w2, b2 = ref
    h = F.layer_norm(F.gelu(x @ w1.T + b1), (8,), g, beta)
    (h @ w2.T + b2).square().sum().backward()
    for p, r in zip(model.parameters(), ref, strict=True):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-5, atol=1e-5)
    (report,) = backend.reports
    assert {p.kind for p in report.parts} == {"forward", "backward"}
    assert report.part("forward").kernels, report.table()
    backward = report.part("backward")  # LayerNorm's backward reduces over dim 0: it may run as aten, with a reason
    assert backward.kernels or (backward.fallbacks and all(why for _, why in backward.fallbacks)), report.table()


def test_unsupported_op_runs_as_aten_with_a_reason():
    def f(x):
        return torch.special.bessel_j0(x * 2.0 + 1.0) * x - 1.0

    x = torch.randn(3, 6)
    torch.testing.assert_close(torch.compile(f, backend="fusion")(x), f(x))
    (report,) = backend.reports
    reasons = [why for _, why in report.fallbacks]
    assert reasons and all(reasons), report.table()


def test_options_switch_stages_off():
    model = models.ConvBNNet(width=4).eval()
    (x,) = models.conv_inputs(batch=1, size=5)
    compiled = torch.compile(model, backend="fusion", options={"fold_bn": False, "codegen": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    (report,) = backend.reports
    assert not report.kernels and not folded(report)
    assert report.fallbacks and not report.parts[0].compiled
    with pytest.raises(ValueError, match="fold_bn"):
        backend.Options.parse({"fold_bm": True})


def test_a_pass_is_one_function_and_one_list_entry(monkeypatch):
    """A new pass (here opt-in, written as f(gm, note) like Phase 10's overlap pass) gets its option from its name
    and runs in list order, after the passes before it."""
    from fusion.compiler.passes import Pass

    seen = []

    def count_relus(gm, note):
        relus = [n.name for n in gm.graph.nodes if n.target is aten.relu.default]
        seen.append(len(relus))
        note("count relus", relus, "counted", f"{len(relus)} relu(s)")

    entry = Pass("count_relus", lambda gm, part: count_relus(gm, part.note_pass), default=False)
    monkeypatch.setattr(backend, "PASSES", [*backend.PASSES, entry])
    f = lambda x: torch.relu(x * 2.0) + 1.0  # noqa: E731
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.compile(f, backend="fusion")(x), f(x))
    assert seen == []  # opt-in: off unless asked for
    backend.reset()
    torch.testing.assert_close(torch.compile(f, backend="fusion", options={"count_relus": True})(x), f(x))
    assert seen == [1]
    assert [p[0] for p in backend.reports[0].parts[0].passes] == ["count relus"]
    assert backend.Options.parse({"count_relus": True}).count_relus


def test_reset_clears_reports():
    torch.compile(lambda x: x.sin() * 2 + 1, backend="fusion")(torch.randn(4))
    assert backend.reports
    backend.reset()
    assert backend.reports == []


# ----------------------------------------------------------------------------------------------------------------------
# The cuDNN epilogue pass: matched on aten graphs over fake CUDA tensors (no GPU needed to check the rewrite)


def _fake_cuda_graph(fn, *shapes):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        args = [torch.empty(s, device="cuda") for s in shapes]
        return make_fx(fn)(*args)


def _conv(x, w, b, groups=1):
    return aten.convolution.default(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], groups)


@pytest.mark.parametrize(
    ("fn", "shapes", "fused"),
    [
        (lambda x, w, b: torch.relu(_conv(x, w, b)), [(2, 4, 6, 6), (4, 4, 3, 3), (4,)], 1),
        (lambda x, w, b, z: torch.relu(_conv(x, w, b) + z), [(2, 4, 6, 6), (4, 4, 3, 3), (4,), (2, 4, 6, 6)], 1),
        (lambda x, w, b, z: torch.relu(z + _conv(x, w, b)), [(2, 4, 6, 6), (4, 4, 3, 3), (4,), (2, 4, 6, 6)], 1),
        (lambda x, w, b: torch.relu(_conv(x, w, b, groups=4)), [(2, 4, 6, 6), (4, 1, 3, 3), (4,)], 0),  # depthwise
        (lambda x, w, b: torch.relu(_conv(x, w, b)) + _conv(x, w, b), [(2, 4, 6, 6), (4, 4, 3, 3), (4,)], 1),
        (lambda x, w, b: (lambda y: torch.relu(y) + y)(_conv(x, w, b)), [(2, 4, 6, 6), (4, 4, 3, 3), (4,)], 0),
        (lambda x, w, b, z: torch.relu(_conv(x, w, b) + z), [(2, 4, 6, 6), (4, 4, 3, 3), (4,), (4, 1, 1)], 0),
        (lambda x, w, b: torch.sigmoid(_conv(x, w, b)), [(2, 4, 6, 6), (4, 4, 3, 3), (4,)], 0),
    ],
    ids=["relu", "add-relu", "relu-z-first", "depthwise", "two-convs", "conv-two-users", "z-broadcast", "sigmoid"],
)
def test_epilogue_rewrite_legality(fn, shapes, fused):
    gm = _fake_cuda_graph(fn, *shapes)
    notes = []
    count = aten_passes.install_epilogues(gm, "grouped: slow", lambda *a: notes.append(a))
    assert count == fused, (gm.code, notes)
    targets = {n.target for n in gm.graph.nodes}
    epilogues = {aten_passes.cudnn_conv_bias_relu, aten_passes.cudnn_conv_bias_add_relu}
    assert bool(targets & epilogues) == bool(fused)
    if "groups=4" in gm.code or shapes[1] == (4, 1, 3, 3):
        assert any(n[2] == "skipped" and "grouped" in n[3] for n in notes)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the cuDNN epilogue needs CUDA")
def test_cuda_conv_bn_net_uses_the_epilogue():
    model = models.ConvBNNet(width=8).cuda().eval()
    (x,) = models.conv_inputs(batch=2, size=8)
    x = x.cuda()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="fusion")(x), model(x), rtol=1e-3, atol=1e-3)
    (report,) = backend.reports
    epilogue = [p for p in report.parts[0].passes if p[0] == "cudnn epilogue"]
    assert sum(p[2] == "fused" for p in epilogue) == 2, report.table()  # stem and conv1; conv2 is depthwise
    assert any(p[2] == "skipped" and "grouped" in p[3] for p in epilogue)
