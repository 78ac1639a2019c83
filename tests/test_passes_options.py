"""Every rewrite is a pass with an option (issue 37): the wrapper passes around the generated kernels and the
attention-mask rewrite on Dynamo's graph switch off by name, change what runs when off, and keep eager's answer."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from support import MaskedAttention, spy_mask_rewrite

from fusion import backend
from fusion.compiler import partition, passes
from fusion.compiler.attention import CAPTURE_PASSES
from fusion.compiler.pass_base import Pass, current, enabled_passes
from fusion.compiler.wrapper_passes import WRAPPER_PASSES

pytestmark = pytest.mark.phase9


@pytest.fixture
def built(monkeypatch):
    """The code of every graph the partition stage builds (the wrapper a compiled call runs)."""
    codes = []
    original = partition.build_compiled_graph

    def spy(gm, plans):
        new = original(gm, plans)
        codes.append(new.code)
        return new

    monkeypatch.setattr(partition, "build_compiled_graph", spy)
    return codes


def _conv(x, w):
    return torch.relu(F.conv2d(x, w)) * 2.0  # the conv's output, read by a kernel: as_traced holds its strides


def _linear(a, m):
    return torch.relu(a @ m.t()) + 1.0  # the weight's t() before the mm: a view outside the kernels


def _cast(a, m):
    return torch.relu(a.to(torch.float64) @ m.t().to(torch.float64)) * 2.0  # prims.convert_element_type alone


def _pool(x):
    return F.max_pool2d(torch.relu(x * 2.0), 3, 2, 1) + 1.0  # inference: the low-memory prim, offsets unread


def _args(name):
    g = torch.Generator().manual_seed(0)
    if name in ("conv", "pool"):
        return (torch.randn(2, 3, 8, 8, generator=g), torch.randn(4, 3, 3, 3, generator=g))[
            : 2 if name == "conv" else 1
        ]
    return torch.randn(5, 6, generator=g), torch.randn(7, 6, generator=g)


# option: (function, its inputs, text the wrapper has with the pass on, text it has with the pass off)
CASES = {
    "traced_layouts": (_conv, "conv", "as_traced(", None),
    "views_as_strides": (_linear, "linear", "reinterpret(", "aten.permute.default("),
    "python_bindings": (_linear, "linear", "torch.mm(", "aten.mm.default("),
    "prims_to_aten": (_cast, "linear", "torch_Tensor_to(", "prims.convert_element_type.default("),
    "max_pool_as_aten": (_pool, "pool", "max_pool2d_with_indices_values", "prims._low_memory_max_pool"),
}


def _wrapper_code(built, f, args, options) -> str:
    built.clear()
    backend.reset()
    with torch.no_grad():
        got = torch.compile(f, backend="fusion", dynamic=False, options=options)(*args)
    torch.testing.assert_close(got, f(*args))  # on or off, eager's answer
    assert built, "no graph was built around generated kernels"
    return "\n".join(built)


@pytest.mark.parametrize("name", list(CASES))
def test_switching_a_wrapper_pass_off_changes_the_wrapper_and_keeps_the_answer(built, name):
    f, inputs, when_on, when_off = CASES[name]
    args = _args(inputs)
    on = _wrapper_code(built, f, args, None)
    off = _wrapper_code(built, f, args, {name: False})
    assert when_on in on and when_on not in off, f"--- on:\n{on}\n--- off:\n{off}"
    if when_off is not None:
        assert when_off in off and when_off not in on, f"--- on:\n{on}\n--- off:\n{off}"


@pytest.mark.parametrize("on", [True, False])
def test_switching_the_attention_mask_rewrite_off_leaves_the_boolean_mask(monkeypatch, on):
    seen = spy_mask_rewrite(monkeypatch)  # the rewrite runs on CUDA; checked here on a CPU
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5, generator=g) > 0.3
    options = {"attention_mask": on}
    backend.reset()
    # The compile reads the options of the compile in progress (pass_base.current()): the driver activates them
    with torch.no_grad():
        got = torch.compile(MaskedAttention(), backend="fusion", options=options)(q, k, v, mask)
    torch.testing.assert_close(got, MaskedAttention()(q, k, v, mask))
    assert len(seen) == (1 if on else 0), seen


def test_options_know_every_stage_pass_and_the_driver_loop_runs_only_aten_passes():
    opts = passes.Options(backend.PASSES, {"views_as_strides": False})
    described = {name: (stage, on, doc) for name, stage, on, doc in opts.describe()}
    for p in (*CAPTURE_PASSES, *WRAPPER_PASSES):
        stage, on, doc = described[p.name]
        assert stage == p.stage and doc and on == (p.default and p.name != "views_as_strides")
    assert {p.stage for p in opts.passes_for("inference")} == {"aten"}
    assert [p.name for p in opts.passes_for("inference", stage="wrapper")] == [
        p.name for p in WRAPPER_PASSES if p.default and p.name != "views_as_strides"
    ]
    names = [p.name for p in opts.passes]  # the driver's list names every stage's pass, each once
    assert all(names.count(p.name) == 1 for p in (*CAPTURE_PASSES, *WRAPPER_PASSES)) and len(set(names)) == len(names)
    with pytest.raises(ValueError, match="unknown fusion backend option"):
        passes.Options(backend.PASSES, {"views_as_stride": False})
    with pytest.raises(ValueError, match="stage"):
        Pass("x", lambda gm, part: None, stage="later")


def test_stage_passes_follow_the_active_options_and_their_defaults_outside_a_compile():
    off_by_default = Pass("opt_in", lambda gm, part: None, stage="wrapper", default=False)
    stage = [*WRAPPER_PASSES, off_by_default]
    assert current() is None
    assert enabled_passes(stage) == [p for p in WRAPPER_PASSES if p.default]
    opts = passes.Options([*backend.PASSES, off_by_default], {"opt_in": True, "traced_layouts": False})
    with opts.active():
        assert current() is opts
        names = [p.name for p in enabled_passes(stage)]
        assert "opt_in" in names and "traced_layouts" not in names
    assert current() is None


def test_a_graph_without_kernels_still_runs_its_max_pool_as_aten():
    """``options={"codegen": False}``: the graph runs as it is, its prims (the max-pool prim too) mapped to aten ops
    (``wrapper_passes.map_prims``)."""
    (x,) = _args("pool")
    backend.reset()
    with torch.no_grad():
        got = torch.compile(_pool, backend="fusion", options={"codegen": False})(x)
    torch.testing.assert_close(got, _pool(x))
    noted = [p for r in backend.reports for part in r.parts for p in part.passes if p[0] == "prims to aten"]
    assert noted and noted[0][1] == "1 prims call(s)", backend.reports[0].table()


def _compiled_step(model, x, monkeypatch, options: dict) -> tuple[torch.Tensor, list[torch.Tensor], list[tuple]]:
    """One compiled forward + backward: the loss, the gradients, and (kind, code, tensors saved) per aten graph (a
    forward graph returns its outputs, then what it saves for the backward)."""
    from fusion.compiler import driver

    graphs, original = [], driver.kernels

    def spy(gm, part, opts):
        returned = len(next(n for n in gm.graph.nodes if n.op == "output").args[0])
        graphs.append((part.kind, str(gm.code), returned - 1))  # a forward's: all but its one output
        return original(gm, part, opts)

    monkeypatch.setattr(driver, "kernels", spy)
    torch._dynamo.reset()
    model.zero_grad()
    loss = torch.compile(model, backend="fusion", options=options)(x).square().sum()
    loss.backward()
    monkeypatch.setattr(driver, "kernels", original)
    return loss.detach(), [p.grad.clone() for p in model.parameters()], graphs


def _train_step(model, x, monkeypatch, min_cut: bool) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    """One compiled forward + backward: the loss, the gradients, and how many tensors each forward graph saves."""
    loss, grads, graphs = _compiled_step(model, x, monkeypatch, {"min_cut": min_cut})
    return loss, grads, [n for kind, _, n in graphs if kind == "forward"]


@pytest.mark.parametrize("min_cut", [False, True])
def test_min_cut_partitioner_saves_fewer_values_and_keeps_the_gradients(monkeypatch, min_cut):
    """``options={"min_cut": True}``: AOTAutograd's min-cut partitioner (Inductor's) cuts the joint graph so the
    forward saves fewer tensors (the backward recomputes GELU's pointwise chain); loss and gradients stay eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.LayerNorm(32)).double()
    x = torch.randn(8, 16, dtype=torch.float64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loss, grads, saved = _train_step(model, x, monkeypatch, min_cut)
    model.zero_grad()
    want = model(x).square().sum()
    want.backward()
    torch.testing.assert_close(loss, want.detach())
    for g, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert len(saved) == 1
    if min_cut:  # fewer than the default partitioner saves for the same model
        assert saved[0] < _train_step(model, x, monkeypatch, False)[2][0]


def test_decompose_bn_trains_as_eager_and_saves_less(monkeypatch):
    """``options={"decompose_bn": True}``: a training graph's batch norm is decomposed (Inductor's way), not kept as
    the library's kernel. The step's loss, gradients and running statistics stay eager's, no batch norm op is left in
    the compiled graphs, and the forward saves fewer tensors: SiLU's backward recomputes the normalised value from
    the batch norm's input and statistics, which its backward needs anyway, where a whole batch norm's output had to
    be saved beside them (EfficientNet-B0 at tiny sizes: 25.9 -> 18.0 MB, Inductor's 18.0)."""

    def step(decompose: bool):
        torch.manual_seed(0)
        layers = (nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU(), nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8))
        model = nn.Sequential(*layers, nn.SiLU()).double()
        x = torch.randn(4, 3, 9, 7, dtype=torch.float64)
        eager = copy.deepcopy(model)
        backend.reset()
        loss, grads, graphs = _compiled_step(model, x, monkeypatch, {"decompose_bn": decompose})
        want = eager(x).square().sum()
        want.backward()
        torch.testing.assert_close(loss, want.detach())
        for g, q in zip(grads, eager.parameters(), strict=True):
            torch.testing.assert_close(g, q.grad)
        for (name, b), c in zip(model.named_buffers(), eager.buffers(), strict=True):
            torch.testing.assert_close(b, c, msg=name)  # running mean, variance, batches tracked: updated as eager
        return graphs

    kept, decomposed = step(False), step(True)
    assert any("batch_norm" in code for _, code, _ in kept)
    assert not any("batch_norm" in code for _, code, _ in decomposed), [c for _, c, _ in decomposed]
    saved = {name: [n for kind, _, n in g if kind == "forward"] for name, g in (("kept", kept), ("dec", decomposed))}
    assert saved["dec"][0] < saved["kept"][0], saved


def test_decompose_bn_takes_an_eval_mode_batch_norm_whose_weights_train():
    """A model in eval mode whose weights still need gradients (fine-tuning with frozen statistics): with
    ``decompose_bn`` its ``_native_batch_norm_legit_no_training`` is decomposed too (kept, AOTAutograd would reject
    the mutable op Inductor's decomposition of it calls); the gradients stay eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU()).double().eval()
    model[1].running_mean.uniform_(-0.5, 0.5)
    model[1].running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    loss = torch.compile(model, backend="fusion", options={"decompose_bn": True})(x).square().sum()
    loss.backward()
    want = eager(x).square().sum()
    want.backward()
    torch.testing.assert_close(loss, want)
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
