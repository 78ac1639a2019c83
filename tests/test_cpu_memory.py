"""A CPU graph's memory: convolutions read channels-last images (pass ``channels_last``, fusion.compiler.layout),
kernel outputs reuse buffers the graph is done with, in place where a pointwise kernel reads its input only where
it writes (wrapper pass ``reuse_buffers``, fusion.compiler.memory_plan), and the C renderer's prologue of
per-channel values. Every rule is checked against eager's values and strides, and against its own decisions."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion import backend
from fusion.codegen import compile_regions
from fusion.compiler import layout, memory_plan
from fusion.kernels import c_runtime

pytestmark = [pytest.mark.phase9, pytest.mark.skipif(not c_runtime.available()[0], reason="no C compiler here")]


@pytest.fixture(autouse=True)
def _fresh():
    backend.reset()
    yield
    backend.reset()


class Block(nn.Module):
    """MobileNetV2's inverted residual: 1x1 expand, BN, ReLU6, depthwise 3x3, BN, ReLU6, 1x1 project, BN, + input."""

    def __init__(self, c: int = 8, e: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.expand, self.bn1 = nn.Conv2d(c, c * e, 1, bias=False), nn.BatchNorm2d(c * e)
        self.dw, self.bn2 = nn.Conv2d(c * e, c * e, 3, padding=1, groups=c * e, bias=False), nn.BatchNorm2d(c * e)
        self.project, self.bn3 = nn.Conv2d(c * e, c, 1, bias=False), nn.BatchNorm2d(c)
        for bn in (self.bn1, self.bn2, self.bn3):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        h = F.relu6(self.bn1(self.expand(x)))
        h = F.relu6(self.bn2(self.dw(h)))
        return x + self.bn3(self.project(h))


def compiled(model, x, **options):
    backend.reset()  # a fresh compile: a second shape would make Dynamo compile a dynamic-shape graph
    with torch.no_grad():
        out = torch.compile(model, backend="fusion", options=options)(x)
    part = backend.reports[-1].parts[0]
    return out, part


def notes(part, name):
    return [p for p in part.passes if p[0] == name]


def test_channels_last_gives_eager_values_and_strides():
    model = Block().eval()
    x = torch.randn(2, 8, 24, 24)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    out, part = compiled(model, x)
    with torch.no_grad():
        ref = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert out.stride() == ref.stride()  # the caller gets eager's layout back
    (note,) = notes(part, "channels_last")
    assert note[2] == "channels-last", part.passes
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())  # the model is untouched
    assert model.expand.weight.is_contiguous() and x.is_contiguous()
    # channels innermost: each channel's BatchNorm scale is computed once, in the C kernel's prologue arrays
    sources = [c_runtime.named(lch.owner.plan.ir)[1] for lch in part.graph.launchers if lch.owner.plan.ir is not None]
    assert any("_s[32];" in src for src in sources), sources[0]  # a prologue array of the 32 channels


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
def test_channels_last_returns_each_output_in_eager_layout(fmt):
    class TwoOutputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 1)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            return y, y.mean((2, 3)), y[:, :2]  # a map, a vector, a slice of the map

    model = TwoOutputs().eval()
    x = torch.randn(1, 4, 9, 7).contiguous(memory_format=fmt)
    out, part = compiled(model, x)
    with torch.no_grad():
        ref = model(x)
    for o, r in zip(out, ref, strict=True):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
        assert o.stride() == r.stride()


def test_channels_last_refuses_heavy_weights_and_float64():
    class Dense(nn.Module):  # 3x3 weights of 64 x 64 channels on a 6x6 image: the weights outweigh the image
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(64, 64, 3, padding=1), nn.Conv2d(64, 64, 3, padding=1)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    x = torch.randn(1, 64, 6, 6)
    out, part = compiled(Dense().eval(), x)
    (note,) = notes(part, "channels_last")
    assert note[2] == "skipped" and "weights" in note[3], part.passes
    model = Block().double().eval()
    xd = torch.randn(1, 8, 5, 5, dtype=torch.float64)
    out, part = compiled(model, xd)
    with torch.no_grad():
        torch.testing.assert_close(out, model(xd), rtol=1e-12, atol=1e-12)
    assert {p[2] for p in notes(part, "channels_last")} == {"skipped"}, part.passes


def test_channels_last_off_keeps_nchw():
    _, part = compiled(Block().eval(), torch.randn(1, 8, 12, 12), channels_last=False)
    assert not notes(part, "channels_last")
    assert layout.WEIGHT_SHARE > 0


@settings(max_examples=6, deadline=None)
@given(h=st.integers(1, 13), w=st.integers(1, 13), batch=st.integers(0, 2), special=st.booleans())
def test_channels_last_block_any_shape(h, w, batch, special):
    model = Block(c=4, e=2).eval()
    x = torch.randn(batch, 4, h, w)
    if special and x.numel():
        x.view(-1)[0], x.view(-1)[-1] = float("nan"), float("inf")
    out, _ = compiled(model, x)
    with torch.no_grad():
        ref = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert out.stride() == ref.stride()


# ---------------------------------------------------------------------------------------------------------------------
# Buffer reuse


def big(c: int = 32, hw: int = 32) -> torch.Tensor:  # 32 x 32 x 32 float32 = 128 KiB: the smallest buffer reused
    return torch.randn(1, c, hw, hw)


def like_eager(model, x) -> tuple:
    """The compiled model's outputs, each checked against eager's."""
    out, _ = compiled(model, x)
    with torch.no_grad():
        ref = model(x)
    for o, r in zip(out, ref, strict=True):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
    return out


def reuse(part) -> tuple[int, list]:
    gm = part.graph.graph_module
    pairs = [lch.owner.plan.ir.in_place for lch in part.graph.launchers if lch.owner.plan.ir is not None]
    return gm.meta.get("reuse_buffers", 0), [p for p in pairs if p]


class Chain(nn.Module):
    """conv -> BN+ReLU kernel (in place over the conv's output) -> conv -> kernel -> ... (reused buffers)."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.convs = nn.ModuleList(nn.Conv2d(c, c, 1) for _ in range(3))
        self.bns = nn.ModuleList(nn.BatchNorm2d(c) for _ in range(3))

    def forward(self, x):
        for conv, bn in zip(self.convs, self.bns, strict=True):
            x = torch.relu(bn(conv(x))) * 0.5 + 0.25
        return x


def test_reuse_in_place_gives_eager_values_and_fresh_outputs():
    model = Chain().eval()
    x = big()
    with torch.no_grad():
        fn = torch.compile(model, backend="fusion")
        first = fn(x)
        kept = first.clone()
        second = fn(x * 2)
        ref1, ref2 = model(x), model(x * 2)
    torch.testing.assert_close(first, ref1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(second, ref2, rtol=1e-5, atol=1e-5)
    assert torch.equal(first, kept)  # the second call wrote nothing the first call returned
    count, pairs = reuse(backend.reports[-1].parts[0])
    assert count >= 3 and pairs, (count, pairs)
    sources = [lch.owner for lch in backend.reports[-1].parts[0].graph.launchers]
    c_sources = [c_runtime.named(o.plan.ir)[1] for o in sources if o.plan.ir is not None and o.plan.ir.in_place]
    assert c_sources and all(  # the shared pair is not restrict: one memory under two names
        f"*restrict {name}" not in src and f"*{name}" in src
        for src, o in zip(c_sources, (o for o in sources if o.plan.ir is not None and o.plan.ir.in_place), strict=True)
        for pair in o.plan.ir.in_place
        for name in pair
    )


def test_reuse_never_in_place_where_the_kernel_reads_another_element():
    class Shifted(nn.Module):  # each output element reads its neighbour: writing over the input would corrupt it
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(32, 32, 1)

        def forward(self, x):
            y = self.conv(x)
            return torch.cat([y[..., 1:], y[..., :1]], -1) * 2.0 + y

    model = Shifted().eval()
    x = big()
    out, part = compiled(model, x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert not reuse(part)[1]


def test_a_buffer_written_over_in_place_is_never_free_while_its_new_tenant_lives():
    """The memory an output took in place belongs to that output: it is free when the output dies, not when the
    input it was written over dies. Here the GEMM's output a dies at the ReLU kernel, which writes r over it; the
    roll kernel reads r a row away from where it writes, so it cannot go in place over r, and must not be handed
    a's memory either (it is r's). The plan runs from the second call on (the first allocates fresh outputs)."""

    class Rolled(nn.Module):
        def forward(self, x, w, v, y):
            r = torch.relu(x @ w) + 1.0  # in place over the GEMM's output
            s = r @ v  # a library call between the two kernels: r is read again after it
            return (y + r.roll(1, 0) * s,)  # reads r one row up: not in place over r

    torch.manual_seed(0)
    args = torch.randn(256, 256), torch.randn(256, 256), torch.randn(256, 1), torch.randn(256, 256)  # 256 KiB
    fn = compile_regions(Rolled(), list(args))
    for call in range(3):
        torch.testing.assert_close(fn(*args)[0], Rolled()(*args)[0], rtol=1e-5, atol=1e-5, msg=f"call {call}")
    launchers = fn.compiled.launchers
    assert fn.compiled.graph_module.meta.get("reuse_buffers") and any(lch.owner.plan.ir.in_place for lch in launchers)


def test_an_output_reshaped_from_what_the_kernel_stored_is_written_over_its_input():
    """ConvNeXt's MLP on a (batch, height, width, channels) input: the GEMM's output is (N, 4C), the GELU kernel
    stores (batch, height, width, 4C) and the region returns it viewed as (N, 4C), the same bytes. The launch
    allocates it as (N, 4C) and returns it as it is (launch_plans.allocated_as_returned), so the output is the
    kernel's own memory and goes over the GEMM's output in place (ConvNeXt-T's peak on CUDA: 166 MB, and 111 MB in
    place, as Inductor's)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).eval()
    x = torch.randn(2, 16, 16, 64)  # the GEMM's output: 512 x 256 float32, 512 KiB
    backend.reset()
    with torch.no_grad():
        fn = torch.compile(model, backend="fusion")
        for call in range(3):
            torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5, msg=f"call {call}")
    launchers = backend.reports[-1].parts[0].graph.launchers
    gelu = [lch for lch in launchers if "erf" in str(lch.owner.plan.ops)]
    assert gelu and all(lch._plain and lch.donated and lch.owner.plan.ir.in_place for lch in gelu), [
        (lch.owner.plan.results, lch.donated) for lch in launchers
    ]
    assert all(
        lch.owner.plan.stored[0].shape == (512, 256) for lch in gelu
    )  # the kernel's (2, 16, 16, 256), as returned


def test_a_launch_that_also_returns_a_view_of_another_input_still_writes_over_its_dying_input():
    """The region returns p (fresh) and m, a broadcast view of its input y that the next GEMM reads. m keeps y
    alive, not the GEMM's output a, which dies at the launch: p goes over a (T5's softmax returns its mask so, and
    its 96 MB probabilities stayed beside its 96 MB scores)."""

    class Broadcast(nn.Module):
        def forward(self, x, w, y):
            a = x @ w
            m = y.expand(256, 256)
            return ((torch.relu(a) * m) @ m.t(),)

    torch.manual_seed(0)
    args = torch.randn(256, 256), torch.randn(256, 256), torch.randn(256, 1)
    fn = compile_regions(Broadcast(), list(args))
    for call in range(3):
        torch.testing.assert_close(fn(*args)[0], Broadcast()(*args)[0], rtol=1e-5, atol=1e-5, msg=f"call {call}")
    (launch,) = fn.compiled.launchers
    assert not launch._plain and launch.donated == (0,) and launch.owner.plan.ir.in_place, launch.owner.plan.results


def test_reuse_keeps_returned_and_viewed_buffers():
    class Keeps(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(32, 32, 1), nn.Conv2d(32, 32, 1)

        def forward(self, x):
            y = self.a(x)  # returned: never written over
            t = y.transpose(2, 3)  # a view of y read after the next kernel
            z = torch.sigmoid(self.b(torch.relu(y)))
            w = torch.tanh(z) + 1.0
            return y, w + t, z.flatten(1)

    out = like_eager(Keeps().eval(), big())
    ptrs = {o.untyped_storage().data_ptr() for o in out}
    assert len(ptrs) == len(out)  # no two outputs share memory


def test_reuse_never_writes_over_a_returned_buffer():
    class Returned(nn.Module):  # the kernel reads y where it writes: in place, were y not returned
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(32, 32, 1)

        def forward(self, x):
            y = self.conv(x)
            return y, torch.relu(y) * 2.0

    like_eager(Returned().eval(), big())


def test_reuse_off_and_small_buffers():
    x = torch.randn(1, 8, 8, 8)  # 2 KiB: malloc reuses such chunks itself
    _, part = compiled(Chain(c=8).eval(), x)
    assert reuse(part) == (0, [])
    _, part = compiled(Chain().eval(), big(), reuse_buffers=False)
    assert reuse(part)[0] == 0
    assert memory_plan.REUSE_MIN == 128 * 1024


def test_a_softmax_writes_its_probabilities_over_its_scores():
    """An attention's softmax reads its scores (a GEMM's output, dead after it) only at the elements it writes: the
    plan writes the probabilities over them. The region's output is a view of the stored tensor with its own layout,
    which the launch returns as the tensor itself (``launch_plans.recipe``), so the launch is one the plan takes."""

    class Attention(nn.Module):
        def forward(self, q, k, v):
            p = torch.softmax(q @ k.transpose(-1, -2) + 1.0, -1)  # (4, 128, 128) float32: 256 KiB
            return (p @ v) * 2.0

    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 128, 32) for _ in range(3))
    backend.reset()
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(Attention(), backend="fusion")(q, k, v)
        torch.testing.assert_close(out, Attention()(q, k, v), rtol=1e-5, atol=1e-4)
    softmax = [lch for lch in backend.reports[-1].parts[0].graph.launchers if "exp" in lch.__name__]
    assert softmax and all(lch.owner.plan.ir.in_place for lch in softmax), [lch.__name__ for lch in softmax]


def test_writable_over_needs_every_read_at_the_written_element_before_the_write():
    from fusion.ir import kernel_ir as ir

    x = ir.Affine(((1, ir.Var("x0")),), 0)
    shifted = ir.Affine(((1, ir.Var("x0")),), 1)
    bufs = (ir.Buffer("in0", (8,), (1,), "float32"), ir.Buffer("out0", (8,), (1,), "float32", output=True))

    def kernel(*body):
        return ir.Kernel("k", "pointwise", bufs, (ir.Loop("x0", 8),), (), tuple(body))

    read, store = ir.Load("t0", "in0", x, "float32"), ir.Store("out0", x, "t1")
    double = ir.Op("t1", "add", ("t0", "t0"), "float32")
    assert memory_plan.writable_over(kernel(read, double, store), "in0", "out0")
    assert not memory_plan.writable_over(kernel(ir.Load("t0", "in0", shifted, "float32"), double, store), "in0", "out0")
    late = ir.Load("t2", "in0", x, "float32")  # read again after the write: it would see the new value
    assert not memory_plan.writable_over(kernel(read, double, store, late), "in0", "out0")
    assert not memory_plan.writable_over(kernel(read, double, store, ir.Store("out0", x, "t0")), "in0", "out0")


def test_reuse_in_place_over_a_reduction_kernels_input():
    class SqueezeExcite(nn.Module):  # conv -> BN + SiLU stored and averaged (one reduction kernel) -> gate
        def __init__(self, c):
            super().__init__()
            torch.manual_seed(0)
            self.conv, self.bn = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)
            self.bn.running_var.uniform_(0.5, 2.0)

        def forward(self, x):
            y = F.silu(self.bn(self.conv(x)))
            return y * torch.sigmoid(y.mean((2, 3), keepdim=True))

    rows = big()  # NCHW: each channel's map a contiguous row
    columns = torch.randn(1, 672, 7, 7).contiguous(memory_format=torch.channels_last)  # channels innermost: columns
    for x in (rows, columns):
        model = SqueezeExcite(x.shape[1]).eval()
        out, part = compiled(model, x, channels_last=False)
        with torch.no_grad():
            torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
        kinds = {lch.owner.plan.ir.kind for lch in part.graph.launchers if lch.owner.plan.ir.in_place}
        assert "reduction" in kinds, reuse(part)


# ---------------------------------------------------------------------------------------------------------------------
# Constant fills


def test_a_constant_fill_read_by_a_kernel_is_one_element_broadcast():
    class Masked(nn.Module):  # SDPA's math path on T5: scores + a zero float mask of the scores' shape
        def forward(self, x):
            return torch.softmax(x + torch.zeros(8, 64, 64), -1) * 2.0

    x = torch.randn(8, 64, 64)
    out, part = compiled(Masked(), x)
    torch.testing.assert_close(out, Masked()(x))
    assert [p[2] for p in notes(part, "broadcast_fulls")] == ["expanded"], part.passes
    gm = part.graph.graph_module
    held = [getattr(gm, n.target) for n in gm.graph.find_nodes(op="get_attr")]
    assert all(t.untyped_storage().nbytes() <= 4 for t in held), [t.shape for t in held]  # one float, not 128 KiB


def test_a_fill_read_through_as_strided_or_a_view_keeps_its_memory():
    """ConvNeXt-T's training graph reads a zero fill through ``as_strided``: over one element expanded that reads
    outside the storage (a crash), and ``view`` needs the fill's own contiguous memory; both keep the fill whole."""

    class Strided(nn.Module):
        def forward(self, x):
            z = torch.zeros(32, 64)
            y = torch.full((32, 64), 2.0)
            return z.as_strided((64, 32), (1, 64)) + x.t(), y.view(2048) * x.reshape(-1)

    x = torch.randn(32, 64)
    out, part = compiled(Strided(), x)
    for o, r in zip(out, Strided()(x), strict=True):
        torch.testing.assert_close(o, r)
    assert not [p for p in notes(part, "broadcast_fulls") if p[2] == "expanded"], part.passes


def test_a_view_of_a_broadcast_fill_is_traced_again_with_its_new_strides():
    """Swin-T's shifted-window mask in its bf16 training step: a zero fill, a slice of it read by a library call
    (``slice_scatter``). Over one element expanded, the slice's strides are 0; the code outside the kernels
    reinterprets a view by its traced strides, which still said (56, 1): out of the one element's storage (a crash
    on the GPU). Every view of a broadcast fill is traced again on the expanded element."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion.compiler import view_copies

    def f(x):
        top = torch.full((56, 56), 0.0)[:49]
        return torch.slice_scatter(top, x, dim=1, start=0, end=49)

    x = torch.randn(49, 49)
    gm = make_fx(f, tracing_mode="fake")(x)
    assert view_copies.fulls_as_broadcasts(gm, lambda *a: None)
    (view,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.slice.Tensor]
    assert view.meta["val"].stride() == (0, 0)
    torch.testing.assert_close(gm(x), f(x))


def test_a_returned_fill_keeps_its_memory_and_a_scattered_one_its_values():
    class Fills(nn.Module):
        def forward(self, x):
            z = torch.zeros(32, 64)
            z[:, :8] = x[:, :8] * 2.0  # functionalized: a slice_scatter reading the fill, a new tensor
            return z + 1.0, torch.full((32, 64), 3.0)  # the second returned as it is: the caller's own memory

    x = torch.randn(32, 64)
    out, part = compiled(Fills(), x)
    ref = Fills()(x)
    for o, r in zip(out, ref, strict=True):
        torch.testing.assert_close(o, r)
        assert o.stride() == r.stride()
    (note,) = notes(part, "broadcast_fulls")
    assert note[1].count("full") == 1, note  # only the one no output holds


def test_the_plan_owns_an_output_only_where_no_other_output_reads_its_memory():
    """memory_plan.stored_of: a stored tensor returned as it is, and read by no other output, is the kernel's own
    memory (the plan may free and reuse it when it dies); one another output also reads (a view, or view ops such as
    ``view.dtype``) is left alone, as is an output that is a view of an input."""
    from types import SimpleNamespace

    from fusion.ir import views

    dtype_view = views.Steps((views.Step("aten.view.dtype", (views.Ref(1), views.TorchName("int32"))),))
    results = (views.Take(1), dtype_view, views.Take(2), views.ViewOf(0, (4,), (1,), 0), views.Take(3))
    plan = SimpleNamespace(inputs=("x",), results=(*results, views.ViewOf(3, (2,), (1,), 0)))
    assert memory_plan.stored_of(SimpleNamespace(owner=SimpleNamespace(plan=plan))) == {2: 1}


def test_an_output_goes_into_a_donated_buffer_only_where_it_fits():
    """``triton_runtime._into``: the output is a view of the donated buffer's memory (no dispatch: Inductor's
    reinterpret) where the buffer has the dtype, starts its storage and holds the output's bytes; a fresh tensor
    otherwise (the plan never donates such a buffer: a check, not a path)."""
    from fusion.ir.views import extent
    from fusion.kernels.triton_runtime import _into

    def _need(shape, stride, dtype):  # what the launcher computes once per output
        return extent(shape, stride) * dtype.itemsize

    made = []

    def alloc(shape, stride, dtype):
        made.append(shape)
        return torch.empty_strided(shape, stride, dtype=dtype)

    buffer = torch.zeros(4, 6)
    out = _into(buffer, (6, 4), (1, 6), torch.float32, alloc, _need((6, 4), (1, 6), torch.float32))
    assert out.data_ptr() == buffer.data_ptr() and out.stride() == (1, 6) and not made
    out.fill_(1.0)
    assert buffer.sum() == 24  # the same memory
    assert _need((6, 4), (1, 6), torch.float32) == 96 and _need((0, 4), (4, 1), torch.float32) == 0
    for other, shape, stride in (
        (torch.zeros(4, 5), (4, 6), (6, 1)),  # too small
        (torch.zeros(4, 6, dtype=torch.float64), (4, 6), (6, 1)),  # another dtype
        (torch.zeros(30)[6:], (4, 6), (6, 1)),  # not at the start of its storage
    ):
        fresh = _into(other, shape, stride, torch.float32, alloc, _need(shape, stride, torch.float32))
        assert fresh.data_ptr() != other.data_ptr() and fresh.shape == shape
    assert len(made) == 3


def test_outputs_allocated_as_returned_can_be_switched_off_for_an_a_b(monkeypatch):
    """``launch_plans.AS_RETURNED`` (``FUSION_AS_RETURNED=0``), the switch of a GPU A/B: off, the GELU kernel of
    ConvNeXt's MLP stores its (2, 16, 16, 256) and returns it viewed as (512, 256) (a reinterpret a call); on, it
    stores (512, 256) and returns it as it is. The values are eager's both ways."""
    from fusion.compiler import launch_plans
    from fusion.ir import views

    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).eval()
    x = torch.randn(2, 16, 16, 64)
    shapes = {}
    for on in (False, True):
        monkeypatch.setattr(launch_plans, "AS_RETURNED", on)
        backend.reset()
        torch._dynamo.reset()
        with torch.no_grad():
            fn = torch.compile(model, backend="fusion")
            for _ in range(2):
                torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
        (gelu,) = [lch for lch in backend.reports[-1].parts[0].graph.launchers if "erf" in str(lch.owner.plan.ops)]
        plan = gelu.owner.plan
        shapes[on] = (plan.stored[0].shape, type(plan.results[0]))
    assert shapes == {False: ((2, 16, 16, 256), views.ViewOf), True: ((512, 256), views.Take)}
