"""Phase 9: torch.compile(backend="fusion") — outputs equal eager, kernels really generated, legality of the passes.

Small shapes (the generated kernels run in Triton's interpreter on CPU); every test starts from reset().
"""

from __future__ import annotations

import collections
import contextlib
import copy
import importlib
import operator
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support import MaskedAttention, library_calls, spy_mask_rewrite

from fusion import backend, models
from fusion.common import is_todo
from fusion.compiler import aot, driver, epilogue, gemm_passes, graph_passes
from fusion.kernels import c_runtime, cudnn

pytestmark = pytest.mark.phase9

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def fresh():
    backend.reset()
    yield
    backend.reset()


FOLD = {"fold_bn": True}  # the opt-in fold (the freezing promise: no writes through p.data)


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
    compiled = torch.compile(model, backend="fusion", options=FOLD)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.state_dict(), before, rtol=0, atol=0)  # the fold never edits the model
        (report,) = backend.reports
        assert folded(report) == 3, report.table()
        assert sum(p[2] == "folded" for p in report.parts[0].passes) == 3, report.table()  # every fold noted
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
    act=st.sampled_from(["relu", "relu6", "residual", "permute_layer_norm"]),
)
@settings(max_examples=6, deadline=None)
def test_conv_bias_joins_the_generated_kernel_after_the_conv(channels_last, depthwise, size, act):
    """A conv's (folded) bias becomes a pointwise add that the region after the conv takes (through views too): no
    separate bias pass."""
    torch._dynamo.reset()
    backend.reset()
    c = 4
    conv = nn.Conv2d(c, c, 3, padding=1, groups=c if depthwise else 1)

    def f(x):
        y = conv(x)
        if act == "relu":
            return torch.relu(y)
        if act == "permute_layer_norm":  # ConvNeXt: the conv's output reaches its LayerNorm through a permute
            return F.layer_norm(y.permute(0, 2, 3, 1), (c,))
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


def test_convnext_conv_bias_joins_the_layer_norm_kernel_through_the_permute():
    """ConvNeXt's block: depthwise 7x7 conv → permute → LayerNorm. The bias add lands in the LayerNorm's reduction
    kernel (an H200 profile: 22 separate bias adds, 226 us a call)."""
    torch._dynamo.reset()
    backend.reset()
    conv = nn.Conv2d(8, 8, 7, padding=3, groups=8)

    def block(x):
        return F.layer_norm(conv(x).permute(0, 2, 3, 1), (8,))

    x = torch.randn(2, 8, 5, 6).to(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(block, backend="fusion")(x), block(x), rtol=1e-5, atol=1e-5)
    (report,) = backend.reports
    assert [p[2] for part in report.parts for p in part.passes if p[0] == "conv bias"] == ["split"], report.table()
    assert any("add" in k.name and k.kind == "reduction" for k in report.kernels), report.table()


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
        torch.testing.assert_close(
            torch.compile(model, backend="fusion", options=FOLD)(x), model(x), rtol=1e-10, atol=1e-10
        )
    (report,) = backend.reports
    assert folded(report) == 1, report.table()
    # The learner's notes, under any pass name: everything but the machinery's own epilogue, depthwise and layout notes.
    machinery = ("cudnn epilogue", "depthwise conv", "channels_last")
    refused = [p for p in report.parts[0].passes if p[2] == "skipped" and p[0] not in machinery]
    assert len(refused) == 2 and all(p[3] for p in refused), report.table()
    noted = [p for p in report.parts[0].passes if p[2] == "folded"]  # each fold noted: (conv, bn), 'folded'
    assert len(noted) == 1 and noted[0][1].count(" → ") == 1, report.table()


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
        torch.testing.assert_close(
            torch.compile(model, backend="fusion", options=FOLD)(x), model(x), rtol=1e-10, atol=1e-10
        )
    (report,) = backend.reports
    assert not report.error and all(p.compiled for p in report.parts), report.table()
    assert folded(report) == (1 if computed is None else 0), report.table()


class SavedStatisticsUsed(nn.Module):
    """conv → eval-mode batch norm whose saved statistics (outputs 1 and 2) are returned too: the fold would erase
    them, so the pair must be refused (the rule: every user of the BN is getitem 0)."""

    def __init__(self, c: int = 3):
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.w = nn.Parameter(torch.randn(c, c, 3, 3, generator=g, dtype=torch.float64) * 0.3)
        self.bn = nn.BatchNorm2d(c, dtype=torch.float64)
        models.randomize_batchnorm_(self)

    def forward(self, x):  # (B, c, H, W)
        bn = self.bn
        y = F.conv2d(x, self.w, padding=1)
        return torch.ops.aten._native_batch_norm_legit_no_training(
            y, bn.weight, bn.bias, bn.running_mean, bn.running_var, 0.1, bn.eps
        )


def test_fold_refuses_a_batch_norm_whose_saved_statistics_are_used():
    model = SavedStatisticsUsed().eval()
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = torch.compile(model, backend="fusion", options=FOLD)(x), model(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
    (report,) = backend.reports
    assert not report.error and all(p.compiled for p in report.parts), report.table()
    assert folded(report) == 0, report.table()


def test_an_exception_in_a_pass_surfaces_naming_where(monkeypatch):
    """A bug in a learner's pass (here a KeyError in find_conv_bn_folds) must not hide behind correct outputs of an
    uncompiled graph: in tests and practice workspaces it is raised, naming the function; a user's run falls back."""

    def broken(gm):
        return {}["conv"]

    monkeypatch.setattr(backend, "find_conv_bn_folds", broken)
    model = models.ConvBNNet(width=4).eval()
    (x,) = models.conv_inputs(batch=1, size=5)
    with torch.no_grad(), pytest.raises(Exception) as info:
        torch.compile(model, backend="fusion", options=FOLD)(x)
    if is_todo(info.value):  # a practice workspace where fold_batch_norm itself is still a TODO
        raise info.value
    assert "KeyError" in str(info.value), info.value
    assert "fusion/backend.py" in str(info.value) and "fold_batch_norm" in str(info.value)  # the lesson's caller
    backend.reset()
    monkeypatch.setenv("FUSION_STRICT", "0")  # a user's run: never a crash, the reason in the report
    with torch.no_grad():
        torch.testing.assert_close(
            torch.compile(model, backend="fusion", options=FOLD)(x), model(x), rtol=1e-5, atol=1e-5
        )
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
    targets = [op.split(" = ")[-1] for k in report.kernels for op in k.ops]  # "relu = aten.relu.default"
    seen = {op.split(".")[0] for op in seen} | {t.split(".")[1] for t in targets if "." in t}
    assert pools and {p.split(".")[1] for p in pools} <= seen, (pools, report.table())


def test_max_pool_gradients_through_the_backend():
    """Training: the backward reads the pool's window offsets, so the pool stays one aten call (its values are
    generated only where nothing reads the offsets); forward and gradients are eager's, ties and NaN-free."""
    torch._dynamo.reset()
    backend.reset()
    model = nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, 1), nn.Flatten(), nn.Linear(27, 2)
    )
    x = torch.randn(2, 2, 6, 6, requires_grad=True)
    mine, x2 = copy.deepcopy(model), x.detach().clone().requires_grad_()
    torch.compile(mine, backend="fusion")(x2).square().sum().backward()
    model(x).square().sum().backward()
    torch.testing.assert_close(x2.grad, x.grad)
    for a, b in zip(mine.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_training_mode_batch_norm_is_not_folded_and_updates_stats():
    eager = models.ConvBNNet(width=4).train()
    mine = models.ConvBNNet(width=4).train()
    (x,) = models.conv_inputs(batch=2, size=6)
    with torch.no_grad():
        torch.testing.assert_close(
            torch.compile(mine, backend="fusion", options=FOLD)(x), eager(x), rtol=1e-5, atol=1e-5
        )
    torch.testing.assert_close(mine.bn1.running_mean, eager.bn1.running_mean)
    torch.testing.assert_close(mine.bn1.running_var, eager.bn1.running_var)
    assert not any(folded(r) for r in backend.reports)


def test_eval_model_with_gradients_is_not_folded():
    """Eval-mode BatchNorm, but grad enabled: a forward+backward graph, where a fold would change the gradients."""
    eager, mine = models.ConvBNNet(width=4).eval(), models.ConvBNNet(width=4).eval()
    (x,) = models.conv_inputs(batch=2, size=5)
    torch.compile(mine, backend="fusion", options=FOLD)(x).square().sum().backward()
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


def _calls() -> collections.Counter:
    """The library calls of every graph compiled since the last reset, added up."""
    return library_calls()


def _ops_of(part) -> set[str]:
    """The aten ops a compiled part runs outside its kernels."""
    return set(part.library_calls)


def test_training_batch_norm_updates_its_statistics_in_place_as_eager():
    """Pass ``reinplace``: no copy_ into the BatchNorm buffers (the in-place _native_batch_norm_legit and add_), the
    same running statistics, counters and gradients as eager over two steps, and over two forwards before their
    backwards (the backward is handed the buffer: a version-counter error would show here)."""

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1), nn.BatchNorm2d(2))

    eager, mine = net().train(), net().train()
    compiled = torch.compile(mine, backend="fusion")
    xs = [torch.randn(2, 3, 6, 5, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    for x in xs[:2]:  # two steps
        compiled(x).square().sum().backward()
        eager(x).square().sum().backward()
    a, b = compiled(xs[2]).sum(), compiled(xs[0]).square().sum()  # two forwards, then their backwards
    c, d = eager(xs[2]).sum(), eager(xs[0]).square().sum()
    for loss in (a, b, c, d):
        loss.backward()
    for (name, t), u in zip(mine.state_dict().items(), eager.state_dict().values(), strict=True):
        torch.testing.assert_close(t, u, rtol=1e-5, atol=1e-6, msg=name)  # running stats, num_batches_tracked
    for (name, p), q in zip(mine.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    forward = backend.reports[0].part("forward")
    calls = {getattr(n.target, "__name__", "").split(".")[0]  # an overload, its binding or a Tensor method
             for n in forward.graph.graph_module.graph.nodes if n.op == "call_function"}  # fmt: skip
    assert "copy_" not in calls and "add_" in calls and "_native_batch_norm_legit" in calls, calls
    assert "_native_batch_norm_legit_functional" not in calls, calls
    assert ("reinplace", "4 buffer update(s)") in [p[:2] for p in forward.passes], forward.passes


def test_training_keeps_batch_norm_max_pool_and_embedding_backward_whole_and_exact():
    """A training graph keeps capture.TRAINING_KEEP whole (the library's kernels, as eager runs them); inference
    still decomposes batch norm into the ops its kernels fuse. Outputs, running stats and gradients equal eager."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = nn.Embedding(11, 4)
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x, ids):
            y = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
            return y.mean((2, 3)) @ self.emb(ids).t()

    eager, mine = Net().train(), Net().train()
    x, ids = torch.randn(2, 3, 6, 7), torch.tensor([1, 4, 4, 0, 10])
    want, got = eager(x, ids), torch.compile(mine, backend="fusion")(x, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    want.square().sum().backward()
    got.square().sum().backward()
    for (name, p), q in zip(mine.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(mine.bn.running_var, eager.bn.running_var)
    (report,) = backend.reports
    forward, backward = report.part("forward"), report.part("backward")
    assert "_native_batch_norm_legit" in _ops_of(forward), report.table()  # in place: pass reinplace
    assert "max_pool2d_with_indices" in _ops_of(forward), report.table()
    assert {"native_batch_norm_backward", "embedding_dense_backward"} <= _ops_of(backward), report.table()
    backend.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(mine.eval(), backend="fusion")(x, ids), mine(x, ids))
    assert not any("batch_norm" in op for op in _ops_of(backend.reports[0].part("inference")))


def test_reorder_brings_each_relu_mask_to_its_where_in_the_backward():
    """AOTAutograd's backward computes each ReLU's mask far from the where that reads it, with a scalar_tensor(0)
    per layer: the pass ``reorder`` moves them together (and shares one constant), so they fuse; off, they do not.
    With the default partitioner, which saves each ReLU's output and recomputes no mask (the min-cut partitioner
    saves the last ReLU's mask itself, leaving its where alone)."""
    torch.manual_seed(0)
    layers = [m for _ in range(3) for m in (nn.Linear(5, 5), nn.ReLU())]
    x = torch.randn(4, 5)

    def run(options):
        backend.reset()
        model = nn.Sequential(*layers)
        torch.compile(model, backend="fusion", options=options)(x).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        return backend.reports[0].part("backward"), grads

    on, grads_on = run({"min_cut": False})
    off, grads_off = run({"reorder": False, "min_cut": False})
    for a, b in zip(grads_on, grads_off, strict=True):
        torch.testing.assert_close(a, b)
    assert "le" not in _ops_of(on) and "where" not in _ops_of(on), on.library_calls
    assert on.library_calls.get("scalar_tensor", 0) <= 1  # one shared constant
    assert len(on.kernels) > len(off.kernels), (on.library_calls, off.library_calls)


def test_hoist_constants_shares_each_constant_once_at_the_top():
    def f(x):
        a = torch.ops.aten.scalar_tensor.default(0.0, dtype=torch.float32)
        y = torch.where(x > 0, x, a)
        b = torch.ops.aten.scalar_tensor.default(0.0, dtype=torch.float32)
        c = torch.ops.aten.scalar_tensor.default(2.0, dtype=torch.float32)
        return torch.where(y < 1, b, y) * c

    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(7)
    gm = make_fx(f, tracing_mode="fake")(x)
    graph_passes.hoist_constants(gm.graph)
    gm.graph.lint()
    gm.recompile()
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    consts = [n for n in nodes if n.target is aten.scalar_tensor.default]
    assert len(consts) == 2 and nodes[:2] == consts  # 0.0 once, 2.0 once, both first
    torch.testing.assert_close(gm(x), f(x))


def test_a_value_only_the_output_reads_joins_its_inputs_kernel():
    """A training forward saves LayerNorm's ``rsqrt(var + eps) / d`` for the backward (BERT's): only the output reads
    it, so ``reorder`` left it where AOTAutograd put it, after the next GEMM, one library call a LayerNorm.
    raise_returned moves it just after its input: the LayerNorm kernel stores it. Off (``reorder`` False) it is a
    call; the values are eager's either way."""

    def f(x, w):
        m = x.mean(-1, keepdim=True)
        r = torch.rsqrt(((x - m) ** 2).mean(-1, keepdim=True) + 1e-5)
        y = ((x - m) * r) @ w
        return y, r / 32

    x, w = torch.randn(6, 16), torch.randn(16, 8)

    def run(options):
        backend.reset()
        got = torch.compile(f, backend="fusion", options=options)(x, w)
        return backend.reports[0].parts[0].library_calls, got

    calls, got = run(None)
    off_calls, off = run({"reorder": False})
    assert "div" not in calls and off_calls.get("div", 0) == 1, (calls, off_calls)
    torch.testing.assert_close(got, f(x, w))
    torch.testing.assert_close(off, f(x, w))


def test_a_returned_chain_moves_up_whole():
    """A bias gradient's ``view`` and cast back to float32, read only by the output: raise_returned moves the chain,
    in order, to just after the sum (each op after the one it reads), so the cast can join the sum's kernel."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(g, w):
        s = g.sum(0)
        other = torch.relu(g @ w)
        return other, torch.ops.prims.convert_element_type.default(s.view(2, 3), torch.float32)

    g, w = torch.randn(5, 6, dtype=torch.bfloat16), torch.randn(6, 4, dtype=torch.bfloat16)
    gm = make_fx(f, tracing_mode="fake")(g, w)
    assert graph_passes.raise_returned(gm.graph) == 2
    gm.graph.lint()
    gm.recompile()
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    at = ops.index(aten.sum.dim_IntList)
    assert ops[at + 1 : at + 3] == [aten.view.default, torch.ops.prims.convert_element_type.default], ops
    torch.testing.assert_close(gm(g, w), f(g, w))


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
    monkeypatch.setattr(driver, "PASSES", [*driver.PASSES, entry])  # the pass list lives in the driver
    f = lambda x: torch.relu(x * 2.0) + 1.0  # noqa: E731
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.compile(f, backend="fusion")(x), f(x))
    assert seen == []  # opt-in: off unless asked for
    backend.reset()
    torch.testing.assert_close(torch.compile(f, backend="fusion", options={"count_relus": True})(x), f(x))
    assert seen == [1]
    assert [p[0] for p in backend.reports[0].parts[0].passes] == ["count relus"]
    assert backend.Options.parse({"count_relus": True}).count_relus


def test_the_driver_calls_the_lessons_functions_through_the_registry(monkeypatch):
    """fusion/compiler/driver.py runs what Phases 6, 8 and 9 registered (fusion/compiler/registry.py); a lesson not
    imported is one fallback naming the import that registers it, never an import of the lesson by name."""
    from fusion.compiler import registry

    assert registry.get("lower") is backend.lower and registry.get("fold_bn") is backend.fold_batch_norm
    assert backend.PASSES is driver.PASSES and backend.Options is driver.Options
    monkeypatch.delitem(registry._functions, "triton_expr")  # as if fusion.codegen were never imported
    f = lambda x: torch.relu(x * 2.0) + 1.0  # noqa: E731
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.compile(f, backend="fusion")(x), f(x))
    (report,) = backend.reports
    assert not report.kernels and [why for _, why in report.parts[0].fallbacks] == [
        "Phase 8's triton_expr is not registered: import fusion.codegen"
    ]


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
    count = epilogue.install_epilogues(gm, "grouped: slow", lambda *a: notes.append(a))
    assert count == fused, (gm.code, notes)
    targets = {n.target for n in gm.graph.nodes}
    epilogues = {cudnn.cudnn_conv_bias_relu, cudnn.cudnn_conv_bias_add_relu}
    assert bool(targets & epilogues) == bool(fused)
    if "groups=4" in gm.code or shapes[1] == (4, 1, 3, 3):
        assert any(n[2] == "skipped" and "grouped" in n[3] for n in notes)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the cuDNN epilogue needs CUDA")
def test_cuda_conv_bn_net_uses_the_epilogue():
    model = models.ConvBNNet(width=8).cuda().eval()
    (x,) = models.conv_inputs(batch=2, size=8)
    x = x.cuda()
    with torch.no_grad():
        torch.testing.assert_close(
            torch.compile(model, backend="fusion", options=FOLD)(x), model(x), rtol=1e-3, atol=1e-3
        )
    (report,) = backend.reports
    epilogue = [p for p in report.parts[0].passes if p[0] == "cudnn epilogue"]
    assert sum(p[2] == "fused" for p in epilogue) == 2, report.table()  # stem and conv1; conv2 is depthwise
    assert any(p[2] == "skipped" and "grouped" in p[3] for p in epilogue)


# ----------------------------------------------------------------------------------------------------------------------
# Issue 23: the launch path, no slow fallbacks, CUDA graphs


@pytest.fixture
def built(monkeypatch):
    """Every graph the partition stage builds (the generated wrapper a compiled call runs), in order."""
    from fusion.compiler import partition

    graphs = []
    original = partition.build_compiled_graph

    def spy(gm, plans):
        graphs.append(original(gm, plans))
        return graphs[-1]

    monkeypatch.setattr(partition, "build_compiled_graph", spy)
    return graphs


def test_compiled_graph_calls_launchers_checked_on_the_first_call_only(built):
    from fusion.kernels.triton_runtime import Launcher, ShapeMismatchError

    def f(x, y):
        h = torch.relu(x * y + 1.0)
        return h.sum(-1), torch.tanh(h) - y

    x, y = torch.randn(3, 5), torch.randn(5)
    g = torch.compile(f, backend="fusion", dynamic=False)
    for _ in range(2):
        torch.testing.assert_close(g(x, y), f(x, y))
    (gm,) = built
    assert not [n for n in gm.graph.nodes if n.op == "call_module"], gm.code
    launchers = [n.target for n in gm.graph.nodes if isinstance(n.target, Launcher)]
    assert len(launchers) == len(backend.reports[0].kernels) >= 1
    assert all(lch.checked and not lch.fallback for lch in launchers)
    assert launchers[0].__name__ in gm.code  # the wrapper names each kernel it launches
    with pytest.raises(ShapeMismatchError, match="generated for"):  # the per-call check of the module still holds
        launchers[0].owner(*[torch.zeros(7, 7) for _ in launchers[0].owner.plan.inputs])


def _fake_compiled_kernel(calls):
    class Compiled:  # what fn[grid](...) returns on a GPU: Triton's CompiledKernel, as far as the launcher reads it
        function, packed_metadata = "fn-handle", ("packed",)

        def run(self, *args):
            calls.append(args)

    return Compiled()


def test_direct_launcher_passes_what_tritons_compiled_launcher_takes():
    from triton import knobs
    from triton.runtime.jit import JITFunction

    from fusion.kernels.launchers import direct_launcher

    class Jit:
        arg_names = ["in_ptr0", "out_ptr0", "xnumel_unused", "XBLOCK"]
        run = JITFunction.run  # this Triton's: does it pass constexprs on to the compiled launcher?

    calls = []
    a, b = torch.zeros(2), torch.zeros(2)
    with pytest.raises(KeyError):  # a parameter we would not pass: no direct path
        direct_launcher(Jit(), _fake_compiled_kernel(calls), 3, 2, {"XBLOCK": 8}, torch.device("cuda", 0))
    Jit.arg_names = ["in_ptr0", "out_ptr0", "XBLOCK"]
    launch = direct_launcher(Jit(), _fake_compiled_kernel(calls), 3, 2, {"XBLOCK": 8}, torch.device("cuda", 0),
                             get_stream=lambda index: 1000 + index)  # fmt: skip
    launch(a, b)
    assert calls == [(3, 1, 1, 1000, "fn-handle", ("packed",), None, None, None, a, b, 8)]
    old, hook = knobs.runtime.launch_enter_hook, lambda *args: None
    if hasattr(old, "add"):  # Triton 3.9: a chain of hooks
        old.add(hook)
    else:
        knobs.runtime.launch_enter_hook = hook
    try:
        with pytest.raises(RuntimeError, match="hook"):  # a profiler's hook: the JIT call gives it its metadata
            launch(a, b)
    finally:
        if hasattr(old, "remove"):
            old.remove(hook)
        knobs.runtime.launch_enter_hook = old


@pytest.mark.parametrize("which", ["launch_enter_hook", "launch_exit_hook"])
def test_a_direct_launch_gives_way_to_every_launch_hook_set_after_it_was_made(which):
    """The launch compares Triton's hooks with what they were when it was made, without a call: a hook added to the
    chain, or a function assigned in its place, must still reach the JIT (which calls it); none set, it launches."""
    from triton import knobs
    from triton.runtime.jit import JITFunction

    from fusion.kernels.launchers import direct_launcher

    class Jit:
        arg_names = ["in_ptr0", "out_ptr0", "XBLOCK"]
        run = JITFunction.run

    calls, a = [], torch.zeros(2)
    launch = direct_launcher(Jit(), _fake_compiled_kernel(calls), 3, 2, {"XBLOCK": 8}, torch.device("cuda", 0),
                             get_stream=lambda index: 7)  # fmt: skip
    old, hook = getattr(knobs.runtime, which), lambda *args: None
    try:
        launch(a, a)
        if hasattr(old, "add"):  # Triton 3.6 and later: a chain, changed in place
            old.add(hook)
            with pytest.raises(RuntimeError, match="hook"):
                launch(a, a)
            old.remove(hook)
            launch(a, a)
        setattr(knobs.runtime, which, hook)  # a function in the chain's place
        with pytest.raises(RuntimeError, match="hook"):
            launch(a, a)
        setattr(knobs.runtime, which, None)  # no hook at all (older Tritons)
        launch(a, a)
    finally:
        if hasattr(old, "remove"):
            old.remove(hook)
        setattr(knobs.runtime, which, old)
    assert len(calls) == (3 if hasattr(old, "add") else 2)


def test_a_failing_direct_launch_falls_back_to_the_jit_once_with_the_right_answer(built):
    def f(x):
        return torch.sigmoid(x * 3.0) + x

    x = torch.randn(4, 6)
    g = torch.compile(f, backend="fusion", dynamic=False)
    torch.testing.assert_close(g(x), f(x))
    (launcher,) = [n.target for n in built[0].graph.nodes if type(n.target).__name__ == "Launcher"]
    tries = []

    def broken(*tensors):
        tries.append(len(tensors))
        raise RuntimeError("launch failed")

    launcher.direct, launcher._aligned = broken, [0]
    unaligned = torch.randn(25)[1:].view(4, 6)  # 4 bytes past an aligned allocation: another Triton specialisation
    torch.testing.assert_close(launcher(unaligned)[0], f(unaligned))
    assert tries == []  # the JIT took that call
    for _ in range(2):
        torch.testing.assert_close(g(x), f(x))
    assert tries == [2] and launcher.direct is None and "launch failed" in launcher.fallback


def _prims_calls(gm) -> list[str]:
    return [
        n.name for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "prims"
    ]


@pytest.mark.parametrize("codegen", [True, False])
def test_no_prims_call_runs_outside_generated_kernels(built, codegen):
    def f(x, w):  # a lone dtype cast before a matmul (prims.convert_element_type), an arange (prims.iota)
        h = x.to(torch.float64) @ w
        return h + torch.arange(h.shape[-1], dtype=torch.float64), x.to(torch.float16)

    x, w = torch.randn(3, 4), torch.randn(4, 5, dtype=torch.float64)
    opts = {"codegen": codegen, "sibling_casts": False}  # (on, the float16 cast's kernel would take the lone cast)
    g = torch.compile(f, backend="fusion", dynamic=False, options=opts)
    torch.testing.assert_close(g(x, w), f(x, w))
    (report,) = backend.reports
    assert any(p[0] == "prims to aten" for p in report.parts[0].passes), report.table()
    assert not any("prims" in op for op in report.parts[0].library_calls), report.table()
    if codegen:
        (gm,) = built
        assert not _prims_calls(gm), gm.code


@pytest.mark.parametrize("channels_last", [False, True])
def test_max_pool_runs_as_one_aten_call_in_inference(built, channels_last):
    class Stem(nn.Module):
        def forward(self, x):
            return F.max_pool2d(torch.relu(x * 2.0), 3, 2, 1) + 1.0

    x = torch.randn(2, 3, 9, 11)
    x[0, 1, 4, 4], x[1, 2, 0, 0], x[1, 0, 8, 10] = float("nan"), float("inf"), float("-inf")  # NaN propagates
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    with torch.no_grad():
        got, want = torch.compile(Stem(), backend="fusion")(x), Stem()(x)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert got.stride() == want.stride()
    (gm,) = built
    assert not _prims_calls(gm), gm.code  # not Inductor's low-memory prim run as a Python reference
    pools = [n for n in gm.graph.nodes if "max_pool" in getattr(n.target, "__name__", "")]
    assert len(pools) == 1, gm.code
    # aten's CPU max-pool is 5-14x slower on channels-first images: such an image is pooled in channels-last
    assert pools[0].target.__name__.endswith("_nhwc") == (not channels_last), gm.code


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 3), c=st.integers(2, 9), h=st.integers(1, 13), w=st.integers(1, 13), k=st.integers(1, 4),
    stride=st.integers(1, 3), dilation=st.integers(1, 2), ceil=st.booleans(), special=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
)  # fmt: skip
def test_a_channels_first_max_pool_through_channels_last_gives_aten_values_and_layout(
    n, c, h, w, k, stride, dilation, ceil, special, dtype
):
    """The CPU route of pass ``max_pool_as_aten`` (a channels-first image pooled on its channels-last copy): aten's
    values and the channels-first layout, for any window, stride, padding, dilation and ceil mode aten takes."""
    from fusion.compiler.wrapper_passes import _max_pool_values

    pad = min(k // 2, (k - 1) * dilation // 2)
    if (k - 1) * dilation + 1 > h + 2 * pad or (k - 1) * dilation + 1 > w + 2 * pad:
        return  # aten refuses a window larger than the padded image
    x = torch.randn(n, c, h, w, dtype=dtype)
    if special:  # NaN propagates out of every window holding one, in both kernels; +-inf are values
        flat = x.view(-1)
        flat[torch.randperm(flat.numel())[:3]] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)[
            : min(3, flat.numel())
        ]
    op = torch.ops.aten.max_pool2d_with_indices.default
    args = ([k, k], [stride, stride], [pad, pad], [dilation, dilation], ceil)
    want = op(x, *args)[0]
    got, offsets = _max_pool_values(op, channels_last=True)(x, *args)
    assert offsets is None and got.stride() == want.stride()
    torch.testing.assert_close(got, want, equal_nan=True, atol=0, rtol=0)


def test_max_pool_keeps_its_offsets_for_training():
    class Stem(nn.Module):
        def forward(self, x):
            return F.max_pool2d(x * 2.0, 2) * 3.0

    x = torch.randn(2, 3, 6, 7, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    torch.compile(Stem(), backend="fusion")(x).sum().backward()
    Stem()(x2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_attention_stays_one_library_call(built):
    class Attention(nn.Module):
        def forward(self, q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2.0 + q

    q, mask = torch.randn(2, 3, 5, 4), torch.randn(2, 1, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(
            torch.compile(Attention(), backend="fusion")(q, q, q, mask), Attention()(q, q, q, mask)
        )
    calls = backend.reports[0].parts[0].library_calls
    assert sum(c for op, c in calls.items() if "scaled_dot_product" in op) == 1, calls
    assert not {"bmm", "_safe_softmax", "_softmax", "mm"} & set(calls), calls


@pytest.mark.parametrize("grads", [False, True])
def test_a_boolean_attention_mask_becomes_the_additive_mask_fused_kernels_take(monkeypatch, grads):
    rewritten = spy_mask_rewrite(monkeypatch)  # the rewrite runs on CUDA; checked here on a CPU

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    mask = (torch.rand(2, 1, 5, 1, generator=g) > 0.3).expand(2, 1, 5, 6)[..., :5]  # broadcast, like HF's
    mask = mask.clone()
    mask[0, 0, 2] = False  # one query row attends to nothing: the math path gives 0 there, as must we
    mask = mask[:, :, :, :1].expand(2, 1, 5, 5) & mask  # a broadcast last dim, as BERT's compile-time mask
    leaves = [t.clone().requires_grad_(grads) for t in (q, k, v)]
    want = MaskedAttention()(*leaves, mask)
    got_leaves = [t.clone().requires_grad_(grads) for t in (q, k, v)]
    got = torch.compile(MaskedAttention(), backend="fusion")(*got_leaves, mask)
    torch.testing.assert_close(got, want)
    assert torch.equal(got[0, :, 2], torch.zeros_like(got[0, :, 2]))
    if grads:
        want.sum().backward()
        got.sum().backward()
        for a, b in zip(got_leaves, leaves, strict=True):
            torch.testing.assert_close(a.grad, b.grad)
    calls = _calls()
    assert not {"bmm", "_safe_softmax", "_softmax"} & set(calls), calls
    assert len(rewritten) == 1, rewritten


def test_layers_sharing_a_mask_convert_and_reduce_it_once(monkeypatch):
    """Every layer reads the same boolean mask: one additive mask and one any() for all of them (a GPT-2 profile
    showed 12 any() of one mask per call), a select per layer; the answer still eager's, rows masked everywhere 0."""
    from fusion.compiler import attention

    monkeypatch.setattr(attention, "DEVICES", ("cpu", "cuda"))

    class TwoLayers(nn.Module):
        def forward(self, q, k, v, mask):
            h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return F.scaled_dot_product_attention(h * 0.5, k, v, attn_mask=mask) + h

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5, generator=g) > 0.4
    mask[1, 0, 3] = False
    backend.reset()
    got = torch.compile(TwoLayers(), backend="fusion")(q, k, v, mask)
    torch.testing.assert_close(got, TwoLayers()(q, k, v, mask))
    calls = _calls()
    assert calls["any"] <= 1 and calls["where"] <= 1 + 2, calls  # one conversion + at most a select per layer


class BuiltMask(nn.Module):
    """Attention under a boolean mask built from the sequence length alone (as HuggingFace's decoders build their
    causal mask): ``strict`` masks the diagonal too, so the first query attends to nothing; ``filled`` clears a row
    of an all-True mask in place after making it."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, q, k, v):
        pos = torch.arange(q.shape[-2], device=q.device)
        if self.kind == "filled":
            mask = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool, device=q.device)
            mask[2] = False
        else:
            mask = pos[None, :] < pos[:, None] if self.kind == "strict" else pos[None, :] <= pos[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2.0


@pytest.mark.parametrize("kind", ["causal", "strict", "filled"])
def test_a_built_mask_where_every_query_attends_needs_no_select(monkeypatch, kind):
    """A causal mask computed from no input: every query attends to a key, so the attention rewrite adds no select
    after attention (in a training graph the select and its reduced mask were a launch each in the forward and the
    backward a layer). A constant mask with a query masked everywhere (``strict``), or one written in place after it
    is made (``filled``, not evaluated at compile time), keeps the select: 0 there, as the math path gives. Values
    and gradients equal eager's."""
    rewritten = spy_mask_rewrite(monkeypatch)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    leaves, mine = [t.clone().requires_grad_() for t in (q, k, v)], [t.clone().requires_grad_() for t in (q, k, v)]
    want = BuiltMask(kind)(*leaves)
    backend.reset()
    got = torch.compile(BuiltMask(kind), backend="fusion")(*mine)
    torch.testing.assert_close(got, want)
    (want * want).sum().backward()
    (got * got).sum().backward()
    for a, b in zip(mine, leaves, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    assert len(rewritten) == 1, rewritten
    selects = sum(p.library_calls["where"] + p.library_calls["any"] for r in backend.reports for p in r.parts)
    selects += sum("where" in k.source for r in backend.reports for p in r.parts for k in p.kernels)
    assert (selects == 0) == (kind == "causal"), [p.library_calls for r in backend.reports for p in r.parts]
    if kind != "causal":
        assert torch.equal(got[:, :, 0 if kind == "strict" else 2], torch.zeros_like(got[:, :, 0]))


def test_tiny_bert_has_one_attention_call_no_prims_no_copies(built):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                     vocab_size=100, max_position_embeddings=64)  # fmt: skip
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0  # padding: the attention mask is a real input
    with torch.no_grad():
        got = torch.compile(model, backend="fusion")(ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(got, model(ids, attention_mask=mask).last_hidden_state)
    calls = _calls()
    assert sum(c for op, c in calls.items() if "scaled_dot_product" in op) == 1, calls
    assert not {"bmm", "_safe_softmax", "clone", "copy_", "copy"} & set(calls), calls
    assert built and not any(_prims_calls(gm) for gm in built)


def test_cudagraphs_option_is_a_noop_on_cpu_with_a_note():
    if torch.cuda.is_available():
        pytest.skip("the CPU behaviour")
    f = torch.compile(lambda x: torch.relu(x * 2.0) + 1.0, backend="fusion", options={"cudagraphs": True})
    x = torch.randn(3, 4)
    torch.testing.assert_close(f(x), torch.relu(x * 2.0) + 1.0)
    notes = [p for p in backend.reports[0].parts[0].passes if p[0] == "cudagraphs"]
    assert notes and notes[0][2] == "skipped" and "CPU" in notes[0][3], backend.reports[0].table()
    backend.reset()
    w = torch.randn(4, requires_grad=True)
    g = torch.compile(lambda x: torch.relu(x * w).sum(), backend="fusion", options={"cudagraphs": True})
    g(x).backward()  # a training graph: forward and backward run as they are, with the reason
    torch.testing.assert_close(w.grad, (x * (x * w > 0)).sum(0))
    notes = [(part.kind, p) for part in backend.reports[0].parts for p in part.passes if p[0] == "cudagraphs"]
    assert {k for k, _ in notes} == {"forward", "backward"} and all("inference" in p[3] for _, p in notes), notes


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")


def _graph_runner():
    from fusion.compiler.cudagraphs import CudaGraphRunner

    runners = [p for r in backend.reports for part in r.parts for p in part.passes if p[0] == "cudagraphs"]
    assert runners and runners[0][2].startswith("recorded"), backend.reports[0].table()
    return CudaGraphRunner


@cuda
def test_cudagraphs_replay_follows_inputs_and_parameters():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16)).cuda().eval()
    g = torch.compile(model, backend="fusion", options={"cudagraphs": True})
    with torch.no_grad():
        x1, x2 = torch.randn(4, 8, device="cuda"), torch.randn(4, 8, device="cuda")
        a = g(x1)
        torch.testing.assert_close(a, model(x1))
        b = g(x2)  # a new input, at another address: copied into the graph's buffer
        torch.testing.assert_close(b, model(x2))
        torch.testing.assert_close(a, model(x1))  # the first output was not overwritten by the replay
        assert a.data_ptr() != b.data_ptr()
        x2.mul_(3.0)  # same address, new contents
        torch.testing.assert_close(g(x2), model(x2))
        model[0].weight.mul_(0.5)  # an in-place parameter update: the replay reads it
        torch.testing.assert_close(g(x1), model(x1))
        model[2].weight = nn.Parameter(torch.randn(16, device="cuda"))  # replaced: a new address
        torch.testing.assert_close(g(x1), model(x1))
    _graph_runner()


@cuda
def test_cudagraphs_refreshes_folded_batch_norm_and_copies_back_mutated_inputs():
    net = models.ConvBNNet(width=8).cuda().eval()
    (x,) = models.conv_inputs(batch=2, size=8)
    x = x.cuda()
    g = torch.compile(net, backend="fusion", options={"cudagraphs": True, **FOLD})
    with torch.no_grad():
        torch.testing.assert_close(g(x), net(x), rtol=1e-3, atol=1e-3)
        net.bn1.running_var.mul_(4.0)  # a refold: new folded weights at a new address
        torch.testing.assert_close(g(x), net(x), rtol=1e-3, atol=1e-3)
        assert backend.reports[0].parts[0].folded

    def bump(t, y):
        t.add_(1.0)
        return t * y

    backend.reset()
    h = torch.compile(bump, backend="fusion", options={"cudagraphs": True})
    t, y = torch.zeros(4, device="cuda"), torch.ones(4, device="cuda")
    with torch.no_grad():
        h(t, y)
        out = h(t, y)
    torch.testing.assert_close(t, torch.full_like(t, 2.0))  # each call bumped the caller's tensor once
    torch.testing.assert_close(out, torch.full_like(t, 2.0))


@cuda
def test_cuda_attention_is_one_fused_kernel_call():
    class Attention(nn.Module):
        def forward(self, q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q = torch.randn(2, 4, 64, 32, device="cuda", dtype=torch.bfloat16)
    mask = torch.zeros(2, 1, 64, 64, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(Attention(), backend="fusion")(q, q, q, mask),
                                   Attention()(q, q, q, mask), rtol=2e-2, atol=2e-2)  # fmt: skip
    calls = backend.reports[0].parts[0].library_calls
    fused = {"_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention"}  # fmt: skip
    assert sum(c for op, c in calls.items() if op in fused) == 1, calls
    assert not {"bmm", "_safe_softmax", "_to_copy"} & set(calls), calls


@cuda
def test_cuda_launch_cost_is_measured():
    from fusion.codegen import compile_graph
    from fusion.kernels.timing import launch_us

    def f(x):
        return torch.relu(x * 2.0) + 1.0, torch.softmax(x, -1)

    x = torch.randn(64, 256, device="cuda")
    compiled = compile_graph(torch.fx.experimental.proxy_tensor.make_fx(f)(x), [x])
    cost = launch_us(compiled.launchers, lambda: compiled(x), calls=50)
    print(f"per launch: direct {cost['direct']:.1f} us, Triton's JIT {cost['jit']:.1f} us")
    assert cost["kernels"] >= 1 and cost["fallbacks"] == 0  # no timing assert: the number is printed


@cuda
def test_cuda_kernels_launch_through_torchs_static_launcher():
    from fusion.codegen import compile_graph

    def f(x, y):  # a pointwise and a reduction kernel, bf16 and float32, a broadcast operand
        h = torch.relu(x * y + 1.0)
        return h.to(torch.bfloat16), torch.softmax(h, -1)

    x, y = torch.randn(33, 130, device="cuda"), torch.randn(130, device="cuda")
    compiled = compile_graph(torch.fx.experimental.proxy_tensor.make_fx(f)(x, y), [x, y])
    for _ in range(3):  # the first call compiles; later calls take the direct path, on new values each time
        x, y = torch.randn_like(x), torch.randn_like(y)
        torch.testing.assert_close(compiled(x, y), f(x, y))
    kinds = {lch.kind or lch.fallback for lch in compiled.launchers}
    static_refused = {lch.static_refused for lch in compiled.launchers}
    assert kinds <= {"static", "triton"} and all(lch.launches >= 2 for lch in compiled.launchers), kinds
    raw = {getattr(lch.direct, "raw", None) for lch in compiled.launchers}
    print(f"direct launch paths: {kinds}; static launcher refused: {static_refused}; raw C++ launch: {raw}")
    if torch.cuda.device_count() == 1:  # outputs from the caching allocator directly, as Inductor's output code
        assert all(lch.alloc is torch._C._dynamo.guards._empty_strided_cuda for lch in compiled.launchers)
        out = compiled(x, y)
        assert out[0].device == x.device and out[0].dtype == torch.bfloat16 and out[0].stride() == (130, 1)


def test_outputs_are_allocated_on_the_launchers_device():
    """empty_strided_on: the fast CUDA allocator only where one device makes the current device the right one; on
    the CPU (and with several GPUs) torch.empty_strided on the launcher's device, size, strides and dtype."""
    from fusion.kernels.triton_runtime import empty_strided_on

    t = empty_strided_on(torch.device("cpu"))((2, 3, 4), (1, 2, 6), torch.float16)
    assert t.device.type == "cpu" and t.shape == (2, 3, 4) and t.stride() == (1, 2, 6) and t.dtype == torch.float16


class _FakeStaticKernel:
    """The shape of torch's StaticallyLaunchedCudaKernel.run (torch 2.11): what _raw_launch must replay exactly."""

    calls: list = []

    class C_impl:  # noqa: N801 - torch's attribute name
        @staticmethod
        def _launch_kernel(*args):
            _FakeStaticKernel.calls.append(args)

    function, num_warps, shared, arg_tys = "fn", 4, 128, "OO"
    _has_tensordesc, has_global_scratch, has_profile_scratch, global_scratch_size = False, True, False, 0

    def run(self, grid_x, grid_y, grid_z, stream, *args):
        if self._has_tensordesc:
            raise NotImplementedError
        arg_tys = self.arg_tys
        if self.has_global_scratch:
            global_scratch = None
            if self.global_scratch_size:
                raise NotImplementedError
            arg_tys, args = arg_tys + "O", (*args, global_scratch)
        if self.has_profile_scratch:
            arg_tys, args = arg_tys + "O", (*args, None)
        self.C_impl._launch_kernel(self.function, grid_x, grid_y, grid_z, self.num_warps, self.shared, arg_tys, args,
                                   stream)  # fmt: skip


def _is_rocm() -> bool:
    return False


class _FakeStaticKernel211(_FakeStaticKernel):
    """torch 2.11's actual run(): a comment that names has_*_scratch, a loop variable has_scratch, an is_rocm() branch."""

    def run(self, grid_x, grid_y, grid_z, stream, *args):
        arg_tys = self.arg_tys
        if _is_rocm():
            # the HIP ABI always has both has_*_scratch parameters
            arg_tys, args = arg_tys + "OO", (*args, None, None)
        else:
            for has_scratch in [self.has_global_scratch, self.has_profile_scratch]:
                if has_scratch:
                    arg_tys, args = arg_tys + "O", (*args, None)
        self.C_impl._launch_kernel(self.function, grid_x, grid_y, grid_z, self.num_warps, self.shared, arg_tys, args,
                                   stream)  # fmt: skip


class _FakeStaticKernelNewFlag(_FakeStaticKernel):
    def run(self, grid_x, grid_y, grid_z, stream, *args):
        if self.has_cluster_dims:  # a flag _raw_launch does not know: it must keep run()
            raise NotImplementedError
        self.C_impl._launch_kernel(self.function, grid_x, grid_y, grid_z, self.num_warps, self.shared, "OO", args,
                                   stream)  # fmt: skip


def test_the_raw_launch_reads_run_code_not_its_comments():
    from fusion.kernels import launchers as rt

    kernel, a, b = _FakeStaticKernel211(), torch.zeros(1), torch.ones(1)
    _FakeStaticKernel.calls = []
    raw = rt._raw_launch(kernel, 7)
    assert raw is not None  # has_scratch, is_rocm and the comment's has_ are known or ignored
    raw((a, b), 99)
    kernel.run(7, 1, 1, 99, a, b)
    first, second = _FakeStaticKernel.calls
    assert first[:7] == second[:7] and first[8] == second[8] and len(first[7]) == len(second[7]) == 3
    assert rt._raw_launch(_FakeStaticKernelNewFlag(), 7) is None


def test_the_raw_launch_passes_what_the_static_launchers_run_passes():
    from fusion.kernels import launchers

    kernel, a, b = _FakeStaticKernel(), torch.zeros(1), torch.ones(1)
    _FakeStaticKernel.calls = []
    raw = launchers._raw_launch(kernel, 7)
    assert raw is not None
    raw((a, b), 99)
    kernel.run(7, 1, 1, 99, a, b)
    first, second = _FakeStaticKernel.calls
    assert (
        first[:7] == second[:7]
        and first[8] == second[8]
        and all(x is y for x, y in zip(first[7], second[7], strict=True))
    )
    kernel.has_profile_scratch = True  # one more trailing argument, in both
    _FakeStaticKernel.calls = []
    launchers._raw_launch(kernel, 7)((a, b), 99)
    kernel.run(7, 1, 1, 99, a, b)
    assert _FakeStaticKernel.calls[0][6] == _FakeStaticKernel.calls[1][6] == "OOOO"
    kernel.global_scratch_size = 64  # scratch memory of a size: run() allocates it per call, so no raw path
    assert launchers._raw_launch(kernel, 7) is None

    class Unknown(_FakeStaticKernel):
        def run(self, grid_x, grid_y, grid_z, stream, *args):  # a flag _raw_launch does not replay
            if self.has_something_new:
                args = (*args, 0)
            self.C_impl._launch_kernel(self.function, grid_x, grid_y, grid_z, 4, 0, "O", args, stream)

    assert launchers._raw_launch(Unknown(), 7) is None


def test_precompile_is_skipped_off_cuda():
    from fusion.codegen import compile_graph

    def f(x):
        return torch.relu(x * 2.0) + 1.0, torch.softmax(x, -1)

    x = torch.randn(4, 8)
    compiled = compile_graph(torch.fx.experimental.proxy_tensor.make_fx(f)(x), [x])
    assert "skipped" in compiled.precompiled  # the interpreter compiles nothing: no worker pool is started


def test_compile_workers_start_while_a_cuda_graph_is_traced(monkeypatch):
    """The first CUDA graph a process lowers starts the compile pool at once, a job per worker (each spawns and
    imports Triton while AOTAutograd traces); a CPU graph starts nothing, and a second graph nothing more."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fusion.kernels import precompile as PC

    submitted = []

    class Pool:
        def submit(self, fn, *args):
            submitted.append(fn)

    def fake_pool():
        PC._POOL = Pool()
        return PC._POOL

    class Broken:  # a pool whose worker died: never handed out again
        _broken = "A child process terminated abruptly"

    monkeypatch.setattr(PC, "_POOL", Broken())
    fresh = PC._pool()
    assert fresh is PC._POOL and not isinstance(fresh, Broken)
    fresh.shutdown()
    monkeypatch.setattr(PC, "_POOL", None)
    monkeypatch.setattr(PC, "_pool", fake_pool)
    monkeypatch.setenv("FUSION_COMPILE_WORKERS", "3")
    assert not PC.warm_pool([torch.ones(2)]) and PC._POOL is None  # a CPU graph: the interpreter compiles nothing
    with FakeTensorMode():
        on_gpu = torch.empty(2, device="cuda")
    assert PC.warm_pool([torch.ones(2), on_gpu]) and submitted == [PC._import_in_worker] * 3
    assert not PC.warm_pool([on_gpu]) and len(submitted) == 3  # once per process
    assert PC._import_in_worker() == ""  # what a worker runs: the imports a compile needs, here too

    seen = []
    monkeypatch.setattr(aot, "warm_pool", lambda inputs: seen.append(list(inputs)))
    torch._dynamo.reset()
    x = torch.randn(5)
    torch.testing.assert_close(torch.compile(lambda t: torch.relu(t) + 1, backend="fusion")(x), torch.relu(x) + 1)
    assert seen and any(t is x for t in seen[0])  # the backend asks for the pool with the graph's inputs, first thing


def test_compile_workers_never_rerun_the_learners_script(tmp_path):
    """A spawned worker re-runs the parent's main module before its first job: a script without an
    ``if __name__ == "__main__":`` guard would run again (model, training loop, prints) in every compile worker, and
    the workers die trying to start their own pool. Our workers are spawned with the main module hidden."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "import os\n"
        "print('SCRIPT BODY', flush=True)\n"
        "os.environ['FUSION_COMPILE_WORKERS'] = '2'\n"
        "from fusion.kernels import precompile as PC\n"
        "print('RESULTS', [PC._submit(PC._import_in_worker).result() for _ in range(2)], flush=True)\n"
        f"print('FILE KEPT', __file__ == {str(script)!r}, __spec__ is None, flush=True)\n"
    )
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("SCRIPT BODY") == 1, out.stdout
    assert "RESULTS ['', '']" in out.stdout and "FILE KEPT True True" in out.stdout, out.stdout


@cuda
def test_cuda_kernels_are_compiled_in_parallel_before_the_first_call(monkeypatch):
    from fusion.codegen import compile_graph

    monkeypatch.setenv("FUSION_COMPILE_WORKERS", "2")

    def f(x, y):  # three kernels: two pointwise, one reduction; a constant no other test uses (a fresh source)
        return torch.relu(x * y + 0.123456), torch.softmax(x * 0.654321, -1), torch.sigmoid(y - 0.111)

    x, y = torch.randn(33, 130, device="cuda"), torch.randn(130, device="cuda")
    compiled = compile_graph(torch.fx.experimental.proxy_tensor.make_fx(f)(x, y), [x, y])
    print(compiled.precompiled)
    assert compiled.precompiled.get("kernels", 0) >= 2 and not compiled.precompiled["failed"], compiled.precompiled
    torch.testing.assert_close(compiled(x, y), f(x, y))


class _ReplayByRunning:
    """torch.cuda as CudaGraphRunner uses it, on a CPU: "recording" runs the function, a replay runs it again on
    the recorded input tensors and writes the results into the recorded outputs (a CUDA graph's address rules)."""

    device_type = "cpu"
    runner = None

    class Stream:
        def wait_stream(self, other):
            pass

    @staticmethod
    def current_stream():
        return _ReplayByRunning.Stream()

    @staticmethod
    @contextlib.contextmanager
    def stream(s):
        yield

    @staticmethod
    @contextlib.contextmanager
    def graph(g):
        yield

    class CUDAGraph:
        def replay(self):
            r = _ReplayByRunning.runner
            for out, new in zip(r.outputs, r.run(*r.inputs), strict=True):
                out.copy_(new)


def test_cuda_graph_runner_address_rules_on_a_stand_in():
    from fusion.compiler.cudagraphs import CudaGraphRunner

    def run(x, w, t):  # w: a parameter (read in place); t: an input the graph writes (functionalized: a copy_)
        t.copy_(t + 1.0)
        return (x @ w + 1.0,)

    r = _ReplayByRunning.runner = CudaGraphRunner(run, static={1}, mutated=[2], cuda=_ReplayByRunning)
    x1, x2, w, t = torch.randn(2, 3), torch.randn(2, 3), torch.randn(3, 4), torch.zeros(2)
    (a,) = r(x1, w, t)
    torch.testing.assert_close(a, x1 @ w + 1.0)
    (b,) = r(x2, w, t)  # a new input: copied into the graph's buffer
    torch.testing.assert_close(b, x2 @ w + 1.0)
    torch.testing.assert_close(a, x1 @ w + 1.0)  # handed-out outputs are never the buffers a replay overwrites
    x2.mul_(3.0)  # same tensor, new contents
    torch.testing.assert_close(r(x2, w, t)[0], x2 @ w + 1.0)
    w.mul_(0.5)  # a parameter updated in place: the replay reads it at its address
    torch.testing.assert_close(r(x1, w, t)[0], x1 @ w + 1.0)
    assert r.recordings == 1
    w2 = torch.randn(3, 4)  # a parameter replaced: a new address, recorded again
    torch.testing.assert_close(r(x1, w2, t)[0], x1 @ w2 + 1.0)
    assert r.recordings == 2 and r.replays == 5 and not r.error
    torch.testing.assert_close(t, torch.full((2,), 5.0))  # five calls, each wrote the caller's tensor once


def test_cuda_graphs_refuse_an_output_aliasing_an_input():
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion.compiler.cudagraphs import _outputs_aliasing_inputs

    gm = make_fx(lambda x, y: (x[1:].t(), x * 2.0, y))(torch.randn(3, 2), torch.randn(2))
    assert len(_outputs_aliasing_inputs(gm)) == 2, gm.code  # the view of x, and y itself


def test_batch_norm_is_not_folded_by_default_so_a_write_through_data_is_seen():
    """The fold bakes values in; a write through ``p.data`` moves no version counter, so only the opt-in
    ``options={"fold_bn": True}`` folds (the promise). The default keeps BatchNorm in the graph: always right."""
    model = models.ConvBNNet(width=4).eval()
    (x,) = models.conv_inputs(batch=2, size=6)
    with torch.no_grad():
        compiled = torch.compile(model, backend="fusion")
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        assert not any(folded(r) for r in backend.reports)
        model.bn1.running_var.data.mul_(4.0)
        model.conv1.weight.data.mul_(-2.0)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------------
# Library calls through torch's Python bindings (fusion/compiler/bindings.py)


def _binding_samples(device: str) -> dict:
    """One call per entry of BINDINGS: (args, kwargs), odd sizes, a non-contiguous operand where the op takes one."""
    g = torch.Generator().manual_seed(0)

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    aten = torch.ops.aten
    x4, q = r(2, 3, 7, 5), r(2, 3, 9, 8, dtype=torch.float16 if device == "cuda" else torch.float32)
    mean, var, w3 = r(3), r(3).abs() + 0.5, r(3)
    sdpa = (q, q * 0.5, q.flip(-1))
    return {
        aten.convolution.default: ((x4, r(4, 3, 3, 3), r(4), [1, 2], [1, 0], [1, 1], False, [0, 0], 1), {}),
        aten.mm.default: ((r(5, 3), r(7, 3).t()), {}),
        aten.addmm.default: ((r(7), r(5, 3), r(3, 7)), {"beta": 0.5, "alpha": 2.0}),
        aten.bmm.default: ((r(2, 5, 3), r(2, 3, 4)), {}),
        aten.baddbmm.default: ((r(2, 5, 4), r(2, 5, 3), r(2, 3, 4)), {"alpha": 0.5}),
        aten.cat.default: (([r(2, 3), r(2, 1)], 1), {}),
        aten.clone.default: ((x4.transpose(1, 3),), {"memory_format": torch.contiguous_format}),
        aten.embedding.default: ((r(10, 4), torch.tensor([[1, 9], [0, 0]], device=device)), {}),
        aten.where.self: ((r(3, 4) > 0, r(3, 4), r(4)), {}),
        aten.cumsum.default: ((r(3, 5), 1), {"dtype": torch.float64}),
        aten.mean.dim: ((x4, [-1, -2], True), {}),
        aten.sum.dim_IntList: ((x4, [1]), {}),
        aten.amax.default: ((x4, [0, 2]), {}),
        aten.constant_pad_nd.default: ((x4, [1, 2, 0, 1], 0.5), {}),
        aten._adaptive_avg_pool2d.default: ((x4, [3, 2]), {}),
        aten._native_batch_norm_legit_no_training.default: ((x4, w3, r(3), mean, var, 0.1, 1e-5), {}),
        aten.native_batch_norm.default: ((x4, w3, r(3), mean.clone(), var.clone(), False, 0.1, 1e-5), {}),
        aten.cudnn_batch_norm.default: ((x4, w3, r(3), mean.clone(), var.clone(), False, 0.1, 1e-5), {}),
        aten._scaled_dot_product_flash_attention_for_cpu.default: (sdpa, {"scale": 0.3}),
        aten._native_batch_norm_legit.default: ((x4, w3, r(3), mean.clone(), var.clone(), True, 0.1, 1e-5), {}),
        aten.relu.default: ((x4.transpose(1, 2),), {}),
    }


CUDA_ONLY = ("cudnn_batch_norm",)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU"))])  # fmt: skip
def test_each_python_binding_computes_what_its_overload_computes(device):
    from fusion.compiler.bindings import BINDINGS

    samples = _binding_samples(device)
    assert set(BINDINGS) <= set(samples), f"add a sample for {set(BINDINGS) - set(samples)}"
    for op, binding in BINDINGS.items():
        if device == "cpu" and any(k in str(op) for k in CUDA_ONLY) or device == "cuda" and "for_cpu" in str(op):
            continue
        args, kwargs = samples[op]
        mine = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # what an op writes, written alike
        want, got = op(*args, **kwargs), binding(*mine, **kwargs)
        torch.testing.assert_close(got, want, msg=lambda m, op=op: f"{op}: {m}")
        torch.testing.assert_close(mine, list(args), msg=lambda m, op=op: f"{op} wrote its inputs otherwise: {m}")


def test_tensor_methods_stand_in_only_where_they_are_the_same_op():
    """_to_copy to another dtype is Tensor.to (a copy, with the input's layout); to the same dtype it stays the
    overload (.to would return its input itself: an alias where the graph expects a new tensor). add_ without alpha
    is Tensor.add_; with alpha it stays the overload."""
    from fusion.compiler.bindings import python_bindings

    aten = torch.ops.aten
    x, y = torch.randn(4, 3).t(), torch.randn(3)  # a transposed x: the copy keeps its layout
    g = torch.fx.Graph()
    px, py = g.placeholder("x"), g.placeholder("y")
    px.meta["val"], py.meta["val"] = x, y
    other = g.call_function(aten._to_copy.default, (px,), {"dtype": torch.float64})
    same = g.call_function(aten._to_copy.default, (px,), {"dtype": torch.float32})
    g.call_function(aten.add_.Tensor, (py, 1.5))
    g.call_function(aten.add_.Tensor, (py, 2.0), {"alpha": 3})
    g.output((other, same))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    want_y, got_y = y.clone(), y.clone()
    want = gm(x, want_y)
    changed = python_bindings(gm)
    assert [c.split(": ")[1] for c in changed] == ["aten._to_copy.default", "aten.add_.Tensor"], changed
    got = gm(x, got_y)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_y, want_y)
    assert got[0].stride() == x.stride() and got[0].dtype == torch.float64
    assert got[1].data_ptr() != x.data_ptr()  # the same-dtype call still copies


def test_library_calls_of_a_compiled_graph_go_through_python_bindings():
    """ResNet-18's convolutions and its classifier's addmm are torch.convolution / torch.addmm in the compiled graph's
    code (no OpOverload on the call path), and the answers are unchanged."""
    torch._dynamo.reset()
    backend.reset()
    m, x = models.resnet18_block().eval(), models.conv_inputs(batch=2, size=16)
    with torch.no_grad():
        got, want = torch.compile(m, backend="fusion")(*x), m(*x)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    code = "\n".join(part.graph.code for e in backend.reports for part in e.parts if part.graph is not None)
    assert "torch.convolution(" in code and "torch.ops.aten.convolution" not in code, code


def test_cuda_graphs_see_every_input_a_graph_writes():
    """copy_ into an input, add_ on one, and the running statistics an in-place BatchNorm writes (args 3 and 4)."""
    from fusion.compiler.cudagraphs import mutated_input_indices

    aten = torch.ops.aten
    g = torch.fx.Graph()
    x, w, b, rm, rv, n, out = (g.placeholder(s) for s in ("x", "w", "b", "rm", "rv", "n", "out"))
    bn = g.call_function(aten._native_batch_norm_legit.default, (x, w, b, rm, rv, True, 0.1, 1e-5))
    g.call_function(aten.add_.Tensor, (n, 1))
    g.call_function(aten.copy_.default, (out, g.call_function(operator.getitem, (bn, 0))))
    g.output(())
    assert mutated_input_indices(torch.fx.GraphModule(torch.nn.Module(), g)) == [3, 4, 5, 6]


class _Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _packed_projection(head_major: bool, bias: bool):
    """MultiheadAttention's _in_projection_packed: one GEMM for q, k, v, copied head-major by .contiguous()."""

    def f(x, w, b):  # x (S, B, E), w (3E, E), b (3E,)
        s, batch, e = x.shape
        proj = x.reshape(s * batch, e) @ w.t()
        proj = (proj + b if bias else proj).view(s, batch, 3 * e)
        heads = proj.unflatten(-1, (3, e)).unsqueeze(0).transpose(0, -2).squeeze(-2)  # (3, S, B, E)
        heads = heads if head_major else heads.transpose(1, 2)  # (3, B, S, E): the rows in another order
        heads = heads.contiguous()
        return heads[0] * 2.0, heads[1], heads[2] + 1.0

    return f


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_a_gemm_copied_head_major_becomes_one_gemm_per_head(bias):
    """nn.MultiheadAttention's packed in-projection: one GEMM, then .contiguous() copies it head-major (3, S, B, E).
    Pass gemm_heads computes each head with its own GEMM (the bias in its epilogue), written where the copy put it:
    no copy left, the same values (float64), and every later view reads the right head."""
    from fusion.compiler.gemm_passes import gemm_per_head
    from fusion.regions import capture_aten

    f = _packed_projection(head_major=True, bias=bias)
    x, w, b = (torch.randn(*s, dtype=torch.float64) for s in ((5, 3, 8), (24, 8), (24,)))
    gm = capture_aten(_Fn(f), (x, w, b))
    assert gemm_per_head(gm, lambda *note: None) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten.clone.default not in targets and aten.mm.default not in targets or not bias
    assert targets.count(aten.addmm.default if bias else aten.mm.default) == 3, gm.code
    torch.testing.assert_close(tuple(gm(x, w, b)), f(x, w, b), rtol=1e-12, atol=1e-12)


def test_a_copy_that_reorders_the_rows_or_is_read_whole_keeps_its_gemm():
    """Legality: a head-major copy whose rows are in another order than the GEMM's (B, S instead of S, B), a copy read
    whole, a GEMM read by something else: per-head GEMMs would write other values or compute twice. Untouched."""
    from fusion.compiler.gemm_passes import gemm_per_head
    from fusion.regions import capture_aten

    x, w, b = (torch.randn(*s, dtype=torch.float64) for s in ((5, 3, 8), (24, 8), (24,)))

    def whole(x, w, b):
        proj = (x.reshape(15, 8) @ w.t() + b).view(5, 3, 24)
        return proj.unflatten(-1, (3, 8)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous() * 2.0

    def shared(x, w, b):
        mm = x.reshape(15, 8) @ w.t()
        heads = mm.view(5, 3, 24).unflatten(-1, (3, 8)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
        return heads[0], heads[1], mm.sum()

    for f in (_packed_projection(head_major=False, bias=True), whole, shared):
        gm = capture_aten(_Fn(f), (x, w, b))
        assert gemm_per_head(gm, lambda *note: None) == 0, f
        torch.testing.assert_close(gm(x, w, b), f(x, w, b))


def _with_pass(model: nn.Module, x: torch.Tensor, name: str, on: bool):
    """``model(x)`` compiled with pass ``name`` on or off (inference): its output checked against eager's, then the
    report of its one graph."""
    backend.reset()
    with torch.no_grad():
        out = torch.compile(model, backend="fusion", options={name: on})(x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    (part,) = backend.reports[0].parts
    return part


@pytest.mark.parametrize("layer", ["vit", "mha"])
def test_attention_projections_run_without_the_head_major_copy(layer):
    """The models that have it: torchvision's ViT encoder block (batch_first MultiheadAttention: a bmm made one mm
    first) and MultiheadAttention on (S, B, E) inputs (an addmm). (nn.TransformerEncoderLayer's inference is one fused
    op, with nothing to rewrite.) Compiled with and without pass gemm_heads, each gives eager's outputs; with it, the
    copy (a generated kernel or an aten clone) is gone: one launch fewer per attention."""
    from torchvision.models.vision_transformer import EncoderBlock

    torch.manual_seed(0)
    if layer == "vit":
        model, x = EncoderBlock(2, 16, 32, 0.0, 0.0), torch.randn(3, 5, 16)
    else:
        model, x = _SelfAttention(nn.MultiheadAttention(16, 4)), torch.randn(5, 3, 16)
    model = model.eval().requires_grad_(False)
    copies = {}
    for on in (False, True):
        part = _with_pass(model, x, "gemm_heads", on)
        copies[on] = len(part.kernels) + part.library_calls.get("clone", 0)
        assert [p[0] for p in part.passes].count("gemm per head") == on, part.passes
    assert copies[True] == copies[False] - 1, copies


class _SelfAttention(nn.Module):
    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        self.mha = mha

    def forward(self, q):
        return self.mha(q, q, q, need_weights=False)[0]


def test_a_bmm_of_a_weight_broadcast_over_the_batch_becomes_one_mm():
    """nn.MultiheadAttention's inference path (ViT's encoder block, parameters frozen) projects its transposed input
    with bmm(x, weight expanded over the batch): S small GEMMs. Pass bmm_as_mm makes it one mm with the same
    outputs; on its own, the rewrite equals the bmm for a contiguous and a transposed operand."""
    from torchvision.models.vision_transformer import EncoderBlock

    from fusion.regions import capture_aten

    torch.manual_seed(0)
    block = EncoderBlock(2, 16, 32, 0.0, 0.0).eval().requires_grad_(False)
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(block, backend="fusion")(x), block(x), rtol=1e-5, atol=1e-5)
    (part,) = backend.reports[0].parts
    assert [p[0] for p in part.passes].count("bmm as mm") == 1, part.passes

    class Bmm(nn.Module):
        def forward(self, a, w):
            return torch.bmm(a, w.expand(a.shape[0], *w.shape)) * 2.0

    w = torch.randn(7, 4, dtype=torch.float64)
    for a in (torch.randn(5, 3, 7, dtype=torch.float64), torch.randn(3, 5, 7, dtype=torch.float64).transpose(0, 1)):
        gm = capture_aten(Bmm(), (a, w))
        assert gemm_passes.bmm_as_mm(gm, lambda *note: None) == 1
        assert "bmm" not in gm.code and "mm" in gm.code, gm.code
        out = gm(a, w)
        torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, Bmm()(a, w))


def test_a_cat_moves_next_to_its_reader_past_a_folded_constant():
    """Pass reorder moves a cat (rotate_half's) down to its first reader as it moves pointwise ops: left behind, a
    constant folded between them (a causal mask, a get_attr) cut the run in two, and Llama's rotary embedding took
    two kernels per q and k (2026-11-28: 29 -> 21 launches a call on the CPU suite's Llama). One kernel here, eager's
    values."""

    class Rope(nn.Module):
        def forward(self, x):
            rot = torch.cat((-x[..., 4:], x[..., :4]), -1)
            mask = torch.ones(8, 8).tril() > 0  # computed from no input: folded to a constant, between the two
            return torch.where(mask, rot * 2.0 + x, 0.0)

    x = torch.randn(3, 8, 8)
    x[1, 2, 3] = float("nan")
    compiled = torch.compile(Rope(), backend="fusion")
    torch.testing.assert_close(compiled(x), Rope()(x), equal_nan=True)
    (part,) = backend.reports[0].parts
    assert len(part.kernels) == 1 and not part.library_calls, (part.kernels, part.library_calls)
    assert any(p[0] == "constants" for p in part.passes), part.passes


class _LinearGelu(nn.Module):
    """Linear -> GELU and Linear -> view -> residual add: two addmm read only by pointwise ops; a third Linear's
    output is returned (a reader that is not pointwise: its addmm stays)."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.head = nn.Linear(6, 12), nn.Linear(12, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = F.gelu(self.up(x))
        y = self.down(h) + x
        return y * 2, self.head(y)


def test_a_cpu_addmm_read_by_pointwise_ops_is_a_gemm_and_an_add_the_kernel_takes():
    """Pass gemm_bias (CPU): an addmm whose readers are all pointwise (through views) becomes mm + add, and the add
    joins the generated kernel of its readers: the same outputs and gradients as eager, no addmm left for those two
    Linears, the kernels as many as without the pass (no lone add), the returned Linear's addmm kept."""
    torch.manual_seed(0)
    model, x = _LinearGelu(), torch.randn(2, 5, 6)
    ops = {}
    for on in (False, True):
        part = _with_pass(model, x, "gemm_bias", on)
        ops[on] = (len(part.kernels), part.library_calls.get("addmm", 0), part.library_calls.get("mm", 0))
        assert sum(p[0] == "gemm bias" for p in part.passes) == on, part.passes
        assert not part.library_calls.get("add"), part.library_calls
    assert ops[False] == (ops[True][0], 3, 0) and ops[True][1:] == (1, 2), ops
    backend.reset()  # bfloat16: mm would round its output before the add, a second rounding: kept as addmm
    with torch.no_grad():
        half = copy.deepcopy(model).to(torch.bfloat16)
        out = torch.compile(half, backend="fusion")(x.to(torch.bfloat16))
    torch.testing.assert_close(out, half(x.to(torch.bfloat16)), rtol=0, atol=0)
    assert backend.reports[0].parts[0].library_calls.get("addmm") == 3, backend.reports[0].parts[0].library_calls
    x = torch.randn(2, 5, 6, requires_grad=True)  # training: the forward's GEMMs, gradients as eager's
    compiled = _LinearGelu()
    ref = copy.deepcopy(compiled)
    xr = x.detach().clone().requires_grad_(True)
    got, want = torch.compile(compiled, backend="fusion")(x), ref(xr)
    sum(o.sum() for o in got).backward()
    sum(o.sum() for o in want).backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    for a, b in zip(compiled.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(0, 9), k=st.integers(0, 9), n=st.integers(1, 9),
    bias=st.sampled_from(["row", "1xN", "full", "scalar"]), transposed=st.booleans(), special=st.booleans(),
)  # fmt: skip
def test_gemm_bias_rewrite_equals_addmm_on_drawn_shapes(m, k, n, bias, transposed, special):
    """The rewrite alone (aten, float64), on drawn sizes (0 and 1 included), bias shapes, a transposed operand and
    NaN/inf: mm + add equals addmm. A scaled addmm (beta, alpha) is never rewritten, nor one whose reader is not
    pointwise (another GEMM)."""
    from fusion.regions import capture_aten

    g = torch.Generator().manual_seed(m * 100 + k * 10 + n)
    a = (
        torch.randn(k, m, dtype=torch.float64, generator=g).t()
        if transposed
        else torch.randn(m, k, dtype=torch.float64, generator=g)
    )
    w = torch.randn(k, n, dtype=torch.float64, generator=g)
    b = {"row": (n,), "1xN": (1, n), "full": (m, n), "scalar": ()}[bias]
    b = torch.randn(b, dtype=torch.float64, generator=g)
    if special and b.numel():
        b.view(-1)[0] = float("nan") if n > 1 else float("inf")

    class Fn(nn.Module):
        def __init__(self, scaled: bool = False, gemm_reader: bool = False) -> None:
            super().__init__()
            self.scaled, self.gemm_reader = scaled, gemm_reader

        def forward(self, a, w, b):
            y = torch.addmm(b, a, w, beta=0.5) if self.scaled else torch.addmm(b, a, w)
            return (torch.mm(y, y.t()) if self.gemm_reader else torch.relu(y.view(-1)) * 3,)

    cases = [(Fn(), 1), (Fn(scaled=True), 0)] + [(Fn(gemm_reader=True), 0)] * (min(m, n) > 1)  # else not a GEMM
    for f, rewritten in cases:
        gm = capture_aten(f, (a, w, b))
        rewritten *= "addmm" in gm.code  # aten decomposes an addmm over k = 0 at capture: nothing to rewrite
        assert gemm_passes.bias_after_gemm(gm, lambda *note: None) == rewritten, gm.code
        assert "addmm" not in gm.code or not rewritten, gm.code
        out = gm(a, w, b)
        torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, f(a, w, b)[0], equal_nan=True)


# ----------------------------------------------------------------------------------------------------------------------
# Wrong answers and crashes found by a hunt on 2026-11-25; each test failed before its fix


def test_two_equal_constant_outputs_are_two_tensors():
    """hoist_constants shares equal one-element constants, never one the caller gets back: two zeros(1) outputs
    aliased each other, and `aux += 5` changed the other."""

    def f(x):
        return x + 1, torch.zeros(1), torch.zeros(1)

    _, aux, reg = torch.compile(f, backend="fusion")(torch.randn(3))
    aux += 5
    assert reg.item() == 0.0 and aux.data_ptr() != reg.data_ptr()


def test_returning_an_input_updated_in_place():
    """`return x.add_(1)`: reinplace kept the copy_ the output reads (it erased it: an internal error)."""
    x = torch.zeros(3)
    out = torch.compile(lambda t: t.add_(1), backend="fusion")(x)
    torch.testing.assert_close(x, torch.ones(3))
    torch.testing.assert_close(out, x)


def test_eval_batch_norm_with_gradients_enabled_is_lowered():
    """model.eval() called without no_grad(): parameters require grad, so the graph is a training one, and the eval
    batch norm is kept whole (its decomposition is the mutable _native_batch_norm_legit, which AOTAutograd rejects).
    Also on a transposed input, where the kept op's real strides differ from its traced ones."""
    torch.manual_seed(0)
    for model, x in ((nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()), torch.randn(2, 3, 6, 6)),
                     (_Transposed(nn.BatchNorm1d(6), lambda y: torch.relu(y) * 2), torch.randn(4, 3, 6))):  # fmt: skip
        model = model.eval()
        ref, mine = copy.deepcopy(model), copy.deepcopy(model)
        xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
        backend.reset()
        got = torch.compile(mine, backend="fusion")(xm)
        want = ref(xr)
        torch.testing.assert_close(got, want)
        got.square().sum().backward()
        want.square().sum().backward()
        torch.testing.assert_close(xm.grad, xr.grad)
        assert not any(r.error for r in backend.reports)


class _Transposed(nn.Module):
    """BatchNorm over the channels of (N, L, C) activations, as sequence models apply it: bn(x.transpose(1, 2))."""

    def __init__(self, bn: nn.Module, tail) -> None:
        super().__init__()
        self.bn, self.tail = bn, tail

    def forward(self, x):
        return self.tail(self.bn(x.transpose(1, 2)))


@pytest.mark.parametrize(
    "tail",
    [lambda y: y.transpose(1, 2), lambda y: y, lambda y: torch.relu(y) * 2, lambda y: y * y, lambda y: y**3],
    ids=["a view of it", "itself", "a kernel reads it", "saved for a kernel's backward", "pow"],
)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"))])  # fmt: skip
def test_training_batch_norm_on_a_transposed_input(tail, device):
    """A training batch norm stays one ATen call, whose CPU kernel returns a contiguous output where its meta
    function keeps the input's transposed strides. The compiled graph read it at the traced strides: values off by
    3.7 through a view, gradients off by 3.0, a ShapeMismatchError from a kernel. Now every library output a view, a
    kernel or the output reads is put in its traced layout first (a copy only where the strides differ)."""
    torch.manual_seed(0)
    model = _Transposed(nn.BatchNorm1d(6), tail).train().to(device)
    ref, mine = copy.deepcopy(model), copy.deepcopy(model)
    x, w = torch.randn(4, 3, 6, device=device), torch.randn(4, 6, 3, device=device)
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = torch.compile(mine, backend="fusion")(xm), ref(xr)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    (got * w.reshape(got.shape)).sum().backward()
    (want * w.reshape(want.shape)).sum().backward()
    torch.testing.assert_close(xm.grad, xr.grad, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(mine.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)
    torch.testing.assert_close(mine.bn.running_mean, ref.bn.running_mean)


# ----------------------------------------------------------------------------------------------------------------------
# Pass conv1x1: a 1x1 convolution of a channels-last image is a GEMM


def _cl(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64).contiguous(memory_format=torch.channels_last)


def _conv_graph(f, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(f, tracing_mode="fake")(*args)


@settings(max_examples=25, deadline=None)
@given(
    n=st.sampled_from([0, 1, 2, 3]), c=st.sampled_from([1, 3, 8]), h=st.sampled_from([1, 2, 5]),
    w=st.sampled_from([1, 4, 7]), k=st.sampled_from([1, 5, 16]), bias=st.booleans(),
    mask=st.tuples(st.booleans(), st.booleans(), st.booleans()),
)  # fmt: skip
def test_a_1x1_convolution_and_its_backward_are_gemms_with_the_same_values(n, c, h, w, k, bias, mask):
    """Pass conv1x1: convolution(x, W, b) of a channels-last x is X @ W.T (+ b); its backward dX = dY @ W,
    dW = dY.T @ X, db = dY.sum(0), for every output mask. float64: the same values; no convolution left (an empty
    batch stays a convolution: nothing to gain)."""
    x, wt, b, dy = _cl(n, c, h, w), _cl(k, c, 1, 1), torch.randn(k, dtype=torch.float64), _cl(n, k, h, w)

    def fwd(x, wt, b):
        return (aten.convolution.default(x, wt, b if bias else None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),)

    def bwd(dy, x, wt):
        outs = aten.convolution_backward.default(dy, x, wt, [k], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, list(mask))
        return tuple(o for o in outs if o is not None)

    for f, args in ((fwd, (x, wt, b)), (bwd, (dy, x, wt))):
        gm = _conv_graph(f, *args)
        rewritten = gemm_passes.conv1x1_as_mm(gm, lambda *note: None)
        got, want = gm(*args), f(*args)
        # taken unless there is nothing to compute or ATen lays an output out otherwise (C = 1: NCHW is chosen)
        images = list(want) if f is fwd else want[:1] if mask[0] else []  # the image outputs: y, or dX
        expect = n > 0 and len(want) > 0 and all(rt_same_layout(o, (h * w * o.shape[1], 1, w * o.shape[1], o.shape[1]))
                                                  for o in images)  # fmt: skip
        assert rewritten == expect, gm.code
        assert ("convolution" in gm.code) == (not expect), gm.code
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
            assert a.shape == e.shape and (a.numel() == 0 or rt_same_layout(a, e.stride()))


def rt_same_layout(t: torch.Tensor, stride) -> bool:
    from fusion.aten.nodes import same_layout as _same_layout

    return _same_layout(t, tuple(stride))


@pytest.mark.parametrize(
    "case",
    ["stride 2", "padding 1", "groups 2", "3x3 kernel", "NCHW input", "NCHW gradient", "transposed"],
)
def test_a_convolution_that_is_not_one_gemm_is_left_alone(case):
    """Legality: a strided, padded, grouped or 3x3 convolution reads other pixels than one row each; an NCHW image (or
    an NCHW gradient in the backward) is not one row-major (N·H·W, C) matrix; a transposed convolution is another
    product. Each stays a convolution, with its values."""
    x, wt, dy = _cl(2, 4, 5, 6), _cl(8, 4, 1, 1), _cl(2, 8, 5, 6)
    stride, padding, groups, transposed = [1, 1], [0, 0], 1, False
    if case == "stride 2":
        stride, dy = [2, 2], _cl(2, 8, 3, 3)
    elif case == "padding 1":
        padding, dy = [1, 1], _cl(2, 8, 7, 8)
    elif case == "groups 2":
        groups, wt = 2, _cl(8, 2, 1, 1)
    elif case == "3x3 kernel":
        wt, padding = _cl(8, 4, 3, 3), [1, 1]
    elif case == "NCHW input":
        x = x.contiguous()
    elif case == "NCHW gradient":
        dy = dy.contiguous()
    elif case == "transposed":
        wt, dy, transposed = _cl(4, 8, 1, 1), _cl(2, 8, 5, 6), True

    def fwd(x, wt):
        return (aten.convolution.default(x, wt, None, stride, padding, [1, 1], transposed, [0, 0], groups),)

    def bwd(dy, x, wt):
        return aten.convolution_backward.default(dy, x, wt, None, stride, padding, [1, 1], transposed, [0, 0], groups,
                                                 [True, True, False])[:2]  # fmt: skip

    graphs = [(bwd, (dy, x, wt))] if case == "NCHW gradient" else [(fwd, (x, wt)), (bwd, (dy, x, wt))]
    for f, args in graphs:
        gm = _conv_graph(f, *args)
        assert gemm_passes.conv1x1_as_mm(gm, lambda *note: None) == 0, (case, gm.code)
        torch.testing.assert_close(gm(*args), f(*args))


def _inverted_residual() -> nn.Module:
    """An inverted-residual block (1x1 expand, depthwise 3x3, 1x1 project with a bias, BatchNorm, ReLU6, the
    residual), channels-last, float64."""
    block = nn.Sequential(
        nn.Conv2d(6, 12, 1, bias=False), nn.BatchNorm2d(12), nn.ReLU6(),
        nn.Conv2d(12, 12, 3, padding=1, groups=12, bias=False), nn.BatchNorm2d(12), nn.ReLU6(),
        nn.Conv2d(12, 6, 1), nn.BatchNorm2d(6),
    )  # fmt: skip

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = block

        def forward(self, x):
            return x + self.block(x)

    return Residual().double().to(memory_format=torch.channels_last)


# options -> (1x1 convolutions rewritten in the forward graph, in the backward graph)
CONV1X1_OPTIONS = [
    ({}, (0, 2)),  # the default: the backward's GEMMs only (the forward measured slower as GEMMs)
    ({"conv1x1_forward": True}, (2, 2)),
    ({"conv1x1": False}, (0, 0)),
    ({"conv1x1": False, "conv1x1_forward": True}, (2, 0)),
]


@pytest.mark.parametrize("options,rewritten", CONV1X1_OPTIONS)
def test_a_channels_last_network_trains_through_its_1x1_convolutions_as_gemms(options, rewritten):
    """End to end, training: the compiled step gives eager's outputs, gradients and running statistics, whichever
    halves of the rewrite are on: pass ``conv1x1`` (default) makes each 1x1 convolution's backward two GEMMs, pass
    ``conv1x1_forward`` (opt-in) its forward one GEMM; a half that is off leaves cuDNN's (aten's) convolution."""
    torch.manual_seed(0)
    model = _inverted_residual().train()
    x = _cl(3, 6, 5, 7).requires_grad_()
    backend.reset()
    ref, mine = copy.deepcopy(model), copy.deepcopy(model)
    xr, xm = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    expected = ref(xr)
    expected.square().sum().backward()
    out = torch.compile(mine, backend="fusion", options=options)(xm)
    out.square().sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(xm.grad, xr.grad, rtol=1e-10, atol=1e-10)
    for (name, a), b in zip(ref.state_dict().items(), mine.state_dict().values(), strict=True):
        if a.is_floating_point():
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10, msg=name)
    for a, b in zip(ref.parameters(), mine.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-10, atol=1e-10)
    (report,) = backend.reports
    for kind, done in zip(("forward", "backward"), rewritten, strict=True):
        part = report.part(kind)
        assert [p[0] for p in part.passes].count("conv1x1 as mm") == done, (kind, part.passes)
        assert not any(p[0] == "depthwise conv" for p in part.passes), part.passes  # inference graphs only
        calls = part.library_calls
        convs = calls.get("convolution" if kind == "forward" else "convolution_backward", 0)
        assert convs == 3 - done, (kind, calls)


@pytest.mark.parametrize("options,rewritten", CONV1X1_OPTIONS)
@pytest.mark.usefixtures("triton_renderer")
def test_an_inference_graph_keeps_its_1x1_convolutions_unless_asked(options, rewritten):
    """Inference: only the opt-in forward half rewrites a 1x1 convolution (the default keeps cuDNN's, measured
    faster in whole models); the values are eager's either way."""
    torch.manual_seed(0)
    model = _inverted_residual().eval()
    x = _cl(3, 6, 5, 7)
    backend.reset()
    with torch.no_grad():
        expected = model(x)
        out = torch.compile(copy.deepcopy(model), backend="fusion", options=options)(x)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    (report,) = backend.reports
    part = report.part("inference")
    assert [p[0] for p in part.passes].count("conv1x1 as mm") == rewritten[0], part.passes
    # two 1x1 convolutions (the depthwise one is computed by a generated kernel: pass depthwise)
    assert part.library_calls.get("convolution", 0) == 2 - rewritten[0], part.library_calls


def test_mixed_precision_1x1_gradients_are_cast_by_aten_not_by_prims_references():
    """Under autocast a 1x1 convolution's weight gradient is the GEMM's (K, C) viewed as (K, C, 1, 1), strides
    (C, 1, 1, 1), cast back to float32. prims traced that cast with strides (C, 1, C, C): only size-1 dims differ, so
    it is aten's cast, not a prims reference run in Python (seen on the H100: 33 per ResNet-50 step, +13 ms)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(6, 12, 1, bias=False), nn.BatchNorm2d(12), nn.ReLU(), nn.Conv2d(12, 6, 1))
    model = model.to(memory_format=torch.channels_last).train()
    ref = copy.deepcopy(model)
    x = torch.randn(3, 6, 5, 7).contiguous(memory_format=torch.channels_last)
    outs = []
    for m in (torch.compile(model, backend="fusion"), ref):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(x)
        y.float().square().sum().backward()
        outs.append(y)
    torch.testing.assert_close(outs[0], outs[1], rtol=2e-2, atol=2e-2)
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=3e-2, atol=3e-2)
    (report,) = backend.reports
    for part in report.parts:  # the backward's two 1x1 convolutions are GEMMs (the forward's stay cuDNN's)
        assert [p[0] for p in part.passes].count("conv1x1 as mm") == (2 if part.kind == "backward" else 0), part.passes
        assert "prims" not in part.graph.code, part.graph.code


# ----------------------------------------------------------------------------------------------------------------------
# Pass depthwise: a depthwise convolution as a window sum inside the generated kernel around it (issue 23)


def _depthwise_chain(stride, padding, dilation):
    """clamp(x * scale - 0.25, 0, 6) → depthwise convolution → clamp(2y + 1, 0, 6): MobileNet's BatchNorm+ReLU6 on
    both sides, so the window reads a computed value and the kernel goes on after it."""

    def f(x, wt, scale):
        a = (x * scale.view(1, -1, 1, 1) - 0.25).clamp(0, 6)
        y = aten.convolution.default(a, wt, None, stride, padding, dilation, False, [0, 0], x.shape[1])
        return ((y * 2.0 + 1.0).clamp(0, 6),)

    return f


def _random_bn_stats(model: nn.Module, spread: float = 1.0) -> None:
    """BatchNorm running statistics that are not the identity: means in [-spread, spread], variances in [0.5, 2]."""
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.running_mean.uniform_(-spread, spread), bn.running_var.uniform_(0.5, 2.0)


def _compiled_inference(model: nn.Module, x: torch.Tensor, options: dict | None = None):
    """``model(x)`` through ``backend="fusion"`` under no_grad, checked against eager (float64: 1e-10); returns the
    report of its inference graph."""
    backend.reset()
    with torch.no_grad():
        out = torch.compile(copy.deepcopy(model), backend="fusion", options=options)(x)
        torch.testing.assert_close(out, model(x), rtol=1e-10, atol=1e-10)
    return backend.reports[0].part("inference")


@settings(max_examples=30, deadline=None)
@given(
    n=st.sampled_from([0, 1, 2]), c=st.sampled_from([1, 3, 8, 16, 24]), h=st.sampled_from([1, 2, 5]),
    w=st.sampled_from([1, 4, 7, 17]), kernel=st.sampled_from([(1, 1), (3, 3), (5, 5), (3, 1), (2, 3)]),
    stride=st.sampled_from([1, 2]), padding=st.sampled_from([0, 1, 2]), dilation=st.sampled_from([1, 2]),
    layout=st.sampled_from(["channels_last", "contiguous", "strided"]), special=st.sampled_from([None, "nan", "inf"]),
)  # fmt: skip
@example(n=2, c=8, h=5, w=7, kernel=(3, 3), stride=2, padding=1, dilation=1, layout="channels_last", special=None)
@example(n=2, c=24, h=5, w=7, kernel=(3, 3), stride=1, padding=1, dilation=1, layout="channels_last", special="nan")
@example(n=1, c=3, h=5, w=17, kernel=(5, 5), stride=1, padding=2, dilation=1, layout="contiguous", special="inf")
@pytest.mark.usefixtures("triton_renderer")
def test_a_depthwise_convolution_is_a_window_sum_with_the_same_values(
    n, c, h, w, kernel, stride, padding, dilation, layout, special
):
    """Pass depthwise + the generator: the convolution becomes fusion::depthwise_conv2d, computed inside the kernel of
    the ops around it as a sum over its window of the input (zero outside, never read) times the weight; float64: the
    convolution's values, NaN and inf where it has them, for every stride, padding, dilation, window (odd, even,
    1-wide), size-1 dims, an NCHW or strided input. An empty batch is one aten call (nothing to generate)."""
    from hypothesis import assume

    from fusion.codegen import compile_graph
    from fusion.compiler import depthwise

    out_h, out_w = (
        (s + 2 * padding - dilation * (k - 1) - 1) // stride + 1 for s, k in zip((h, w), kernel, strict=True)
    )
    assume(out_h > 0 and out_w > 0)
    g = torch.Generator().manual_seed(n * 100 + c * 10 + h)
    x = torch.randn(n, c, h, 2 * w if layout == "strided" else w, dtype=torch.float64, generator=g)
    x = x[..., ::2] if layout == "strided" else x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x  # fmt: skip
    if special and x.numel():
        x[0, -1, h // 2, w // 2] = float(special)
    wt, scale = torch.randn(c, 1, *kernel, dtype=torch.float64, generator=g), torch.rand(c, dtype=torch.float64) + 0.5
    f = _depthwise_chain([stride] * 2, [padding] * 2, [dilation] * 2)
    gm = _conv_graph(f, x, wt, scale)
    notes = []
    assert depthwise.depthwise_as_window_sums(gm, lambda *note: notes.append(note)) == 1, notes
    assert [n.target for n in gm.graph.nodes if "conv" in str(n.target)] == [depthwise.DEPTHWISE], gm.code
    compiled = compile_graph(gm, [x, wt, scale])
    torch.testing.assert_close(compiled(x, wt, scale), f(x, wt, scale), rtol=1e-12, atol=1e-12, equal_nan=True)
    ops = [op for k in compiled.kernels for op in k.ops]
    assert any("depthwise_conv2d" in op for op in ops) == (n > 0), (ops, compiled.report)
    names = [k.name for k in compiled.kernels]
    assert compiled.num_kernels == (1 if n else 0), names  # one kernel: before, conv, after


@pytest.mark.parametrize("padding", [0, 1])
def test_a_depthwise_window_of_negative_zeros_sums_to_positive_zero(padding):
    """The window sum's zero has eager's sign: a convolution of -0.0 (every term -0.0) is +0.0, and 1 / it +inf."""
    from fusion.codegen import compile_graph
    from fusion.compiler import depthwise

    def f(x, wt):
        y = aten.convolution.default(x, wt, None, [1, 1], [padding] * 2, [1, 1], False, [0, 0], x.shape[1])
        return (1.0 / y,)

    x, wt = torch.full((1, 3, 4, 5), -0.0).contiguous(memory_format=torch.channels_last), torch.ones(3, 1, 3, 3)
    gm = _conv_graph(f, x, wt)
    assert depthwise.depthwise_as_window_sums(gm, lambda *note: None) == 1
    (got,), (want,) = compile_graph(gm, [x, wt])(x, wt), f(x, wt)
    assert torch.equal(got, want) and bool((want == float("inf")).all()), (got, want)


@pytest.mark.parametrize("options,convs,kernels", [({}, 2, 2), ({"depthwise": False}, 3, 3)])
@pytest.mark.usefixtures("triton_renderer")
def test_an_inverted_residual_block_is_two_convolutions_and_two_kernels(options, convs, kernels):
    """Inference of MobileNetV2's block: 1x1 expand (cuDNN) → [BN, ReLU6, depthwise 3x3, BN, ReLU6] one generated
    kernel → 1x1 project (cuDNN) → [bias, BN, residual] one kernel: 4 launches. Without the pass the depthwise
    convolution is a library call between two kernels: 6. The values are eager's either way (float64)."""
    torch.manual_seed(0)
    model = _inverted_residual().eval()
    _random_bn_stats(model)
    part = _compiled_inference(model, _cl(2, 6, 5, 7), options)
    assert part.library_calls.get("convolution", 0) == convs, part.library_calls
    assert len(part.kernels) == kernels, [k.name for k in part.kernels]
    # a program of the window's kernel takes 512 elements on a GPU (its many loads: measured faster), others 1024
    blocks = sorted(lch.owner.plan.xblock for lch in part.graph.launchers)
    assert blocks == ([512] if not options else []) + [1024] * (kernels - (0 if options else 1)), blocks
    renamed = [p for p in part.passes if p[0] == "depthwise conv"]
    assert [p[2] for p in renamed] == (["window sum"] if not options else []), renamed


def test_depthwise_is_off_by_default_under_cuda_graphs_and_an_explicit_option_wins():
    """Replayed as a CUDA graph a launch costs no CPU, and cuDNN's depthwise kernel is the faster one on the GPU: the
    pass's default follows the cudagraphs switch (passes.Pass.unless); an explicit option is kept either way."""
    assert backend.Options.parse(None).depthwise and not backend.Options.parse({"cudagraphs": True}).depthwise
    assert backend.Options.parse({"cudagraphs": True, "depthwise": True}).depthwise
    assert not backend.Options.parse({"depthwise": False}).depthwise
    assert [p.name for p in backend.Options.parse({"cudagraphs": True}).passes_for("inference")].count("depthwise") == 0


class _SqueezeExcite(nn.Module):
    """EfficientNet's depthwise stage: depthwise 5x5 stride 2 → BN → SiLU, then squeeze-excitation (a mean over H, W,
    two 1x1 convolutions, a sigmoid) scaling it: the window's value feeds a reduction and a later multiply."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.dw, self.bn = nn.Conv2d(c, c, 5, stride=2, padding=2, groups=c, bias=False), nn.BatchNorm2d(c)
        self.fc1, self.fc2 = nn.Conv2d(c, 4, 1), nn.Conv2d(4, c, 1)

    def forward(self, x):
        y = F.silu(self.bn(self.dw(x)))
        s = torch.sigmoid(self.fc2(F.silu(self.fc1(y.mean((2, 3), keepdim=True)))))
        return y * s


@pytest.mark.parametrize("n,c,in_reduction", [(2, 8, False), (16, 256, True)])
@pytest.mark.usefixtures("triton_renderer")
def test_a_depthwise_convolution_feeding_a_reduction_gives_eager_values(n, c, in_reduction):
    """The window sum read by a mean (squeeze-excitation) and by a multiply after it: eager's values (float64). With
    16 rows of 8 channels the mean is an aten call (too few rows to share programs and read channels coalesced) and
    the window is in the pointwise kernel before it; with 4096 rows the mean has a reduction kernel, and a window is
    never computed inside one (each pass over the rows would compute it again, its loads scattered): it runs as one
    aten convolution there."""
    torch.manual_seed(0)
    model = _SqueezeExcite(c).double().to(memory_format=torch.channels_last).eval()
    _random_bn_stats(model)
    part = _compiled_inference(model, _cl(n, c, 9, 10))
    # what ran, once: a window the generator refused is torch.convolution in the notes and among the library calls
    notes = [p[2] for p in part.passes if p[0] == "depthwise conv"]
    assert notes == ["torch.convolution" if in_reduction else "window sum"], part.passes
    assert part.library_calls.get("convolution", 0) == 2 + in_reduction, part.library_calls  # + the two 1x1 convs
    windows = [k for k in part.kernels if any("depthwise" in op for op in k.ops)]
    reductions = [k for k in part.kernels if k.kind == "reduction"]
    assert (len(windows), len(reductions), part.library_calls.get("depthwise_conv2d", 0)) == (
        (0, 1, 0) if in_reduction else (1, 0, 0)
    ), (part.kernels, part.library_calls)
    assert all(not any("depthwise" in op for op in k.ops) for k in reductions)
    # left to aten, the op is torch.convolution itself (bindings), not its Python implementation behind the dispatcher
    code = part.graph.graph_module.code
    assert "torch.ops.fusion" not in code and code.count("torch.convolution(") == 2 + in_reduction, code


@pytest.mark.parametrize("act,taken", [(nn.ReLU6, True), (nn.Hardswish, True), (nn.SiLU, False), (nn.GELU, False)])
@pytest.mark.usefixtures("triton_renderer")
def test_a_window_over_a_costly_chain_is_left_to_its_library_call(act, taken):
    """A window computes what it reads again at each tap: worth it for BatchNorm+ReLU6 or hardswish (one kernel, the
    expanded tensor never written), not for a SiLU or GELU (an exp or erf at each of 9 taps): there the depthwise
    convolution is one aten call between two kernels, as without the pass. Eager's values either way (float64)."""
    torch.manual_seed(0)
    c = 6
    model = nn.Sequential(nn.BatchNorm2d(c), act(), nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False), nn.ReLU6())
    model = model.double().to(memory_format=torch.channels_last).eval()
    _random_bn_stats(model)
    part = _compiled_inference(model, _cl(2, c, 7, 5))
    windows = sum(any("depthwise" in op for op in k.ops) for k in part.kernels)
    assert (len(part.kernels), windows, part.library_calls.get("convolution", 0)) == (
        (1, 1, 0) if taken else (2, 0, 1)
    ), (part.kernels, part.library_calls)


@pytest.mark.parametrize("case", ["7x7", "bias", "grouped", "transposed", "dense"])
def test_a_convolution_the_window_sum_does_not_take_stays_a_library_call(case):
    """Legality and scope: a 7x7 depthwise window (49 taps, ConvNeXt: stays cuDNN's) and a depthwise convolution
    keeping its bias (pass conv_bias off) are refused with the reason in the report; a grouped convolution that is
    not depthwise, a transposed one and a dense one are not the pass's business (no note). Each keeps its values."""
    from fusion.compiler import depthwise

    c, k, groups, options = 4, 3, 4, {}
    if case == "7x7":
        k = 7
    elif case == "bias":
        options = {"conv_bias": False}
    elif case == "grouped":
        groups = 2
    elif case == "dense":
        groups = 1
    conv_type = nn.ConvTranspose2d if case == "transposed" else nn.Conv2d
    torch.manual_seed(0)
    model = nn.Sequential(conv_type(c, c, k, padding=k // 2, groups=groups, bias=case == "bias"), nn.ReLU6())
    model = model.double().eval()
    part = _compiled_inference(model, torch.randn(2, c, 8, 8, dtype=torch.float64), options)
    notes = [p for p in part.passes if p[0] == "depthwise conv"]
    if case in ("7x7", "bias"):
        (note,) = notes
        assert note[2] == "skipped" and ("49 taps" in note[3] if case == "7x7" else "bias" in note[3]), note
    else:
        assert notes == [], notes
    assert sum(part.library_calls.get(op, 0) for op in ("convolution", "depthwise_conv2d")) == 1, part.library_calls
    assert depthwise.MAX_TAPS == 25  # the 5x5 windows of EfficientNet and MobileNetV3 are taken


@pytest.mark.usefixtures("triton_renderer")
def test_two_windows_in_a_row_are_two_kernels():
    """A window (a depthwise convolution, a max-pool) reading another window's values would compute that window again
    at each of its taps: the generator splits the region there, the first window's output stored by a kernel."""

    class TwoWindows(nn.Module):
        def __init__(self, c: int = 4) -> None:
            super().__init__()
            self.dw1 = nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c, bias=False)
            self.dw2 = nn.Conv2d(c, c, 5, padding=2, groups=c, bias=False)

        def forward(self, x):
            y = self.dw1((x * 1.5 - 0.5).clamp(0, 6)).clamp(0, 6)
            return self.dw2(F.max_pool2d(y, 3, 1, 1)) + 1.0

    torch.manual_seed(0)
    model = TwoWindows().double().to(memory_format=torch.channels_last).eval()
    part = _compiled_inference(model, _cl(2, 4, 11, 9))
    windows = [[op for op in k.ops if "depthwise" in op or "max_pool" in op] for k in part.kernels]
    assert all(len(w) <= 1 for w in windows), windows  # at most one window a kernel
    # the max-pool alone between the two is one op: an aten call, not a kernel of its own
    assert sum(map(len, windows)) == 2 and part.library_calls == {"_low_memory_max_pool_with_offsets": 1}, (
        windows,
        part.library_calls,
    )


NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize(
    "device,k,stride",
    [("cpu", 3, 2), ("cpu", 5, 1), *(pytest.param("cuda", k, s, marks=NEEDS_GPU) for k in (3, 5) for s in (1, 2))],
)
@pytest.mark.usefixtures("triton_renderer")
def test_depthwise_window_sums_in_bfloat16_in_the_interpreter_and_on_cuda(device, k, stride):
    """bf16 channels-last (the suite's setting), on the GPU and in the interpreter: an inverted-residual block with a
    k x k depthwise convolution of stride 1 or 2 is within bf16 rounding of a float32 reference, no further from it
    than eager bf16 (2x its error, the suite's accuracy rule), and the depthwise convolution runs inside a kernel."""
    torch.manual_seed(0)
    c = 48
    block = nn.Sequential(
        nn.Conv2d(16, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU6(),
        nn.Conv2d(c, c, k, stride=stride, padding=k // 2, groups=c, bias=False), nn.BatchNorm2d(c), nn.ReLU6(),
        nn.Conv2d(c, 16, 1, bias=False), nn.BatchNorm2d(16),
    ).eval()  # fmt: skip
    _random_bn_stats(block, spread=0.5)
    x = torch.randn(4, 16, 29, 31).to(device).contiguous(memory_format=torch.channels_last)
    ref = block.to(device).to(memory_format=torch.channels_last)
    with torch.no_grad():
        want = ref(x)
        fast = copy.deepcopy(ref).bfloat16()
        eager = fast(x.bfloat16()).float()
        backend.reset()
        got = torch.compile(fast, backend="fusion")(x.bfloat16()).float()
    err, eager_err = (got - want).pow(2).mean().sqrt(), (eager - want).pow(2).mean().sqrt()
    assert err <= 2 * eager_err + 1e-6, (err.item(), eager_err.item())
    part = backend.reports[0].part("inference")
    assert part.library_calls.get("convolution", 0) == 2 and len(part.kernels) == 2, (part.library_calls, part.kernels)


def test_the_depthwise_op_is_one_convolution_outside_a_kernel():
    """fusion::depthwise_conv2d run on its own (a region the generator refused, a graph it did not compile) is the
    convolution it replaced, with its layout; on fake tensors too (the graph's strides are aten's)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fusion.compiler.depthwise import DEPTHWISE

    x, wt = _cl(2, 4, 7, 5), torch.randn(4, 1, 3, 3, dtype=torch.float64)
    want = F.conv2d(x, wt, stride=2, padding=1, groups=4)
    got = DEPTHWISE(x, wt, [2, 2], [1, 1], [1, 1])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with FakeTensorMode() as mode:
        fake = DEPTHWISE(mode.from_tensor(x), mode.from_tensor(wt), [2, 2], [1, 1], [1, 1])
    assert fake.shape == want.shape and fake.stride() == want.stride()


# ----------------------------------------------------------------------------------------------------------------------
# Passes cse and constants; a split's items as strides (issue 23: GPT-2 and Llama were CPU-bound on such calls)


@pytest.mark.parametrize("cse", [True, False])
def test_cse_computes_a_repeated_library_call_once(cse):
    def f(x, w):
        return torch.mm(x, w).relu() + torch.mm(x, w) * 2.0

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 3, dtype=torch.float64, generator=g), torch.randn(3, 7, dtype=torch.float64, generator=g)
    got = torch.compile(f, backend="fusion", options={"cse": cse})(x, w)
    torch.testing.assert_close(got, f(x, w), rtol=1e-12, atol=1e-12)
    assert _calls()["mm"] == (1 if cse else 2), _calls()


def test_cse_keeps_random_ops_and_equal_outputs_apart():
    def f(x):
        return x + torch.rand_like(x), x + torch.rand_like(x), x * 2.0, x * 2.0

    x = torch.zeros(64)
    a, b, c, d = torch.compile(f, backend="fusion")(x)
    assert not torch.equal(a, b)  # two draws, not one
    torch.testing.assert_close(c, d)
    c.fill_(7.0)  # the caller owns each output: writing one leaves the other as it was
    torch.testing.assert_close(d, x * 2.0)


class CausalMaskAdd(nn.Module):
    """A causal mask built from the sequence length alone (as HuggingFace builds one): no input changes it."""

    def forward(self, x):  # x: (batch, seq, seq)
        n = x.shape[-1]
        pos = torch.arange(n, device=x.device)
        allowed = pos[None, :] <= pos[:, None]
        mask = torch.where(allowed, torch.tensor(0.0, device=x.device), torch.tensor(float("-inf"), device=x.device))
        return torch.softmax(x + mask.to(x.dtype), dim=-1)


@settings(max_examples=6, deadline=None)
@given(batch=st.integers(0, 3), seq=st.integers(1, 9), constants=st.booleans(), grads=st.booleans())
@example(batch=2, seq=6, constants=True, grads=False)
@example(batch=2, seq=6, constants=False, grads=False)
def test_a_mask_computed_from_no_input_is_computed_once_at_compile_time(batch, seq, constants, grads):
    backend.reset()
    model = CausalMaskAdd()
    x = torch.randn(batch, seq, seq, dtype=torch.float64, generator=torch.Generator().manual_seed(seq))
    compiled = torch.compile(model, backend="fusion", options={"constants": constants})
    for scale in (1.0, -3.0):  # a second call with other values: the folded mask is still right
        xs = (x * scale).requires_grad_(grads)
        got = compiled(xs)
        torch.testing.assert_close(got, model(x * scale), rtol=1e-12, atol=1e-12)
        if grads and batch:  # the backward graph reads the folded mask's softmax, not the mask itself
            xe = (x * scale).requires_grad_()
            (g,) = torch.autograd.grad((got * got).sum(), xs)
            (want,) = torch.autograd.grad((model(xe) * model(xe)).sum(), xe)
            torch.testing.assert_close(g, want, rtol=1e-10, atol=1e-10)
    if batch == 0 or grads:  # an empty batch runs as aten; a training graph's counts are the forward's and more
        return
    calls = _calls()
    assert (sum(calls.values()) == 0) == constants, calls  # the iota/compare/where calls are gone, not moved
    notes = [p for p in backend.reports[0].parts[0].passes if p[0] == "constants"]
    assert bool(notes) == constants, backend.reports[0].table()


def test_a_returned_or_written_constant_is_never_shared_between_calls():
    def f(x):
        c = torch.arange(4.0)
        d = torch.ones(4) * 3.0
        d.add_(x)  # written in place after it is made: a value of the input, not a constant
        return x + c, c, c.view(2, 2), d

    compiled = torch.compile(f, backend="fusion")
    x = torch.randn(4, generator=torch.Generator().manual_seed(0))
    first = compiled(x)
    for t in first:
        t.fill_(100.0)  # the caller's tensors: writing them must not reach the next call's answer
    for got, want in zip(compiled(x), f(x), strict=True):
        torch.testing.assert_close(got, want)


class ShiftedWindowMask(nn.Module):
    """Swin's shifted-window mask: a zero fill, nine slices of it filled with a region number, then compared; built
    from no input each call. Returned beside the masked scores (as a training forward returns a tensor it saves for
    the backward: AOTAutograd's min-cut partitioner saves Swin's mask)."""

    def __init__(self, view: bool = False):
        super().__init__()
        self.view = view  # return a view of the mask (what escapes is then a view of the folded value)

    def forward(self, x):  # x: (batch, 6, 6)
        mask = x.new_zeros(6, 6)
        count = 0
        for h in ((0, -3), (-3, -1), (-1, None)):
            for w in ((0, -3), (-3, -1), (-1, None)):
                mask[h[0] : h[1], w[0] : w[1]] = count
                count += 1
        return x + mask.masked_fill(mask != 0, -100.0), mask.unsqueeze(0) if self.view else mask


@pytest.mark.parametrize("view", [False, True])
def test_a_returned_constant_is_folded_and_returned_as_a_copy(view):
    """A constant the graph returns (a training forward's saved mask) was computed at run time op by op, its whole
    chain with it (Swin-T's step: 180 launches for five masks): it is folded like any constant and returned as a
    copy, one call, so the caller still owns what it gets (writing it changes no later call)."""
    backend.reset()
    model = ShiftedWindowMask(view)
    x = torch.randn(2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(model, backend="fusion")
    for _ in range(2):
        got = compiled(x)
        for g, w in zip(got, model(x), strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        got[1].fill_(7.0)  # the caller's tensor: the next call's mask is the folded one, unchanged
    calls = _calls()
    # no fill, slice_scatter or compare at run time: one copy of the mask, and the add (alone: one op, no region)
    assert calls == {"clone": 1, "add": 1}, calls
    notes = [p for p in backend.reports[0].parts[0].passes if p[0] == "constants"]
    assert any(p[2] == "returned" for p in notes), backend.reports[0].table()


@pytest.mark.parametrize("unbind", [False, True])
def test_split_items_are_strides_of_what_the_split_reads(built, unbind):
    """GPT-2's q, k, v: one GEMM, split three ways, each item read by a library call. The items are reinterprets of
    the GEMM's output (no split or getitem call, no layout check on them); values as eager's, float64."""

    def f(x, w, a):
        qkv = torch.mm(x, w)  # (n, 3 * d)
        q, k, v = qkv.view(-1, 3, a.shape[0]).unbind(1) if unbind else qkv.split(a.shape[0], dim=-1)
        return torch.mm(q, a) + torch.mm(k, a).t() @ torch.mm(v, a)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, dtype=torch.float64, generator=g)
    w, a = torch.randn(4, 9, dtype=torch.float64, generator=g), torch.randn(3, 5, dtype=torch.float64, generator=g)
    torch.testing.assert_close(torch.compile(f, backend="fusion")(x, w, a), f(x, w, a), rtol=1e-12, atol=1e-12)
    calls = _calls()
    assert not {"split", "unbind", "split_with_sizes"} & set(calls), calls
    code = built[-1].code
    assert "aten.split" not in code and "aten.unbind" not in code and not re.search(r"\w\[\d+\]", code), code
    assert code.count("as_traced(") <= 1, code  # the returned sum's, at most: no check on a GEMM's output


class CausalAttention(nn.Module):
    """Two attention layers reading one boolean causal mask made from the sequence length (GPT-2's, under HF)."""

    def __init__(self, hole: bool = False):
        super().__init__()
        self.hole = hole  # one query row masked everywhere: the select after attention must stay

    def forward(self, q, k, v):  # q, k, v: (batch, heads, seq, dim)
        n = q.shape[-2]
        pos = torch.arange(n, device=q.device)
        mask = pos[None, :] <= pos[:, None]
        if self.hole:
            mask = mask & (pos[:, None] != 1)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.scaled_dot_product_attention(h * 0.5, k, v, attn_mask=mask) + h


@pytest.mark.parametrize("hole", [False, True])
def test_a_select_on_a_constant_all_true_condition_is_dropped(monkeypatch, hole):
    """On CUDA the attention rewrite puts ``where(attends, out, 0)`` after each attention call (0 for a query that
    attends to nothing). A causal mask is a constant where every query attends: the select would be the identity
    and is not added (GPT-2: 12 ``where`` a call). A mask with a row masked everywhere keeps it, and that row's
    answer stays 0."""
    from fusion.compiler import attention

    monkeypatch.setattr(attention, "DEVICES", ("cpu", "cuda"))
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    got = torch.compile(CausalAttention(hole), backend="fusion")(q, k, v)
    want = CausalAttention(hole)(q, k, v)
    torch.testing.assert_close(got, torch.nan_to_num(want) if hole else want)  # eager's math path: 0 there too
    calls = _calls()
    assert not {"any", "bitwise_and", "le"} & set(calls), calls  # the mask and its reduction: folded
    selects = calls["where"] + sum("where" in k.source for r in backend.reports for p in r.parts for k in p.kernels)
    assert bool(selects) == hole, backend.reports[0].table()  # the rewrite adds none (every query attends)


@pytest.mark.parametrize("hole", [False, True])
def test_a_where_on_a_folded_all_true_condition_is_its_first_branch(hole):
    """Pass ``constants`` folds a condition computed from no input; where it is True everywhere (False: the second
    branch) the select is dropped, with a note; a condition with one False keeps it."""

    def f(x):
        c = torch.arange(x.shape[-1]) >= (1 if hole else 0)
        return torch.where(c, torch.sin(x) * 2.0, 0.0) + 1.0

    backend.reset()
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.compile(f, backend="fusion")(x), f(x))
    dropped = [p for p in backend.reports[0].parts[0].passes if p[0] == "constants" and p[2] == "dropped"]
    assert bool(dropped) != hole, backend.reports[0].table()
    assert hole or not any("where" in k.source for k in backend.reports[0].parts[0].kernels)


def test_a_constant_over_the_limit_is_neither_folded_nor_computed_at_compile_time(monkeypatch):
    monkeypatch.setattr(graph_passes, "FOLD_LIMIT_BYTES", 64)  # 16 float32 values

    def f(x):
        big = torch.arange(32.0).view(4, 8)  # 128 bytes: over the limit, stays in the graph
        small = torch.arange(8.0) * 2.0  # 32 bytes: folded
        return x + big + small

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.compile(f, backend="fusion")(x), f(x))
    notes = [p for p in backend.reports[0].parts[0].passes if p[0] == "constants"]
    # one value folded (small); big never computed, so never even refused for its size
    assert [(p[1], p[2]) for p in notes] == [("1 value(s)", "precomputed")], backend.reports[0].table()


def test_cse_never_merges_two_reads_across_a_write():
    """``x * 2`` before and after ``x.copy_(y)`` are two values (a graph that writes an input reads it again after);
    the two reads before the write are one."""
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    a, b = g.call_function(aten.mul.Tensor, (x, 2.0)), g.call_function(aten.mul.Tensor, (x, 2.0))
    g.call_function(aten.copy_.default, (x, y))
    c = g.call_function(aten.mul.Tensor, (x, 2.0))
    g.output(g.call_function(aten.add.Tensor, (g.call_function(aten.add.Tensor, (a, b)), c)))
    gm = fx.GraphModule(torch.nn.Module(), g)
    notes = []
    removed = graph_passes.eliminate_common_subexpressions(gm, lambda *a: notes.append(a))
    assert removed == 1 and notes, gm.code
    assert len(gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor)) == 2, gm.code
    gen = torch.Generator().manual_seed(0)
    x0, y0 = torch.randn(5, dtype=torch.float64, generator=gen), torch.randn(5, dtype=torch.float64, generator=gen)
    torch.testing.assert_close(gm(x0.clone(), y0), 4.0 * x0 + 2.0 * y0, rtol=1e-12, atol=1e-12)


def test_a_dropped_select_never_makes_outputs_share_memory():
    """``where(all True, a, 0)`` is ``a``, but not where that would hand the caller memory eager did not: the select
    returned through a view beside ``a`` itself, or a select of an input returned through a view."""

    def f(x):
        keep = torch.arange(x.shape[-1]) >= 0  # a constant condition, all True
        a = x * 2.0
        return torch.where(keep, a, 0.0).view(-1), a, torch.where(keep, x, 0.0).view(-1)

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    got = torch.compile(f, backend="fusion")(x)
    for g, w in zip(got, f(x), strict=True):
        torch.testing.assert_close(g, w)
    got[0].fill_(7.0)
    got[2].fill_(9.0)  # each output the caller's own: a write reaches neither the other outputs nor the input
    torch.testing.assert_close(got[1], x * 2.0)
    torch.testing.assert_close(x, torch.randn(3, 4, generator=torch.Generator().manual_seed(0)))


def test_cse_never_merges_two_buffers_that_are_written():
    """Two ``empty`` buffers, each filled by a ``copy_``, are two tensors (one would hold the last copy only)."""
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    b1 = g.call_function(aten.empty.memory_format, ([5],), {"dtype": torch.float64})
    b2 = g.call_function(aten.empty.memory_format, ([5],), {"dtype": torch.float64})
    c1, c2 = g.call_function(aten.copy_.default, (b1, x)), g.call_function(aten.copy_.default, (b2, y))
    g.output(g.call_function(aten.add.Tensor, (c1, c2)))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert graph_passes.eliminate_common_subexpressions(gm, lambda *a: None) == 0, gm.code
    gen = torch.Generator().manual_seed(0)
    x0, y0 = torch.randn(5, dtype=torch.float64, generator=gen), torch.randn(5, dtype=torch.float64, generator=gen)
    torch.testing.assert_close(gm(x0, y0), x0 + y0)


# Issue 41: the report names each node once, with what ran


@pytest.mark.parametrize("c,in_reduction", [(8, True), (4, False)])
@pytest.mark.usefixtures("triton_renderer")
def test_a_depthwise_convolution_is_reported_once_as_what_ran(c, in_reduction):
    """A depthwise convolution read by a reduction kernel (ConvBNNet's BN → + residual → ReLU → mean) is torch.convolution,
    not a window sum: one row says so (pass depthwise's note, with the generator's reason), no fallback row repeats it,
    and it is counted among the convolutions the compiled code calls, not as ``depthwise_conv2d``. Without the
    reduction (a window between BatchNorms) the note stays "window sum" and no library call counts it."""
    if in_reduction:
        model, x = models.ConvBNNet(width=c).double().eval(), models.conv_inputs(batch=2, size=6)[0].double()
    else:
        model = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU6(), nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False))
        model, x = model.double().eval(), torch.randn(2, c, 5, 5, dtype=torch.float64)
    part = _compiled_inference(model, x)
    (dw,) = [p[1] for p in part.passes if p[0] == "depthwise conv"]
    what_ran = [p for p in part.passes if p[0] != "channels_last"]  # a layout note says nothing of what ran
    rows = [p for p in what_ran if dw in p[1].split(" → ")] + [f for f in part.fallbacks if dw in f[0]]
    assert len(rows) == 1, part.passes + part.fallbacks
    assert rows[0][2] == ("torch.convolution" if in_reduction else "window sum"), rows
    assert not in_reduction or "reduction" in rows[0][3], rows  # the generator's reason
    code = part.graph.graph_module.code
    assert "depthwise_conv2d" not in part.library_calls, part.library_calls
    assert part.library_calls.get("convolution", 0) == code.count("torch.convolution("), (part.library_calls, code)
    assert "torch.convolution" in str(backend.reports[0]) or not in_reduction


def test_a_window_sum_in_a_graph_that_is_not_compiled_is_reported_as_its_convolution():
    """The graph runs as its aten ops (e.g. dynamic shapes): the window sum pass depthwise noted is a convolution."""
    from fusion.compiler.depthwise import DEPTHWISE
    from fusion.compiler.report import PartReport

    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    g.output(g.call_function(DEPTHWISE, (x, w, [1, 1], [1, 1], [1, 1]), name="conv"))
    part = PartReport("inference", compiled=False)
    part.note_pass("depthwise conv", ["conv"], "window sum", "computed by the generated kernel around it")
    part.fallback("the whole graph", "dynamic shapes")
    part.count_library_calls(fx.GraphModule(torch.nn.Module(), g), [])
    assert part.library_calls == collections.Counter({"convolution": 1}), part.library_calls
    assert [p[2] for p in part.passes] == ["torch.convolution"] and "the whole graph" in part.passes[0][3], part.passes
    assert part.fallbacks == [("the whole graph", "dynamic shapes")], part.fallbacks


# Issue 41: the lesson's picture, `uv run --extra plot python -m fusion.backend --plot backend.png`


def test_the_backend_picture_is_a_png_of_what_each_call_runs(tmp_path):
    """ConvBNNet's call as the picture's lane reads it from the report: conv, kernel, conv, kernel, the depthwise conv
    the generator left to aten (with its reason), the reduction kernel, addmm; and the lesson's picture is a PNG."""
    pytest.importorskip("matplotlib")  # the `plot` extra: uv run --extra plot pytest -m phase9
    from fusion.viz import kernels as picture

    backend.reset()
    with torch.no_grad():
        torch.compile(models.ConvBNNet(width=8).eval(), backend="fusion")(models.conv_inputs(batch=2, size=8)[0])
    ((title, lane),) = picture.lanes_of("ConvBNNet", backend.reports)
    assert title == "ConvBNNet · graph 0 (inference)"
    assert [(kind, text if kind != "kernel" else detail) for kind, text, detail in lane] == [
        ("library", "conv"), ("kernel", "pointwise"), ("library", "conv"), ("kernel", "pointwise"),
        ("aten", "conv"), ("kernel", "reduction"), ("library", "addmm"),
    ], lane  # fmt: skip
    assert "reduction" in lane[4][2] and "rsqrt" in lane[1][1], lane
    path = tmp_path / "backend.png"
    picture.draw_lesson(backend, str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, len(data)
    assert backend.reports == []  # the picture leaves the lesson's reports as reset() does


# Issue 39: sums over leading dims (every bias and LayerNorm weight gradient) are generated


def test_bias_and_layernorm_weight_gradients_are_generated_not_aten_sums(monkeypatch):
    """A Linear + LayerNorm + ReLU + Linear model's backward: the LayerNorm's weight and bias gradients (sums over the
    batch and sequence dims) are generated, in a kernel of their own beside the input gradient's row sums, where
    before (reductions over trailing dims only) each ran as an aten sum; what is left to aten is the Linear bias
    gradients' lone sums. Gradients equal eager's."""
    from fusion.kernels import row_splits, rows

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.ln, self.out = nn.Linear(32, 48), nn.LayerNorm(48), nn.Linear(48, 16)

        def forward(self, x):
            return self.out(torch.relu(self.ln(self.lin(x))))

    def backward_report(model, x):
        torch._dynamo.reset()
        backend.reset()
        torch.compile(model, backend="fusion")(x).square().sum().backward()
        (report,) = backend.reports
        return report.parts[-1]

    torch.manual_seed(0)
    eager, x = Block(), torch.randn(2, 8, 32)
    eager(x).square().sum().backward()
    with monkeypatch.context() as m:  # the generator before: trailing dims only, a mixed region cut at its sum
        trailing_only = rows.Rows.of.__func__
        m.setattr(rows.Rows, "of", classmethod(lambda cls, r, s, b, *_, **__: trailing_only(cls, r, s, b)))
        m.setattr(row_splits, "split_by_reductions", lambda *a: None)
        before = backward_report(copy.deepcopy(eager), x)
    mine = copy.deepcopy(eager)
    for p in mine.parameters():
        p.grad = None
    now = backward_report(mine, x)
    assert now.kind == "backward" and now.library_calls["sum"] < before.library_calls["sum"], (before, now)
    assert now.library_calls["sum"] == 2 and not now.fallbacks, now  # out's and lin's bias: one lone sum each
    assert any("reduces dims [0, 1]" in why for _, why in before.fallbacks), before.fallbacks
    assert any("48 rows of 16" in k.source for k in now.kernels), [k.source for k in now.kernels]  # (2, 8) summed
    for (name, a), b in zip(mine.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


# Without Triton (macOS, Windows): the C renderer runs the backend's CPU kernels

HIDDEN_TRITON = textwrap.dedent(
    """
    import sys
    sys.modules["triton"] = None  # as on macOS or Windows: no Triton wheel
    import torch
    from fusion import backend
    try:
        import triton
        raise SystemExit("triton imported")
    except ImportError:
        pass
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32), torch.nn.LayerNorm(32))
    x = torch.randn(5, 32)
    with torch.no_grad():
        got = torch.compile(m.eval(), backend="fusion", options={"renderer": "c"})(x)
        torch.testing.assert_close(got, m(x))
    part = backend.reports[0].parts[0]
    print("RAN", sorted(part.renderers().values()), len(part.kernels))
    """
)


@pytest.mark.skipif(not c_runtime.available()[0], reason="no C compiler here")
def test_without_triton_the_backend_runs_c_kernels():
    """As on macOS or Windows (no Triton wheel): torch.compile(backend="fusion") runs its CPU kernels from C."""
    env = {**os.environ, "FUSION_RENDERER": "c"}
    done = subprocess.run([sys.executable, "-c", HIDDEN_TRITON], capture_output=True, text=True, env=env, timeout=300)
    if todo := re.search(r"TODO\(human\) Phase \d+: [^\n\"]*", done.stdout + done.stderr):  # a practice workspace
        raise NotImplementedError(todo.group(0))  # reported as the unsolved phase's, as an in-process test would
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RAN ['c', 'c'] 2" in done.stdout, done.stdout + done.stderr[-2000:]


def test_a_reduction_after_a_gemm_moves_up_to_its_input():
    """A bias gradient's ``sum`` over rows: AOTAutograd writes it after the GEMMs that read the same gradient, so a
    GEMM sits between it and the pointwise ops that compute its input, and it ran alone, one library call.
    raise_reductions moves it just after its input. A sum already beside its input, or of a graph input, stays; none
    moves past an op that writes a tensor."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w, b):
        b.add_(1)
        h = torch.nn.functional.gelu(x) * 2
        y = h @ w
        return y, h.sum(0), (h * 3).sum(1), x.sum(0), b.sum(0)

    def g(x, w, b):
        h = torch.nn.functional.gelu(x) * 2
        y = h @ w
        b.add_(1)  # a write between: the sum stays after it
        return y, h.sum(0)

    x, w, b = torch.randn(5, 6), torch.randn(6, 4), torch.randn(3)
    for fn, moves in ((f, 1), (g, 0)):
        gm = make_fx(fn, tracing_mode="fake")(x, w, b)
        assert graph_passes.raise_reductions(gm.graph) == moves
        gm.graph.lint()
        gm.recompile()
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        first_sum = next(n for n in nodes if n.target is aten.sum.dim_IntList)
        mm = next(n for n in nodes if n.target is aten.mm.default)
        assert (nodes.index(first_sum) < nodes.index(mm)) == bool(moves)
        if moves:
            assert first_sum.args[0] is first_sum.prev and first_sum.prev.target is aten.mul.Tensor
        torch.testing.assert_close(gm(x.clone(), w, b.clone()), fn(x.clone(), w, b.clone()))


def test_a_split_reductions_upcast_moves_with_its_stage_1_and_stage_2_stays():
    """A split reduction's stage 1 reads its input through a view and an upcast (``convert_element_type``) that only
    it reads: raise_reductions moves the three up to the producer, past the GEMM (GPT-2's q/k/v bias gradient then
    joins the kernel of the ``cat`` it sums, which ran as an aten call). Stage 2, a reduction of a reduction, stays
    with its readers: next to stage 1 it walks other rows and would be cut off again."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        h = torch.nn.functional.gelu(x) * 2
        y = h @ w
        p = torch.ops.prims.convert_element_type(h.view(5, 2, 3), torch.float64).sum(1)
        return y, p.sum(0)

    x, w = torch.randn(10, 3), torch.randn(3, 4)
    gm = make_fx(f, tracing_mode="fake")(x, w)
    assert graph_passes.raise_reductions(gm.graph) == 1
    gm.graph.lint()
    gm.recompile()
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    ops = [n.target for n in nodes]
    mm, sums = ops.index(aten.mm.default), [i for i, t in enumerate(ops) if t is aten.sum.dim_IntList]
    assert sums[0] < mm < sums[1], [n.name for n in nodes]
    assert ops[sums[0] - 1] is torch.ops.prims.convert_element_type.default, [n.name for n in nodes]
    torch.testing.assert_close(gm(x, w), f(x, w))


@pytest.mark.parametrize("views", ["permute", "view", "transpose"])
def test_a_cast_after_views_is_stored_by_the_kernel_of_its_input(views):
    """T5's pattern: a kernel computes x, and a cast of a permuted view of x is returned (the min-cut partitioner saves
    it for the backward). As views of the cast (pass ``cast_views``) the cast joins x's kernel; after the views it was
    a store of another shape, an aten call. Values, dtype, shape and strides are eager's."""

    def f(x):
        h = torch.sin(x) * 2.0
        v = {"permute": lambda t: t.view(6, 4, 5).permute(0, 2, 1), "view": lambda t: t.view(6, 20),
             "transpose": lambda t: t.transpose(1, 2)}[views](h)  # fmt: skip
        return h, v.to(torch.bfloat16)

    x = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    want = f(x)
    for on in (False, True):
        backend.reset()
        got = torch.compile(f, backend="fusion", options={"cast_views": on})(x)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
            assert g.dtype == w.dtype and g.stride() == w.stride(), (g.stride(), w.stride())
        calls = backend.reports[0].parts[0].library_calls
        assert (calls["convert_element_type"] == 0) == on, calls
        torch._dynamo.reset()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=NEEDS_GPU)])
def test_a_bias_gradient_joins_the_kernel_that_computes_its_input(device):
    """Linear-GELU-Linear, forward and backward: the first bias's gradient sums the GELU's backward, which a
    generated kernel computes and two GEMMs read. With pass ``raise_reductions`` the sum is part of that kernel
    (fewer aten ``sum`` calls in the backward); without it, a library call of its own. Values and gradients are
    eager's. (On a GPU with 4096 columns: enough programs for a column walk.)"""
    torch.manual_seed(0)
    width = 20 if device == "cpu" else 4096
    lin1, lin2 = nn.Linear(12, width).to(device), nn.Linear(width, 7).to(device)
    params = (*lin1.parameters(), *lin2.parameters())

    def f(x):
        return lin2(torch.nn.functional.gelu(lin1(x)) * 1.5)

    x = torch.randn(33, 12, device=device, requires_grad=True)

    def run(options):
        backend.reset()
        for p in (*params, x):
            p.grad = None
        out = torch.compile(f, backend="fusion", options=options)(x)
        out.pow(2).sum().backward()
        sums = sum(part.library_calls.get("sum", 0) for r in backend.reports for part in r.parts)
        return out.detach(), [p.grad.clone() for p in (*params, x)], sums

    out, grads, sums = run(None)
    out_off, grads_off, sums_off = run({"raise_reductions": False})
    for p in (*params, x):
        p.grad = None
    want = f(x)
    want.pow(2).sum().backward()
    for got, got_grads in ((out, grads), (out_off, grads_off)):
        torch.testing.assert_close(got, want.detach())
        for a, e in zip(got_grads, [p.grad for p in (*params, x)], strict=True):
            torch.testing.assert_close(a, e)
    assert sums < sums_off, (sums, sums_off)


def test_a_compiled_graph_frees_each_input_at_its_last_use():
    """AOTAutograd gives a compiled backward its saved activations in a list it hands over (the boxed convention).
    The compiled graph's boxed runner empties that list and its code drops each input after its last reader, so a
    saved tensor is freed as soon as the backward is done with it (before, the call's tuple held every one to the
    end: a GPT-2 step's peak was 0.7 GB above its saved tensors). A probe op after the input's last reader sees it
    gone; through ``make_boxed_func`` it is still alive."""
    import weakref

    from torch._functorch.aot_autograd import make_boxed_func
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion.compiler import aot
    from fusion.compiler.generate import compile_graph

    seen: list[bool] = []
    ref: list = []

    @torch.library.custom_op("fusion_test::probe_freed", mutates_args=())
    def probe(t: torch.Tensor) -> torch.Tensor:
        seen.append(bool(ref) and ref[0]() is None)
        return t.clone()

    probe.register_fake(lambda t: torch.empty_like(t))

    def f(x, w):
        return (probe(torch.sin(x) * 2) @ w,)

    x, w = torch.randn(8, 4), torch.randn(4, 3)
    gm = make_fx(f, tracing_mode="fake")(x, w)
    run = compile_graph(gm, [x, w]).runner()
    assert aot.make_boxed(run) is run.boxed and run.boxed._boxed_call
    want = f(x, w)[0]
    for call, freed in ((run.boxed, True), (make_boxed_func(run), False)):
        arg = x.clone()
        ref[:] = [weakref.ref(arg)]
        args = [arg, w]
        del arg
        seen.clear()
        got = call(args)[0]
        torch.testing.assert_close(got, want)
        assert seen == [freed], (call, seen)
    assert args == [] or not freed
    torch.testing.assert_close(run(x, w)[0], want)  # and called plainly, as before


def test_the_train_memory_script_reads_what_the_forward_saves(monkeypatch):
    """scripts/gpu_train_memory.py on the CPU (tiny BERT step): the partitioner's saved tensors are read while the
    step compiles (its counters are the GPU's, so on a CPU only the saved set is there)."""
    import importlib.util

    import torch._functorch.partitioners as partitioners
    import torch._inductor.compile_fx as compile_fx

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("gpu_train_memory", root / "scripts" / "gpu_train_memory.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for module in (partitioners, compile_fx):  # _patch replaces the partitioner in both: put them back after
        name = "min_cut_rematerialization_partition"
        if hasattr(module, name):
            monkeypatch.setattr(module, name, getattr(module, name))
    script._patch()
    row = script.measure("bert_train", "fusion", "cpu", "tiny")
    (saved,) = row["saved"]
    assert saved and all(v["tensors"] > 0 for v in saved.values()), row
