"""Pass ``sibling_casts`` (``fusion.compiler.sibling_casts``): a dtype cast that only GEMMs read moves beside a
pointwise op that reads the same tensor, and joins that op's kernel.

T5's attention backward casts the saved float32 probabilities to bfloat16 for the values' gradient (a batched GEMM)
and reads them in float32 in the softmax's backward. Alone, the cast was a library call reading the whole tensor
again. Tests: the pass moves the cast and its GEMM so the two readers share a kernel (one library call fewer, no
kernel more), the values are eager's, and it refuses where moving would change a result (a write in between, a
reader of the GEMM before the run's end); a tiny T5 training step under bfloat16 autocast has no lone cast left in
its backward and keeps eager's gradients.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from fusion import backend
from fusion.compiler import sibling_casts

pytestmark = pytest.mark.phase9

aten, prims = torch.ops.aten, torch.ops.prims


def attention_backward(p, do, v):
    """The shape of an attention's backward: p (the probabilities, float32) cast for the GEMM of the values'
    gradient; the softmax's backward reads p itself, after the GEMM of dp."""
    dv = torch.matmul(p.to(torch.float64).transpose(-1, -2), do)
    dp = torch.matmul(do, v.transpose(-1, -2)).to(torch.float32)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return dv, ds


def _inputs(shape=(2, 3, 5, 5), d=4):
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(shape, generator=g), -1)
    do = torch.randn(*shape[:-1], d, generator=g, dtype=torch.float64)
    v = torch.randn(*shape[:-2], shape[-1], d, generator=g, dtype=torch.float64)
    return p, do, v


def test_the_cast_moves_beside_its_sibling_and_its_gemm_after_the_run():
    gm = make_fx(attention_backward, tracing_mode="fake")(*_inputs())
    joined = sibling_casts.join_sibling_casts(gm.graph)
    gm.graph.lint()
    gm.recompile()
    assert len(joined) == 1
    nodes = list(gm.graph.nodes)
    cast = next(n for n in nodes if n.name == joined[0][0])
    sibling = next(n for n in nodes if n.name == joined[0][1])
    assert sibling.target is aten.mul.Tensor and cast.meta[sibling_casts.SIBLING] == sibling.name
    # the cast stands just before its sibling (through the views it reads), both read one alias of p
    alias = next(n for n in nodes if n.target is aten.alias.default)
    assert alias in sibling.all_input_nodes and cast.args[0] is alias
    bmms = [n for n in nodes if n.target is aten.bmm.default]
    assert nodes.index(cast) < nodes.index(sibling) < max(nodes.index(b) for b in bmms)
    torch.testing.assert_close(gm(*_inputs()), attention_backward(*_inputs()), rtol=0, atol=0)


def test_nothing_moves_past_a_write_or_before_a_reader_of_the_gemm():
    def written(p, do, v, buf):
        dv = torch.matmul(p.to(torch.float64).transpose(-1, -2), do)
        buf.add_(1)  # a write between the cast and the run: nothing crosses it
        dp = torch.matmul(do, v.transpose(-1, -2)).to(torch.float32)
        return dv, p * dp

    def read_early(p, do, v):
        dv = torch.matmul(p.to(torch.float64).transpose(-1, -2), do)
        dp = torch.matmul(dv.transpose(-1, -2), v.transpose(-1, -2)).to(torch.float32)  # reads the GEMM's result
        return p * dp

    for fn, args in ((written, (*_inputs(), torch.zeros(3))), (read_early, _inputs((2, 3, 4, 4), 4))):
        gm = make_fx(fn, tracing_mode="fake")(*args)
        before = [n.name for n in gm.graph.nodes]
        assert sibling_casts.join_sibling_casts(gm.graph) == [], fn.__name__
        assert [n.name for n in gm.graph.nodes] == before


def test_a_cast_already_beside_its_sibling_is_tied_to_it_by_an_alias():
    """Standing next to each other is not enough: Phase 6 joins a producer with its consumer, and two readers of a
    graph input share no edge. The pass gives them one (an alias both read), so the two share a kernel."""

    def f(p, w):
        c = p.to(torch.float64)
        s = p * 2.0
        return c @ w, s

    p, w = torch.randn(5, 3), torch.randn(3, 4, dtype=torch.float64)
    gm = make_fx(f, tracing_mode="fake")(p, w)
    assert len(sibling_casts.join_sibling_casts(gm.graph)) == 1
    gm.graph.lint()
    gm.recompile()
    torch.testing.assert_close(gm(p, w), f(p, w), rtol=0, atol=0)
    calls = {}
    for on in (False, True):
        backend.reset()
        torch._dynamo.reset()
        got = torch.compile(f, backend="fusion", options={"sibling_casts": on})(p, w)
        torch.testing.assert_close(got, f(p, w))
        (part,) = [q for r in backend.reports for q in r.parts]
        calls[on] = part.library_calls.get("convert_element_type", 0)
    torch._dynamo.reset()
    assert calls == {False: 1, True: 0}, calls


def test_compiled_the_cast_is_stored_by_the_siblings_kernel_with_eagers_values():
    """Through the backend: one library call fewer (the lone cast), no kernel more, the same values."""
    args = _inputs((2, 3, 5, 5), 3)
    want = attention_backward(*args)
    runs = {}
    for on in (False, True):
        backend.reset()
        torch._dynamo.reset()
        got = torch.compile(attention_backward, backend="fusion", options={"sibling_casts": on})(*args)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
            assert g.dtype == w.dtype and g.shape == w.shape
        (part,) = [p for r in backend.reports for p in r.parts]
        runs[on] = (part.library_calls.get("convert_element_type", 0), len(part.kernels))
    torch._dynamo.reset()
    assert runs == {False: (1, runs[False][1]), True: (0, runs[False][1])}, runs  # the cast in a kernel, no kernel more


@settings(max_examples=4, deadline=None)
@given(
    b=st.integers(1, 3), h=st.integers(1, 3), s=st.integers(0, 7), t=st.integers(1, 9), d=st.integers(1, 4),
    special=st.sampled_from([None, float("nan"), float("inf")]), transposed=st.booleans(),
)  # fmt: skip
@example(b=1, h=1, s=1, t=1, d=1, special=None, transposed=False)  # 1 x 1 GEMMs (aten makes them pointwise)
@example(b=3, h=2, s=7, t=1, d=3, special=float("nan"), transposed=True)
def test_drawn_shapes_and_special_values_give_eagers_values(b, h, s, t, d, special, transposed):
    """Odd, size-1 and empty sequences, a non-contiguous p (transposed storage), NaN and inf among the
    probabilities: the compiled backward gives eager's values (float64 GEMMs, float32 pointwise; sums may add in
    another order, as a 1 x 1 GEMM that aten makes a product and a sum)."""
    p, do, v = _inputs((b, h, s, t), d)
    if transposed:
        p = p.transpose(-1, -2).contiguous().transpose(-1, -2)
    if special is not None and p.numel():
        p[tuple(int(i) for i in torch.unravel_index(torch.tensor(p.numel() // 2), p.shape))] = special
    want = attention_backward(p, do, v)
    torch._dynamo.reset()
    got = torch.compile(attention_backward, backend="fusion", dynamic=False)(p, do, v)
    torch._dynamo.reset()
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)  # sums in another order: not bit for bit
        assert g.dtype == w.dtype and g.shape == w.shape


def test_t5_training_step_under_autocast_has_no_lone_cast_in_its_backward():
    """A tiny HF T5 encoder, one training step under bfloat16 autocast on CPU: the backward's casts of the saved
    probabilities join the softmax backward's kernel (the other casts, the gradients' back to float32, are pass
    ``combo_casts``'s on a GPU); loss and gradients as eager's (bfloat16 tolerance)."""
    from fusion.bench.suite_models import MODELS

    spec = MODELS["t5_encoder_train"]

    def step(model, inputs, options):
        f = torch.compile(model, backend="fusion", options=options) if options is not None else model
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = f(*inputs)
        outs = out if isinstance(out, (tuple, list)) else [out]
        loss = sum(o.float().pow(2).mean() for o in outs if isinstance(o, torch.Tensor))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return loss.detach(), grads

    torch.manual_seed(0)
    model, inputs = spec.build("tiny")
    model.train()
    want, want_grads = step(model, inputs, None)
    casts = {}
    for on in (False, True):
        backend.reset()
        torch._dynamo.reset()
        loss, grads = step(model, inputs, {"sibling_casts": on})
        parts = {p.kind: p for r in backend.reports for p in r.parts}
        casts[on] = parts["backward"].library_calls.get("convert_element_type", 0)
    torch._dynamo.reset()
    layers = model.model.config.num_layers
    assert casts[True] == casts[False] - layers, casts  # one cast of the probabilities per layer, now in a kernel
    assert [row[1] for row in parts["backward"].passes if row[0] == "sibling casts"] == [f"{layers} cast(s)"]
    torch.testing.assert_close(loss, want, rtol=1.6e-2, atol=1e-5)
    scale = max(g.abs().max().item() for g in want_grads.values())
    assert grads.keys() == want_grads.keys()
    for n, g in want_grads.items():
        torch.testing.assert_close(grads[n], g, rtol=1.6e-2, atol=1.6e-2 * scale, msg=lambda m, n=n: f"{n}: {m}")
