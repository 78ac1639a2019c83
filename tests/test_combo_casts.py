"""Pass ``combo_casts`` (fusion.compiler.combo_casts) and its kernel (fusion.kernels.combo): a graph's independent
dtype casts as one ``fusion::combo_cast`` call, one generated Triton kernel for the whole list.

The kernel runs here in Triton's interpreter on CPU tensors (``triton_renderer``): bit for bit eager's ``.to()``
for float32 -> bfloat16/float16 (NaN, infinities, subnormals, overflow, ties rounded to even), sizes 0, 1 and odd,
100 tensors in one launch, transposed (dense) inputs in the kernel and sliced (not dense) ones through aten. The
pass is CUDA-gated; ``ON_CPU`` lets it rewrite CPU graphs: a tiny HF BERT training step under bfloat16 autocast
through ``backend="fusion"`` (its combo kernels interpreted, the other kernels in C) gives eager's loss and gradients,
bit-equal to the step with the pass off, with fewer cast calls in the backend's report and as many generated
kernels; the caller's model is not changed.
"""

from __future__ import annotations

import operator
from unittest import mock

import pytest
import torch
import torch.fx as fx

from fusion.aten.nodes import is_dense
from fusion.compiler import combo_casts as cc
from fusion.kernels import combo
from fusion.kernels import triton_runtime as rt

aten, prims = torch.ops.aten, torch.ops.prims
needs_triton = pytest.mark.skipif(not rt.triton_status()[0], reason="Triton is not installed")
# A pass of the backend's pipeline and its kernel: Phase 9's tests, as the other passes' are. The pass and the kernel
# read no learner's region (in a practice workspace those tests pass from the start); the training steps through the
# backend do.
pytestmark = pytest.mark.phase9


def _special(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` float32 values: random ones of many magnitudes, then the values casts get wrong first."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-140, 20, (n,), generator=g).float())
    bits = torch.tensor(
        [0x3F808000, 0x3F818000, 0xBF808000, 0x3F80C000, 0x00008000, 0x00018000, 0x007FFFFF,  # bf16 ties, subnormals
         0x7F7FFFFF, 0x7F7F8000, 0x00000001, 0x80000000, 0x7FC00001, 0xFFC00000],  # max (-> inf), NaN payloads
        dtype=torch.int64,
    ).to(torch.int32).view(torch.float32)  # fmt: skip
    extra = torch.tensor(
        [float("inf"), float("-inf"), float("nan"), 0.0, 65504.0, 65519.0, 65520.0, 70000.0, 6.0e-8, 2.98e-8,
         5.96e-8 * 1.5, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 1e-45, -1e-40],  # fp16: max, overflow tie, subnormals, ties
    )  # fmt: skip
    special = torch.cat([bits, extra])
    x[: min(n, len(special))] = special[:n]
    return x


def _bit_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), "NaN where eager has none (or none where it has one)"
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[want.element_size()]
    diff = (got.view(ints) != want.view(ints)) & ~nan
    assert not diff.any(), (
        f"{int(diff.sum())} element(s) differ from eager's .to(): {got[diff][:4]} vs {want[diff][:4]}"
    )


SIZES = [0, 1, 7, 1023, 1024, 1025, 3001]


@needs_triton
@pytest.mark.usefixtures("triton_renderer")
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the interpreter's numpy: to inf
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_casts_bit_equal_to_eager(dtype):
    xs = [_special(n, seed=i) for i, n in enumerate(SIZES)]
    xs.append(_special(37 * 19, seed=9).view(37, 19).t())  # transposed: dense, copied flat at its own strides
    xs.append(_special(64, seed=10).view(8, 8)[:, :5])  # not dense: aten copies it
    outs = combo.combo_cast(xs, dtype)
    for x, out in zip(xs, outs, strict=True):
        _bit_equal(out, x.to(dtype))
    ran = combo.kernel_for([x for x in xs if x.numel() and is_dense(x)], dtype)
    assert ran.grid == sum(-(-x.numel() // combo.BLOCK) for x in xs if is_dense(x))  # one launch, all of them


@needs_triton
@pytest.mark.usefixtures("triton_renderer")
def test_one_kernel_for_a_hundred_tensors_and_back_to_float32():
    xs = [_special(1 + 37 * i % 301, seed=i) for i in range(100)]
    k = combo.kernel_for(xs, torch.bfloat16)
    assert k.source.count("@triton.jit") == 1 and k.source.count("tl.store(") == 100
    assert k.grid == sum(-(-x.numel() // combo.BLOCK) for x in xs)  # one launch: every tensor's programs
    outs = combo.combo_cast(xs, torch.bfloat16)
    for x, out in zip(xs, outs, strict=True):
        _bit_equal(out, x.to(torch.bfloat16))
    assert combo.kernel_for(xs, torch.bfloat16) is k  # cached per (sizes, dtypes)
    back = combo.combo_cast([o for o in outs[:10]], torch.float32)  # the gradients' cast: exact
    for o, b in zip(outs, back, strict=False):
        _bit_equal(b, o.to(torch.float32))


def test_cpu_loop_and_the_op_agree_with_eager_and_fake_tensors():
    """Without Triton's interpreter the CPU implementation is a loop of aten copies; the op's fake implementation
    gives the same shapes and strides (FakeTensor, opcheck)."""
    xs = [_special(n, seed=n) for n in SIZES] + [_special(21).view(3, 7).t()]
    with mock.patch.object(combo, "use_triton", lambda device: False):
        outs = cc.COMBO_CAST(xs, torch.float16)
    for x, out in zip(xs, outs, strict=True):
        _bit_equal(out, x.to(torch.float16))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(x) for x in xs]
        vals = cc.COMBO_CAST(fakes, torch.bfloat16)
    assert [(v.shape, v.stride(), v.dtype) for v in vals] == [(o.shape, o.stride(), torch.bfloat16) for o in outs]
    with mock.patch.object(combo, "use_triton", lambda device: False):
        args = ([torch.randn(3, 4), torch.randn(5)], torch.bfloat16)
        torch.library.opcheck(cc.COMBO_CAST, args, test_utils=("test_schema", "test_faketensor"))


def test_kernel_source_refuses_what_it_cannot_cast():
    with pytest.raises(ValueError, match="cast those with aten"):
        combo.kernel_source([4], [torch.int32], torch.float32)
    src, _ = combo.kernel_source([2**31], [torch.float32], torch.bfloat16)
    assert "tl.int64" in src  # offsets past int32: computed in int64


# ----------------------------------------------------------------------------------------------------------------------
# The pass on a graph


class Linears(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.scale = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) * self.scale.to(torch.bfloat16)  # read by a mul: not grouped


def _aten_graph(model, x, kind="forward"):
    """(forward or backward aten graph AOTAutograd gives for ``model(x)`` under bfloat16 autocast, its inputs)."""
    from functorch.compile import aot_module, make_boxed_func

    graphs = {}

    def keep(name):
        def compiler(gm, example):
            graphs[name] = gm
            return make_boxed_func(gm.forward)

        return compiler

    from fusion.aten.capture import decomposition_table

    f = aot_module(
        model, fw_compiler=keep("forward"), bw_compiler=keep("backward"), decompositions=decomposition_table()
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = f(x)
    out.float().sum().backward()
    return graphs[kind]


def _casts(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is prims.convert_element_type.default]


def test_pass_groups_weight_casts_and_gradient_casts_and_nothing_else():
    torch.manual_seed(0)
    model, x = Linears(), torch.randn(3, 8)
    notes = []
    for kind in ("forward", "backward"):
        gm = _aten_graph(model, x, kind)
        before = len(_casts(gm))
        with mock.patch.object(cc, "ON_CPU", False):  # the gate: CPU graphs are left alone
            assert cc.combo_casts(gm, lambda *a: notes.append(a)) == 0
        with mock.patch.object(cc, "ON_CPU", True):
            grouped = cc.combo_casts(gm, lambda *a: notes.append(a))
        combos = [n for n in gm.graph.nodes if n.target is cc.COMBO_CAST]
        assert len(combos) == 1 and grouped == len(combos[0].args[0]) == before - len(_casts(gm)) >= 2
        assert all(u.target is operator.getitem for u in combos[0].users)
        if kind == "forward":  # x, a and b's weights and biases; scale's cast feeds the mul (one kernel with it)
            assert grouped == 5 and all(i.op == "placeholder" for i in combos[0].args[0])
            (left,) = _casts(gm)  # scale's: left to the mul's kernel
            assert aten.mul.Tensor in [u.target for u in left.users]
            assert combos[0].args[1] == torch.bfloat16
            assert combos[0].prev.op == "placeholder"  # before the first op: it cuts no run of fusible ops
        else:  # the GEMM gradients of a and b, cast back to float32, grouped before the output
            assert combos[0].args[1] == torch.float32 and combos[0].next.target is operator.getitem
            assert all(u.next.op in ("output", "call_function") for u in combos[0].users)
    assert [n[2] for n in notes] == ["one kernel", "one kernel"] and "in one kernel" in notes[0][3]


def test_a_large_group_is_cut_into_several_combo_nodes(monkeypatch):
    torch.manual_seed(0)
    model, x = Linears(), torch.randn(3, 8)
    gm = _aten_graph(model, x, "forward")
    args = [torch.randn(v.shape, dtype=v.dtype) for v in (n.meta["val"] for n in gm.graph.find_nodes(op="placeholder"))]
    want = gm(*args)
    monkeypatch.setattr(cc, "ON_CPU", True)
    monkeypatch.setattr(cc, "MAX_TENSORS", 2)
    assert cc.combo_casts(gm, lambda *a: None) == 5
    assert [len(n.args[0]) for n in gm.graph.nodes if n.target is cc.COMBO_CAST] == [2, 2, 1]
    for got, w in zip(gm(*args), want, strict=True):
        assert torch.equal(got, w)


def test_a_weight_the_graph_writes_keeps_its_cast_where_it_is(monkeypatch):
    """A graph input written in place (pass ``reinplace``'s BatchNorm statistics, a compiled optimizer step) is not
    cast at the top: moved across the write, the cast would read the other value."""
    import torch.fx as fx

    monkeypatch.setattr(cc, "ON_CPU", True)
    g = fx.Graph()
    w1, w2, w3, x, new = (g.placeholder(n) for n in ("w1", "w2", "w3", "x", "new"))
    real = {w1: torch.randn(4, 4), w2: torch.randn(4, 4), w3: torch.randn(4, 4), x: torch.randn(2, 4).bfloat16()}
    real[new] = torch.randn(4, 4)
    written = g.call_function(aten.copy_.default, (w2, new))
    casts = [g.call_function(prims.convert_element_type.default, (w, torch.bfloat16)) for w in (w1, w2, w3)]
    y = x
    for c in casts:
        y = g.call_function(aten.mm.default, (y, c))
    g.output((y, written))
    for n in g.nodes:
        if n.op == "placeholder":
            n.meta["val"] = real[n]
        elif n.op == "call_function":
            n.meta["val"] = n.target(*fx.node.map_arg(n.args, lambda a: a.meta["val"]))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert cc.combo_casts(gm, lambda *a: None) == 2
    (combo_node,) = [n for n in gm.graph.nodes if n.target is cc.COMBO_CAST]
    assert [a.name for a in combo_node.args[0]] == ["w1", "w3"] and [c.args[0].name for c in _casts(gm)] == ["w2"]


def test_a_combo_call_keeps_its_first_plan_and_casts_every_calls_values():
    """What a compiled graph calls for a combo node: the plan is worked out once; each call casts its own values
    (a training step's next weights: same shapes and strides, new values), laid out as eager's cast lays them."""
    call = combo.ComboCall("combo_cast_test")
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 5), (4, 2), (0, 3), (1,)]
    plan = None
    for _ in range(2):
        xs = [torch.randn(s, generator=g) for s in shapes]
        xs[1] = xs[1].t()  # a transposed (dense) input keeps its strides
        outs = call(xs, torch.bfloat16)
        for out, x in zip(outs, xs, strict=True):
            want = x.to(torch.bfloat16)
            assert torch.equal(out, want) and out.stride() == want.stride() and out.dtype == torch.bfloat16
        assert plan is None or call.plan is plan
        plan = call.plan


# ----------------------------------------------------------------------------------------------------------------------
# A tiny BERT training step through the backend


def _bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa",
    )  # fmt: skip
    return transformers.BertForMaskedLM(config)


def _step(model, ids, options=None):
    f = model if options is None else torch.compile(model, backend="fusion", options=options)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = f(input_ids=ids).logits
    loss = logits.float().pow(2).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _calls(reports, op: str) -> int:
    return sum(p.library_calls.get(op, 0) for r in reports for p in r.parts)


@needs_triton
def test_bert_training_step_under_autocast_equals_eager_with_fewer_cast_calls(monkeypatch):
    from fusion import backend

    monkeypatch.setattr(cc, "ON_CPU", True)
    monkeypatch.setattr(combo, "use_triton", lambda device: True)  # the combo kernel in Triton's interpreter
    model = _bert()
    model.train()
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    want, want_grads = _step(model, ids)

    runs = {}
    for on in (True, False):
        torch._dynamo.reset()
        backend.reset()
        loss, grads = _step(model, ids, {"combo_casts": on})
        notes = [row for r in backend.reports for p in r.parts for row in p.passes if row[0] == "combo casts"]
        kernels = sum(len(r.kernels) for r in backend.reports)
        runs[on] = (loss, grads, _calls(backend.reports, "convert_element_type"), _calls(backend.reports, "combo_cast"),
                    notes, kernels)  # fmt: skip
        assert not any(r.error for r in backend.reports)
        if on:
            combo_calls = [n.target for r in backend.reports for p in r.parts if p.graph is not None
                           for n in p.graph.graph_module.graph.nodes if isinstance(n.target, combo.ComboCall)]  # fmt: skip
    (loss, grads, casts_on, combos_on, notes_on, kernels_on) = runs[True]
    (loss_off, grads_off, casts_off, combos_off, notes_off, kernels_off) = runs[False]
    # eager's loss and gradients (bfloat16 autocast: the compiled step rounds where eager's kernels do not)
    torch.testing.assert_close(loss, want, rtol=1.6e-2, atol=1e-5)
    scale = max(g.abs().max().item() for g in want_grads.values())
    assert grads.keys() == want_grads.keys()
    for n, g in want_grads.items():
        torch.testing.assert_close(grads[n], g, rtol=1.6e-2, atol=1.6e-2 * scale, msg=lambda m, n=n: f"{n}: {m}")
    # the pass changes which call casts, never a value: bit for bit the step without it
    assert torch.equal(loss, loss_off) and all(torch.equal(grads[n], grads_off[n]) for n in grads_off)
    # one combo call per graph (forward: 16 weight/bias casts; backward: the GEMM gradients' casts)
    assert combos_on == 2 and combos_off == 0 and not notes_off
    grouped = sum(int(n[1].split()[0]) for n in notes_on)
    assert casts_on == casts_off - grouped and grouped >= 16, (casts_on, casts_off, notes_on)
    assert kernels_on == kernels_off  # the combo nodes stand where they split no region (top, end)
    # the compiled graphs call each combo node as a plain Python call that keeps its plan (pass python_bindings)
    assert len(combo_calls) == 2 and all(c.plan is not None for c in combo_calls)
    for k, v in model.state_dict().items():  # the caller's model: untouched
        assert torch.equal(v, state[k]) and v.dtype == state[k].dtype, k


@needs_triton
def test_conv_net_training_step_groups_conv_weights_and_their_gradients(monkeypatch):
    """Convolutions too: the weights' casts before ``convolution``, the gradients ``convolution_backward`` gives
    cast back to float32, each group one call; the same gradients as without the pass."""
    from fusion import backend

    monkeypatch.setattr(cc, "ON_CPU", True)
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    runs = {}
    for on in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1), torch.nn.Flatten(),
            torch.nn.Linear(4 * 6 * 6, 5),
        )  # fmt: skip
        torch._dynamo.reset()
        backend.reset()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = torch.compile(model, backend="fusion", options={"combo_casts": on})(x)
        out.float().pow(2).mean().backward()
        parts = {p.kind: p for r in backend.reports for p in r.parts}
        runs[on] = [p.grad for p in model.parameters()], parts
    (grads, parts), (grads_off, parts_off) = runs[True], runs[False]
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_off, strict=True))
    for kind in ("forward", "backward"):
        assert parts[kind].library_calls["combo_cast"] == 1 and "combo_cast" not in parts_off[kind].library_calls
    grouped = [row[1] for row in parts["backward"].passes if row[0] == "combo casts"]
    assert grouped == ["5 casts"]  # two convolutions' and the Linear's weight gradients, the convolutions' biases


@needs_triton
def test_kernel_compiles_for_an_h100_without_one():
    """The source Triton compiles for CUDA (the GPU path, which no CPU test runs): to PTX for sm_90 with the
    pointers 16-byte aligned, each cast one round-to-nearest-even conversion."""
    import importlib.util
    import sys

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    numels = [5, 1024, 3001]
    src, name = combo.kernel_source(numels, [torch.float32] * 3, torch.bfloat16)
    path = rt.source_path(src, name)
    spec = importlib.util.spec_from_file_location(f"combo_test_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    signature = {f"in{i}": "*fp32" for i in range(3)} | {f"out{i}": "*bf16" for i in range(3)}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(6)}
    try:
        compiled = triton.compile(
            ASTSource(getattr(module, name), signature, attrs=attrs), target=GPUTarget("cuda", 90, 32)
        )
    except (ImportError, RuntimeError, FileNotFoundError) as e:  # no NVIDIA back-end or ptxas in this Triton
        pytest.skip(f"Triton cannot compile for CUDA here: {type(e).__name__}: {e}")
    ptx = compiled.asm["ptx"]
    assert "cvt.rn.bf16" in ptx and "cvt.rz" not in ptx


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_bias_gradients_cast_joins_the_group_on_a_gpu_only(device):
    """A bias gradient (a sum over the batch) cast back to float32 and returned: on a GPU aten runs that lone sum, so
    its cast is a gradient cast of the group; on a CPU the C renderer generates the sum and the cast joins its kernel.
    Fake tensors: no GPU needed to decide."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        g_val = torch.empty(8, 4, dtype=torch.bfloat16, device=device)
        s_val = g_val.sum([0])
        c_val = s_val.float()
    g = fx.Graph()
    x = g.placeholder("g")
    x.meta["val"] = g_val
    s = g.call_function(torch.ops.aten.sum.dim_IntList, (x, [0]))
    s.meta["val"] = s_val
    c = g.call_function(torch.ops.prims.convert_element_type.default, (s, torch.float32))
    c.meta["val"] = c_val
    g.output((c,))
    assert cc.gradient(c, s) == (device == "cuda")
