"""Pass ``stack_scatters`` (fusion/compiler/scatter_passes.py): the backward of attention's packed in-projection sums
one select_scatter into zeros per piece, Llama's rotate_half one slice_scatter per half; the pass writes that sum as
one cat, and only where it is one. Pass ``index_put_sums``: an accumulating index_put into a small table (Swin's
relative-position bias gradient) as one masked sum."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support import library_calls

from fusion import backend
from fusion.compiler import driver
from fusion.compiler.scatter_passes import stack_select_scatters

pytestmark = pytest.mark.phase9
aten = torch.ops.aten


class Block(nn.Module):
    """ViT's encoder block head: LayerNorm, then nn.MultiheadAttention's packed q/k/v projection."""

    def __init__(self, d: int = 48, heads: int = 3) -> None:
        super().__init__()
        self.ln, self.att = nn.LayerNorm(d), nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, x):
        y = self.ln(x)
        return x + self.att(y, y, y, need_weights=False)[0]


def _step(options, dtype):
    torch.manual_seed(0)
    model = Block().to(dtype)
    x = torch.randn(3, 7, 48, dtype=dtype, requires_grad=True)
    backend.reset()
    compiled = torch.compile(model, backend="fusion", options=options)
    out = compiled(x)
    out.square().sum().backward()
    grads = [x.grad, *(p.grad for p in model.parameters())]
    calls = library_calls()
    notes = [n for r in driver.reports for p in r.parts for n in p.passes if n[0] == "stack select_scatters"]
    return out.detach(), grads, calls, notes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_packed_projections_gradient_is_one_stack_and_keeps_eagers_values(dtype):
    torch.manual_seed(0)
    ref = Block().to(dtype)
    x = torch.randn(3, 7, 48, dtype=dtype, requires_grad=True)
    out = ref(x)
    out.square().sum().backward()
    want = [out.detach(), x.grad, *(p.grad for p in ref.parameters())]

    got, grads, calls, notes = _step(None, dtype)
    assert notes and notes[0][2] == "rewritten", notes
    assert calls["select_scatter"] == 0, calls
    for g, w in zip([got, *grads], want, strict=True):
        torch.testing.assert_close(g, w)
    off, off_grads, off_calls, off_notes = _step({"stack_scatters": False}, dtype)
    assert not off_notes and off_calls["select_scatter"] == 3, off_calls
    for g, w in zip([off, *off_grads], want, strict=True):
        torch.testing.assert_close(g, w)


def _graph(cover, base_value=0.0, alpha=None):
    """sum over ``cover`` of select_scatter(full((3, 4, 5), base_value), piece_i, 0, i), the pieces placeholders."""
    g = fx.Graph()
    pieces = [g.placeholder(f"p{i}") for i in range(len(cover))]
    for p in pieces:
        p.meta["val"] = torch.empty(4, 5, dtype=torch.float64)
    full = g.call_function(aten.full.default, ([3, 4, 5], base_value), {"dtype": torch.float64})
    full.meta["val"] = torch.empty(3, 4, 5, dtype=torch.float64)
    total = None
    for i, p in zip(cover, pieces, strict=True):
        s = g.call_function(aten.select_scatter.default, (full, p, 0, i))
        s.meta["val"] = torch.empty(3, 4, 5, dtype=torch.float64)
        kwargs = {"alpha": alpha} if alpha is not None and total is not None else {}
        total = s if total is None else g.call_function(aten.add.Tensor, (total, s), kwargs)
        total.meta["val"] = torch.empty(3, 4, 5, dtype=torch.float64)
    g.output(total)
    return fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize(
    "cover, base, alpha, rewritten",
    [
        ((2, 0, 1), 0.0, None, True),  # every index once, in any order
        ((-1, 0, 1), 0, None, True),  # a negative index
        ((0, 1), 0.0, None, False),  # index 2 written by none: zeros there
        ((0, 1, 1), 0.0, None, False),  # index 1 twice: a sum, not a stack
        ((0, 1, 2), 1.0, None, False),  # a base of ones
        ((0, 1, 2), 0.0, 2, False),  # alpha scales a piece
    ],
)
def test_only_a_sum_that_is_a_stack_is_rewritten(cover, base, alpha, rewritten):
    gm = _graph(cover, base, alpha)
    pieces = [torch.randn(4, 5, dtype=torch.float64) for _ in cover]
    want = gm(*pieces)
    count = stack_select_scatters(gm, lambda *a: None)
    assert count == (1 if rewritten else 0)
    targets = {n.target for n in gm.graph.nodes}
    assert (aten.cat.default in targets) == rewritten and (aten.select_scatter.default in targets) != rewritten
    torch.testing.assert_close(gm(*pieces), want, atol=0, rtol=0)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def test_rotate_halfs_gradient_is_one_cat_and_keeps_eagers_values():
    """Llama's rotary embedding: q * cos + rotate_half(q) * sin. Its backward's two slice_scatters into zeros (and
    the neg of a half) become one cat inside a generated kernel; float64, so the values are eager's exactly."""
    q = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)

    def f(q):
        return (q * cos + _rotate_half(q) * sin).square().sum()

    f(q).backward()
    want, q.grad = q.grad, None
    for options, scatters in ((None, 0), ({"stack_scatters": False}, 2)):
        backend.reset()
        torch.compile(f, backend="fusion", options=options)(q).backward()
        calls = backend.reports[0].part("backward").library_calls
        assert calls.get("slice_scatter", 0) == scatters and (scatters or calls.get("neg", 0) == 0), calls
        torch.testing.assert_close(q.grad, want, atol=0, rtol=0)
        q.grad = None


def _slices(spans, size=8):
    """sum over ``spans`` of slice_scatter(zeros((3, size)), piece, 1, lo, hi), the pieces placeholders."""
    g = fx.Graph()
    total = None
    full = g.call_function(aten.full.default, ([3, size], 0.0), {"dtype": torch.float64})
    full.meta["val"] = torch.empty(3, size, dtype=torch.float64)
    for k, (lo, hi) in enumerate(spans):
        p = g.placeholder(f"p{k}")
        width = len(range(size)[slice(lo, hi)])
        p.meta["val"] = torch.empty(3, width, dtype=torch.float64)
        s = g.call_function(aten.slice_scatter.default, (full, p, 1, lo, hi))
        s.meta["val"] = torch.empty(3, size, dtype=torch.float64)
        total = s if total is None else g.call_function(aten.add.Tensor, (total, s))
        total.meta["val"] = torch.empty(3, size, dtype=torch.float64)
    g.output(total)
    return fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize(
    "spans, rewritten",
    [
        (((4, 9223372036854775807), (0, 4)), True),  # rotate_half's two halves, the end as the backward writes it
        (((0, 3), (3, 5), (-3, None)), True),  # three pieces, a negative start and an open end
        (((0, 3), (4, 8)), False),  # a gap at 3
        (((0, 5), (4, 8)), False),  # an overlap at 4
    ],
)
def test_only_slices_that_tile_the_dim_are_rewritten(spans, rewritten):
    gm = _slices(spans)
    pieces = [torch.randn(*n.meta["val"].shape, dtype=torch.float64) for n in gm.graph.nodes if n.op == "placeholder"]
    want = gm(*pieces)
    assert stack_select_scatters(gm, lambda *a: None) == (1 if rewritten else 0)
    torch.testing.assert_close(gm(*pieces), want, atol=0, rtol=0)


def _merge(x):
    """Swin's patch merging: the four 2x2 offsets of an (B, H, W, C) map side by side."""
    parts = [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]]
    return torch.cat(parts, -1)


@pytest.mark.parametrize("shape", [(2, 6, 8, 3), (1, 2, 2, 1)])
def test_patch_mergings_gradient_is_woven_back_and_keeps_eagers_values(shape):
    """The backward of the patch merging's step-2 slices is a step-2 slice_scatter of a step-2 slice_scatter per
    offset, summed: the pass weaves the four pieces back (cat and view per dim), float64 values exactly eager's."""
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4 * shape[-1], 5, dtype=torch.float64)

    def f(x):
        return (_merge(x) @ w).square().sum()

    f(x).backward()
    want, x.grad = x.grad, None
    for options, scatters in ((None, 0), ({"stack_scatters": False}, 8)):
        backend.reset()
        torch.compile(f, backend="fusion", options=options)(x).backward()
        calls = backend.reports[0].part("backward").library_calls
        assert calls.get("slice_scatter", 0) == scatters, calls
        torch.testing.assert_close(x.grad, want, atol=0, rtol=0)
        x.grad = None


@pytest.mark.parametrize(
    "offsets, rewritten", [((0, 1, 2), True), ((2, 0, 1), True), ((0, 2), False), ((0, 1, 1), False)]
)
def test_only_strided_pieces_covering_every_offset_are_woven(offsets, rewritten):
    g = fx.Graph()
    full = g.call_function(aten.full.default, ([2, 9], 0.0), {"dtype": torch.float64})
    full.meta["val"] = torch.empty(2, 9, dtype=torch.float64)
    total, pieces = None, []
    for k, o in enumerate(offsets):
        p = g.placeholder(f"p{k}")
        p.meta["val"] = torch.empty(2, 3, dtype=torch.float64)
        pieces.append(torch.randn(2, 3, dtype=torch.float64))
        s = g.call_function(aten.slice_scatter.default, (full, p, 1, o, 9223372036854775807, 3))
        s.meta["val"] = torch.empty(2, 9, dtype=torch.float64)
        total = s if total is None else g.call_function(aten.add.Tensor, (total, s))
        total.meta["val"] = torch.empty(2, 9, dtype=torch.float64)
    g.output(total)
    gm = fx.GraphModule(torch.nn.Module(), g)
    want = gm(*pieces)
    assert stack_select_scatters(gm, lambda *a: None) == (1 if rewritten else 0)
    torch.testing.assert_close(gm(*pieces), want, atol=0, rtol=0)


class RelativeBias(nn.Module):
    """Swin's relative-position bias: a (rows, heads) table gathered at an index buffer, added to the scores. Its
    gradient is ``index_put(zeros, [index], grad, accumulate=True)`` (pass ``index_put_sums``)."""

    def __init__(self, rows: int, heads: int, index: torch.Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(
            torch.randn(rows, heads, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        )
        self.register_buffer("index", index)

    def forward(self, scores):  # scores: (batch, heads, n)
        return scores + self.table[self.index].permute(1, 0)


def _bias_step(monkeypatch, rows, heads, index, scores):
    from fusion.compiler import scatter_passes

    monkeypatch.setattr(scatter_passes, "ON_CPU", True)
    backend.reset()
    model = RelativeBias(rows, heads, index)
    out = torch.compile(model, backend="fusion")(scores)
    (out * out).sum().backward()
    calls = library_calls()
    return model.table.grad, calls


@settings(max_examples=8, deadline=None)
@given(
    rows=st.integers(1, 9),
    heads=st.integers(1, 4),
    n=st.integers(1, 40),
    negative=st.booleans(),
    special=st.sampled_from([None, float("nan"), float("inf")]),
    seed=st.integers(0, 2**16),
)
@example(rows=5, heads=3, n=25, negative=False, special=None, seed=0)
@example(rows=2, heads=1, n=6, negative=True, special=None, seed=27914)  # gcc's kernel crashed: c_runtime's red zone
def test_an_accumulating_index_put_into_a_small_table_is_one_masked_sum(rows, heads, n, negative, special, seed):
    """The table's gradient as eager's (float64: the same sums in another order), repeated and negative indices and
    NaN/inf among the values included, with no ``index_put`` left: one generated kernel computes it."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        g = torch.Generator().manual_seed(seed)
        index = torch.randint(0, rows, (n,), generator=g)
        if negative:
            index = index - rows  # -rows..-1: eager reads (and accumulates into) row index + rows
        scores = torch.randn(2, heads, n, dtype=torch.float64, generator=g)
        if special is not None:
            scores[0, 0, n // 2] = special
        got, calls = _bias_step(monkeypatch, rows, heads, index, scores.clone())
        ref = RelativeBias(rows, heads, index)
        out = ref(scores.clone())
        (out * out).sum().backward()
        torch.testing.assert_close(got, ref.table.grad, rtol=1e-12, atol=1e-12, equal_nan=True)
        assert "index_put" not in calls, calls
    finally:
        monkeypatch.undo()


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize(
    "index, device",
    [([0, 4, -1, 4], "cpu"), ([0, 1, 7], "cpu"), ([-6, 0], "cpu"), pytest.param([0, 4, -1, 4], "cuda", marks=CUDA)],
)
def test_an_index_put_sum_checks_its_indices_as_eager(monkeypatch, index, device):
    """An accumulating index_put written in a model (no gather before it to check the index first): in range, eager's
    values from one generated kernel; an index outside the table (7, or -6 of 5 rows) raises IndexError as eager
    does (the masked sum reads the index through a checked gather), never a row dropped. On a GPU the in-range case
    (an index out of range there is a device assert, which ends the process's CUDA context)."""
    from fusion.compiler import scatter_passes

    monkeypatch.setattr(scatter_passes, "ON_CPU", True)

    def f(values, index):
        zeros = torch.zeros(5, 3, dtype=values.dtype, device=values.device)
        return zeros.index_put((index,), values.t(), accumulate=True) * 2.0

    values = torch.randn(3, len(index), dtype=torch.float64, generator=torch.Generator().manual_seed(3)).to(device)
    index = torch.tensor(index, device=device)
    backend.reset()
    compiled = torch.compile(f, backend="fusion")
    if all(-5 <= i < 5 for i in index.tolist()):
        torch.testing.assert_close(compiled(values, index), f(values, index), rtol=1e-12, atol=1e-12)
        (part,) = [p for r in driver.reports for p in r.parts]
        assert not part.library_calls and len(part.kernels) == 1, (part.library_calls, part.kernels)
    else:
        with pytest.raises(IndexError):
            f(values, index)
        with pytest.raises(IndexError):
            compiled(values, index)


def _index_put_node(base, index, values, accumulate=True) -> fx.Node:
    g = fx.Graph()
    b, i, v = (g.placeholder(name) for name in "biv")
    b.meta["val"], i.meta["val"], v.meta["val"] = base, index, values
    node = g.call_function(aten.index_put.default, (b, [i], v, accumulate))
    node.meta["val"] = base.index_put([index], values, accumulate)
    return node


@pytest.mark.parametrize(
    "case, why",
    [
        ("accepted", None),
        ("store", "not accumulating"),
        ("half", "eager accumulates half types in the half type"),
        ("big", "over the masked sum's size limits"),
        ("mask", "a mask or a grid of indices"),
        ("broadcast", "broadcast values"),
        ("rows apart", "the sum would read the positions scattered"),
        ("cpu", "on cpu"),
    ],
)
def test_only_small_float_tables_on_a_gpu_are_rewritten(monkeypatch, case, why):
    """The refusals, each with its reason: a store (not a sum), half types (eager rounds each addition to the half
    type), tables over the size limits, a boolean mask, broadcast values, values whose positions lie apart in
    memory, and CPU graphs (aten's loop reads each value once)."""
    from fusion.compiler import scatter_passes

    monkeypatch.setattr(scatter_passes, "ON_CPU", case != "cpu")
    base, index, values = torch.zeros(5, 3), torch.tensor([0, 4, 2, 2]), torch.zeros(3, 4).t()
    if case == "half":
        base, values = base.half(), values.half()
    elif case == "big":
        base = torch.zeros(5000, 3)
    elif case == "mask":
        index, values = torch.tensor([True, False, True, False, True]), torch.zeros(3, 3).t()
    elif case == "broadcast":
        values = torch.zeros(1, 3)
    elif case == "rows apart":
        values = torch.zeros(4, 3)  # each position's 3 values together: the masked sum would stride over them
    node = _index_put_node(base, index, values, accumulate=case != "store")
    got = scatter_passes.index_put_refusal(node)
    assert (got is None) if why is None else (why in (got or "")), got


class Embedded(nn.Module):
    """An embedding (optionally with a padding row) and a linear head: the step's table gradient is an
    ``embedding_dense_backward`` in the backward graph."""

    def __init__(self, rows: int, d: int, padding_idx: int | None, scale: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(rows, d, padding_idx=padding_idx, scale_grad_by_freq=scale)
        self.head = nn.Linear(d, 3)

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


def _embedding_step(monkeypatch, model, ids, options):
    from fusion.compiler import embedding_grads

    monkeypatch.setattr(embedding_grads, "ON_CPU", True)
    backend.reset()
    out = torch.compile(model, backend="fusion", options=options)(ids)
    (out * out).sum().backward()
    notes = [line for r in driver.reports for p in r.parts if p.graph is not None
             for line in p.graph.graph_module.meta.get("embedding_grads", [])]  # fmt: skip
    code = "".join(p.graph.code for r in driver.reports for p in r.parts if p.graph is not None)
    return model.emb.weight.grad, notes, code


@settings(max_examples=8, deadline=None)
@given(
    rows=st.integers(1, 12),
    d=st.integers(1, 9),
    shape=st.sampled_from([(7,), (2, 5), (3, 1, 4), (0,), (1,)]),
    padding=st.sampled_from([None, 0, -1, "last"]),
    seed=st.integers(0, 2**16),
)
@example(rows=4, d=3, shape=(2, 5), padding=0, seed=0)
def test_an_embeddings_gradient_as_zeros_and_one_index_add_keeps_eagers_values(rows, d, shape, padding, seed):
    """With pass ``embedding_grads`` on, the table's gradient is eager's (float64: the same sums, in another order),
    repeated indices, empty and one-element batches and every kind of padding row included (``padding_idx=-1`` names
    the last row, as eager reads it); the backward calls ``embedding_grad``, not ATen's kernel."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        padding_idx = rows - 1 if padding == "last" else padding
        if padding_idx is not None and padding_idx < -rows:
            padding_idx = None
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, rows, shape, generator=g)
        torch.manual_seed(seed)
        ref = Embedded(rows, d, padding_idx).double()
        model = Embedded(rows, d, padding_idx).double()
        model.load_state_dict(ref.state_dict())
        out = ref(ids)
        (out * out).sum().backward()
        got, notes, code = _embedding_step(monkeypatch, model, ids, {"embedding_grads": True})
        torch.testing.assert_close(got, ref.emb.weight.grad, rtol=1e-12, atol=1e-12)
        assert notes and all(n.endswith("rewritten") for n in notes), notes
        assert "embedding_dense_backward.default(" not in code and "embedding_grads_embedding_grad(" in code, code
    finally:
        monkeypatch.undo()


def test_the_embedding_pass_is_off_by_default_and_keeps_atens_kernel_then(monkeypatch):
    """Opt-in until measured on a GPU: by default the backward calls ATen's ``embedding_dense_backward``."""
    torch.manual_seed(0)
    model = Embedded(6, 4, None).double()
    _, notes, code = _embedding_step(monkeypatch, model, torch.tensor([[1, 2, 2], [5, 0, 1]]), None)
    assert not notes and "embedding_dense_backward.default(" in code and "embedding_grad(" not in code, (notes, code)


def test_embedding_grad_takes_atens_kernel_under_deterministic_algorithms(monkeypatch):
    """Atomic adds have no fixed order: under ``torch.use_deterministic_algorithms(True)`` the call is ATen's
    kernel (no ``index_add_``), with eager's values; otherwise one ``index_add_``."""
    from fusion.compiler.embedding_grads import embedding_grad

    grad, ids = torch.randn(2, 3, 4, dtype=torch.float64), torch.tensor([[0, 2, 2], [4, 0, 1]])
    want = aten.embedding_dense_backward.default(grad, ids, 5, 2, False)
    used = []
    plain = torch.Tensor.index_add_
    monkeypatch.setattr(torch.Tensor, "index_add_", lambda self, *a: used.append(1) or plain(self, *a))
    torch.testing.assert_close(embedding_grad(grad, ids, 5, 2), want, rtol=1e-12, atol=1e-12)
    assert used == [1]
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        torch.testing.assert_close(embedding_grad(grad, ids, 5, 2), want, rtol=0, atol=0)
    finally:
        torch.use_deterministic_algorithms(before)
    assert used == [1], "index_add_ ran under deterministic algorithms"


@pytest.mark.parametrize(
    "case, why",
    [
        ("accepted", None),
        ("cpu", "on cpu"),
        ("scale", "scale_grad_by_freq"),
        ("half", "eager sums it in float32"),
        ("crowded", "the sort's way"),
    ],
)
def test_only_float_embeddings_on_a_gpu_without_crowded_rows_are_rewritten(monkeypatch, case, why):
    """The refusals, each with its reason: CPU graphs, ``scale_grad_by_freq``, half-type gradients (eager sums in
    float32), and more than ``MAX_PER_ROW`` indices a row (atomic adds on one address wait for each other)."""
    from fusion.compiler import embedding_grads

    monkeypatch.setattr(embedding_grads, "ON_CPU", case != "cpu")
    rows, n = (2, 2 * embedding_grads.MAX_PER_ROW + 1) if case == "crowded" else (5, 7)
    grad = torch.zeros(n, 3, dtype=torch.half if case == "half" else torch.float32)
    ids = torch.zeros(n, dtype=torch.int64)
    g = fx.Graph()
    a, b = g.placeholder("grad"), g.placeholder("ids")
    a.meta["val"], b.meta["val"] = grad, ids
    node = g.call_function(aten.embedding_dense_backward.default, (a, b, rows, -1, case == "scale"))
    got = embedding_grads.refusal(node)
    assert (got is None) if why is None else (why in (got or "")), got
