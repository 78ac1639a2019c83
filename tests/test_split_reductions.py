"""Phase 9's pass ``split_reductions`` (fusion.compiler.split_reductions): a reduction with few outputs over a long
extent as two reductions. The pass is CUDA-gated; here ``ON_CPU`` and small thresholds let it rewrite CPU graphs:
numerics against eager (hypothesis-drawn shapes and dtypes, NaN and inf for amax/amin), the kernel count (stage 1
one kernel with its pointwise producers), and every refusal noted with its reason.
"""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from support import Fn

from fusion import backend
from fusion.aten.capture import aten_inputs
from fusion.codegen import compile_graph
from fusion.compiler import split_reductions as sr
from fusion.regions import capture_aten

pytestmark = pytest.mark.phase9

aten = torch.ops.aten


SMALL = dict(ON_CPU=True, LONG_EXTENT=64, LONG_COLUMN_EXTENT=64, MIN_CHUNK=4, MIN_COLUMN_CHUNK=4,
             TARGET_PROGRAMS=128, TARGET_COLUMN_PROGRAMS=128)  # stage 1 >= LOOPED_MIN_ROWS programs  # fmt: skip


@pytest.fixture
def small():
    """The pass on CPU graphs, with thresholds scaled to tests' sizes (extents >= 64, chunks >= 4)."""
    with mock.patch.multiple(sr, **SMALL):
        yield


def split(f, *xs):
    """(graph after the pass, notes, count): ``f`` captured as an aten graph, the pass run on it directly."""
    gm = capture_aten(Fn(f), xs)
    notes = []
    count = sr.split_reductions(gm, lambda *a: notes.append(a))
    return gm, notes, count


def reductions(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in sr.SPLIT]


# Layouts: (shape, dims) with the reduced extent >= 64: few long rows, few long columns (the reduced dims lead, a
# contiguous inner dim of >= 16 columns), a middle dim, several dims, every dim, size-1 dims between.
LAYOUTS = [
    ((3, 96), [-1]),
    ((1, 105), [1]),  # 3 * 5 * 7: S = 3, 5, 7, ...
    ((2, 1, 128), [-1]),
    ((96, 16), [0]),
    ((75, 17), [0]),  # odd sizes: S = 3, 5, 15, 25
    ((4, 81, 16), [1]),  # a middle dim
    ((6, 16, 32), [0, 1]),  # several leading dims: an extent of 96
    ((6, 1, 16, 32), [0, 1, 2]),  # a size-1 dim inside the reduced ones
    ((10, 12), None),  # every dim: one output
    ((1, 64, 1), [0, 1]),
]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _close(got, want, op, dtype, extent):
    if op in ("amax", "amin", "any"):  # exact: a max of maxes is the max, NaN included
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        return
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-12}[dtype]
    # both round a float32 (float64) sum once; the orders of summation differ by <= extent ulps of the accumulator
    acc = 1e-12 if dtype == torch.float64 else 4e-7 * extent
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=acc * 4 + tol)


@given(
    layout=st.sampled_from(LAYOUTS),
    op=st.sampled_from(["sum", "mean", "amax", "amin", "any"]),
    dtype=st.sampled_from(FLOATS),
    keepdim=st.booleans(),
    specials=st.lists(st.sampled_from([float("nan"), float("inf"), -float("inf"), 0.0]), max_size=3),
    producer=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_split_reductions_give_eagers_values(layout, op, dtype, keepdim, specials, producer, seed):
    """Every split reduction (sum, mean, amax, amin, any; half, bfloat16, float32, float64) gives eager's values:
    exactly for amax/amin (NaN and inf too) and any; sums and means within one rounding of the result dtype (the
    order of summation changes, float32 partials, one rounding at the end as eager's)."""
    shape, dims = layout
    torch.manual_seed(seed)
    x = torch.randn(shape, dtype=torch.float64).to(dtype)
    if op in ("amax", "amin"):  # NaN and inf are exact there
        flat = x.view(-1)
        for i, v in enumerate(specials):
            flat[(seed * (i + 7)) % flat.numel()] = v
    if op == "any":
        x = torch.where(torch.rand(shape) < 0.01, x, torch.zeros((), dtype=dtype))

    def f(x):
        y = x * 2 if producer else x
        if dims is None:
            return (
                getattr(torch, op)(y) if op != "amax" and op != "amin" else getattr(torch, op)(y, list(range(x.dim())))
            )
        return getattr(torch, op)(y, dims, keepdim=keepdim)

    with mock.patch.multiple(sr, **SMALL):
        gm, notes, count = split(f, x)
    assert count == 1, (notes, gm.code)
    got, want = gm(x), f(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    extent = x.numel() // max(want.numel(), 1)
    _close(got, want, op, dtype, extent)


@pytest.mark.parametrize(
    ("shape", "dims", "column"),
    [((4096, 32), [0], True), ((4, 4096), [-1], False), ((4, 64, 32), [1], True)],
    ids=["columns", "rows", "middle"],
)
def test_stage_one_is_one_kernel_with_its_producers(small, shape, dims, column):
    """Split, ``(x * y + 1).sum(dims)`` of bfloat16 runs as two generated kernels and no aten call: stage 1 takes the
    pointwise ops, the view and the reduction to float32 partials; stage 2 the partials' sum and the cast."""
    x, y = torch.randn(shape, dtype=torch.bfloat16), torch.randn(shape, dtype=torch.bfloat16)

    def f(x, y):
        return (x * y + 1).sum(dims)

    gm, notes, count = split(f, x, y)
    assert count == 1 and ("columns" in notes[0][3]) == column, notes
    compiled = compile_graph(gm, aten_inputs(Fn(f), (x, y)))
    assert compiled.num_kernels == 2 and compiled.library_calls == 0, compiled.report
    first = {n.target for n in compiled.kernels[0].region.nodes}
    assert {aten.mul.Tensor, aten.add.Tensor, aten.view.default, aten.sum.dim_IntList} <= first, first
    torch.testing.assert_close(compiled(x, y), f(x, y), rtol=1.6e-2, atol=1e-1)


def test_the_split_reads_a_view_of_s_chunks(small):
    """The rewrite's shape: (75, 17).sum(0) of bfloat16 -> view (S, 75/S, 17), float32, sum(1), sum(0), bf16."""
    x = torch.randn(75, 17, dtype=torch.bfloat16)
    gm, notes, _ = split(lambda x: x.sum(0), x)
    stage1, stage2 = reductions(gm)
    upcast = stage1.args[0]
    assert upcast.target is torch.ops.prims.convert_element_type.default and upcast.args[1] == torch.float32
    view = upcast.args[0]
    s = view.args[1][0]
    assert view.target is aten.view.default and view.args[1] == [s, 75 // s, 17] and 75 % s == 0
    assert stage1.args[1] == [1]
    assert stage2.args[1] == [0] and stage2.meta["val"].dtype == torch.float32
    assert f"S = {s}" in notes[0][3]
    out = next(iter(gm.graph.find_nodes(op="output"))).args[0]
    assert out.meta["val"].dtype == torch.bfloat16 and tuple(out.meta["val"].shape) == (17,)


def test_splits_follow_the_table(monkeypatch):
    """S: the smallest divisor giving the target, within the chunk and partial limits; None without a divisor."""
    assert sr.splits_for(262144, 64, column=False) == 16  # 64 rows -> 1024 stage-1 rows
    assert sr.splits_for(1 << 20, 16, column=False) == 64
    assert sr.splits_for(65536, 64, column=True) == 64  # 1024 columns: 4096 groups of 16
    assert sr.splits_for(8192, 256, column=True) == 16  # chunks of 512: a looped column walk
    assert sr.splits_for(8192, 256, column=True, target=sr.TARGET_WIDE_COLUMN_PROGRAMS) == 4  # a half sum's tile
    assert sr.splits_for(65537, 4, column=False) is None  # a prime extent: no view splits it
    assert sr.splits_for(3 * 65521, 1, column=False) == 3  # the only divisor in range


def test_a_half_sum_takes_fewer_splits_for_its_wider_tile(small, monkeypatch):
    """A column sum whose stage 1 reads 2-byte floats (a bf16 input, or one cast to float32 first: the issue's
    ``x.float().sum(0)``) splits for TARGET_WIDE_COLUMN_PROGRAMS; a float32 input or an amax for TARGET_COLUMN_PROGRAMS
    (the two tiles of rows.py, swept on an H200)."""
    monkeypatch.setattr(sr, "TARGET_WIDE_COLUMN_PROGRAMS", 32)  # SMALL's 128 for the narrow tile: S = 4 against 16
    x = torch.randn(256, 32)
    half = x.to(torch.bfloat16)
    splits = {}
    for name, f, arg in [("bf16", lambda x: x.sum(0), half), ("float", lambda x: x.float().sum(0), half),
                         ("view", lambda x: x.float().view(4, 64, 32).sum([0, 1]), half),
                         ("fp32", lambda x: x.sum(0), x), ("amax", lambda x: x.amax(0), half)]:  # fmt: skip
        gm, notes, count = split(f, arg)
        assert count == 1, notes
        view = next(n for n in gm.graph.nodes if n.target is aten.view.default and "split_reduction" in n.meta)
        splits[name] = view.args[1][0]
    assert splits == {"bf16": 16, "float": 16, "view": 16, "fp32": 64, "amax": 64}, splits


def _refusal(f, *xs):
    gm, notes, count = split(f, *xs)
    assert count == 0 and len(notes) == 1, notes
    return notes[0][3]


def test_refusals_are_noted_with_their_reason(small):
    """What is not split says why: var (Chan's partials, or cancellation), integer sums, reduced dims that are not
    adjacent or not one extent in memory, a layout the generator would read scattered, an extent with no divisor."""
    x = torch.randn(4, 96)
    assert "Chan" in _refusal(lambda x: x.var(-1), x)
    assert "floats only" in _refusal(lambda x: x.sum(-1), torch.randint(0, 9, (4, 96)))
    assert "not adjacent" in _refusal(lambda x: x.sum([0, 2]), torch.randn(8, 3, 16))
    base = torch.randn(16, 8, 32)
    assert "without a copy" in _refusal(lambda b: b[:, :7].sum([0, 1]), base)  # rows 7 of 8: no one extent
    assert "scattered" in _refusal(lambda x: x.sum(0), torch.randn(96, 3))  # 3 columns: no whole sectors
    assert "no divisor" in _refusal(lambda x: x.sum(-1), torch.randn(2, 97))  # 97 is prime


@pytest.mark.parametrize("op", ["sum", "mean", "amax"])
def test_dims_one_extent_in_memory_order_are_split_through_a_permute(small, op):
    """ViT's bias gradients: ``g.sum([0, 1])`` of a (batch, seq, d) gradient laid out (seq, batch, d) is no
    extent in the tensor's order but one in its memory's: permuted to it, viewed as (S, L/S, d), split, with
    eager's values. A permute that would reorder the kept dims is not taken."""
    base = torch.randn(24, 8, 32, dtype=torch.float64)  # (seq, batch, d) in memory

    def f(b):
        return getattr(torch, op)(b.transpose(0, 1) * 2, [0, 1])

    gm, notes, count = split(f, base)
    assert count == 1 and "split" == notes[0][2], notes
    permute = next(n for n in gm.graph.nodes if n.target is aten.permute.default and n.args[0].name != "arg0_1")
    assert permute.args[1] == [1, 0, 2], gm.code
    torch.testing.assert_close(gm(base), f(base), rtol=1e-12, atol=1e-12)
    x = torch.randn(4, 8, 8, 16, dtype=torch.float64).permute(3, 2, 1, 0)  # memory order D, C, B, A: kept A, D swap
    assert "without a copy" in _refusal(lambda x: (x * 2).sum([1, 2]), x)
    x, y = (torch.randn(512, 8, 32, dtype=torch.bfloat16).transpose(0, 1) for _ in range(2))  # stage 1 generated

    def g(x, y):
        return (x * y + 1).sum([0, 1])

    gm, notes, count = split(g, x, y)
    compiled = compile_graph(gm, aten_inputs(Fn(g), (x, y)))
    assert count == 1 and compiled.num_kernels == 2 and compiled.library_calls == 0, compiled.report
    torch.testing.assert_close(compiled(x, y), g(x, y), rtol=1.6e-2, atol=2e-1)


def test_nothing_to_split_is_left_alone(small):
    """Many outputs, or a short extent: no rewrite and no note (each kernel fills the GPU already)."""
    for f, x in [(lambda x: x.sum(-1), torch.randn(2048, 64)), (lambda x: x.sum(-1), torch.randn(4, 32))]:
        gm, notes, count = split(f, x)
        assert count == 0 and notes == [] and len(reductions(gm)) == 1


def test_only_cuda_graphs_by_default(small, monkeypatch):
    """The gate: on a CPU graph the pass splits nothing and says why (the C renderer walks a row at memory speed)."""
    monkeypatch.setattr(sr, "ON_CPU", False)
    assert "the C renderer" in _refusal(lambda x: x.sum(-1), torch.randn(4, 96))


def test_the_backend_runs_the_pass(small, monkeypatch):
    """As a Pass in the backend's list: the option ``split_reductions`` (on by default), its notes in the report,
    eager's values; off with ``options={"split_reductions": False}``."""
    monkeypatch.setattr(backend, "PASSES", [*backend.PASSES, sr.SPLIT_REDUCTIONS])
    backend.reset()
    f = lambda x: (x * 2).sum(0)  # noqa: E731
    x = torch.randn(96, 16)
    torch.testing.assert_close(torch.compile(f, backend="fusion")(x), f(x))
    notes = [p for part in backend.reports[0].parts for p in part.passes if p[0] == "split reductions"]
    assert notes and notes[0][2] == "split", notes
    backend.reset()
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, backend="fusion", options={"split_reductions": False})(x), f(x))
    assert not [p for part in backend.reports[0].parts for p in part.passes if p[0] == "split reductions"]
    backend.reset()
    assert sr.SPLIT_REDUCTIONS.name == "split_reductions" and sr.SPLIT_REDUCTIONS.default
    assert sr.SPLIT_REDUCTIONS.requires == ("codegen",)


@pytest.mark.parametrize("op", ["sum", "amax"])
def test_a_lone_half_reduction_is_split_into_two_kernels(small, op):
    """``x.sum(0)`` of bfloat16 with nothing before it: stage 1 reads the view through an exact upcast, two ops that
    Phase 6 makes a region, so both stages are generated kernels (a lone reduction would be an aten call)."""
    x = torch.randn(4096, 32, dtype=torch.bfloat16)

    def f(x):
        return getattr(torch, op)(x, [0])

    gm, _, count = split(f, x)
    compiled = compile_graph(gm, aten_inputs(Fn(f), (x,)))
    assert count == 1 and compiled.num_kernels == 2 and compiled.library_calls == 0, compiled.report
    torch.testing.assert_close(compiled(x), f(x), rtol=1.6e-2, atol=1e-1)


@pytest.mark.parametrize("op", ["sum", "amax", "mean"])
@pytest.mark.parametrize("shape, dim", [((4096, 32), 0), ((3, 4096), -1)])
def test_a_lone_float32_reductions_stages_are_kernels_of_their_own(small, op, shape, dim):
    """``x.sum(0)`` of float32 with nothing before it: each stage is one op, which Phase 6 leaves to aten; the pass
    marks both for a kernel of their own (``lone_kernels``), so no aten reduction runs, columns or rows."""
    x = torch.randn(shape)

    def f(x):
        return getattr(torch, op)(x, [dim])

    gm, _, count = split(f, x)
    compiled = compile_graph(gm, aten_inputs(Fn(f), (x,)))
    assert count == 1 and compiled.num_kernels == 2 and compiled.library_calls == 0, compiled.report
    _close(compiled(x), f(x), op, torch.float32, shape[dim])


def test_a_column_of_long_column_extent_is_split_whatever_produces_it(small, monkeypatch):
    """Columns of LONG_COLUMN_EXTENT rows or more are split, a lone float32 sum too: both stages are kernels of
    their own (``lone_kernels``), never aten reductions; shorter columns are left whole."""
    monkeypatch.setattr(sr, "LONG_COLUMN_EXTENT", 128)
    x = torch.randn(128, 32)
    assert split(lambda x: x.sum(0), x)[2] == 1  # float32, nothing before it
    assert split(lambda x: (x * 2).sum(0), x)[2] == 1  # a pointwise producer
    assert split(lambda x: x.sum(0), x.to(torch.bfloat16))[2] == 1  # a half input
    assert split(lambda x: x.view(4, 32, 32).sum([0, 1]), x)[2] == 1  # a view of an input
    assert split(lambda x: x.sum(0), torch.randn(96, 32))[2] == 0  # short: left whole
    gm, _, _ = split(lambda x: x.sum(0), x)
    compiled = compile_graph(gm, aten_inputs(Fn(lambda x: x.sum(0)), (x,)))
    assert compiled.num_kernels == 2 and compiled.library_calls == 0, compiled.report
    torch.testing.assert_close(compiled(x), x.sum(0), rtol=1e-5, atol=1e-5)


def test_a_training_step_keeps_eagers_gradients(small, monkeypatch):
    """In a backward graph (AOTAutograd's): a Linear's bias gradient and a LayerNorm's weight and bias gradients are
    sums over 256 rows of 32 columns, split; the gradients stay eager's."""
    monkeypatch.setattr(backend, "PASSES", [*backend.PASSES, sr.SPLIT_REDUCTIONS])
    backend.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.LayerNorm(32))
    x = torch.randn(256, 32)
    model(x).square().sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.compile(model, backend="fusion")(x).square().sum().backward()
    for got, ref in zip((p.grad for p in model.parameters()), want, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    splits = [p for r in backend.reports for part in r.parts for p in part.passes if p[2] == "split"]
    assert len(splits) >= 2, [p for r in backend.reports for part in r.parts for p in part.passes]
    backend.reset()


def test_a_layernorm_gradients_split_stages_are_two_kernels(small):
    """GPT-2's LayerNorm backward under bfloat16 autocast: the incoming gradient is a GEMM's output cast to float32,
    read by the row sums of the input gradient and by the weight and bias gradients' column sums, both split. Both
    stage-1 sums are one kernel (with the cast), both stage-2 sums another: before, the cast and the bias gradient's
    stage 1 were cut into kernels of one op (aten calls), each stage 2 one more. Gradients equal eager's."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.ln, self.b = torch.nn.Linear(32, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 32)

        def forward(self, x):
            return self.b(self.ln(self.a(x) + x))

    def step(model, compiled):
        torch._dynamo.reset()
        backend.reset()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = (torch.compile(model, backend="fusion") if compiled else model)(x)
        y.float().square().sum().backward()
        return [p.grad for p in model.parameters()]

    torch.manual_seed(0)
    model, x = Block(), torch.randn(4, 64, 32)
    want = step(copy.deepcopy(model), False)
    got = step(model, True)
    part = backend.reports[0].parts[-1]
    assert part.kind == "backward" and not part.fallbacks, part
    assert part.library_calls["sum"] == 0, part.library_calls  # every sum generated
    pairs = [
        k for k in part.kernels if sum("split_reduction" in n.meta for n in k.region.nodes if n.target in sr.SUMS) == 2
    ]
    assert len(pairs) == 2, [[n.name for n in k.region.nodes] for k in part.kernels]  # stage 1s, stage 2s
    for name, g, w in zip(("a.weight", "a.bias", "ln.weight", "ln.bias", "b.weight", "b.bias"), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2, msg=name)
    backend.reset()
