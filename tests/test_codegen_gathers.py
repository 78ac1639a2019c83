"""Phase 8: indexed reads inside generated kernels (``fusion.compiler.lower_gathers``): ``embedding``, ``index``,
``index_select`` and ``gather`` as one load at a position the kernel reads, against eager PyTorch.

CPU kernels run with the generator tests' renderer (tests/conftest.py); the smoke cases taking ``renderer`` run with
both. Every index out of range raises ``IndexError`` as eager does, never reads outside the table."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from test_codegen import _rand, check, fewer

from fusion.compiler import memory_plan
from fusion.ir import kernel_ir as ir
from fusion.kernels import ir_loops
from fusion.kernels import triton_runtime as rt

pytestmark = [
    pytest.mark.phase8,
    pytest.mark.skipif(not rt.triton_status()[0], reason="Triton is not installed"),
]


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """An exception other than Unsupported is a generator bug: here it fails the test instead of falling back."""
    monkeypatch.setenv("FUSION_STRICT", "1")


def _ids(shape, low, high, seed, dtype=torch.int64):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def gathers(compiled) -> list[ir.Load]:
    """The indexed loads of every kernel a compiled module launches."""
    kernels = [lch.owner.plan.ir for lch in compiled.compiled.launchers]
    return [s for k in kernels for s in k.statements() if isinstance(s, ir.Load) and s.indirect]


# ----------------------------------------------------------------------------------------------------------------------
# Each op, drawn shapes: one kernel with the op after it, eager's values exactly


@fewer(10)
@given(
    table=st.tuples(st.integers(1, 9), st.integers(0, 7)),
    ids=st.lists(st.integers(0, 4), min_size=0, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16]),
    int32=st.booleans(),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_embedding_is_a_load_in_the_kernel_that_reads_it(table, ids, dtype, int32, transposed, seed):
    """An embedding's rows read inside the kernel of the op after it (any table layout, int32 or int64 ids, ids of
    0-3 dims with size-0 and size-1 dims, a table row of 0 elements): eager's values exactly."""
    rows, width = table
    weight = _rand((width, rows), seed, dtype).t() if transposed else _rand(table, seed, dtype)
    i = _ids(tuple(ids), 0, rows, seed, torch.int32 if int32 else torch.int64)
    c = check(lambda w, i: F.embedding(i, w) * 2 + 1, weight, i)
    if c.num_kernels:
        assert gathers(c), c.report.table()


@st.composite
def index_cases(draw):
    """(x, indices): x of 1-3 dims; a random set of its leading dims indexed (next to each other or not, None
    between), index tensors that broadcast together, values in [-size, size) (negative ones count from the end)."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    seed = draw(st.integers(0, 2**16))
    x = _rand(shape, seed)
    if rank > 1 and draw(st.booleans()):
        x = x.transpose(0, -1).contiguous().transpose(0, -1)
    length = draw(st.integers(1, rank))
    chosen = draw(st.lists(st.booleans(), min_size=length, max_size=length).filter(any))
    common = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    indices = []
    for d, use in enumerate(chosen):
        if not use:
            indices.append(None)
            continue
        own = tuple(1 if draw(st.booleans()) else s for s in common)[-draw(st.integers(1, len(common))) :]
        indices.append(_ids(own, -shape[d], shape[d], seed + d))
    return x, indices


@fewer(12)
@given(case=index_cases())
def test_index_reads_where_eager_reads(case):
    """``x[i]``, ``x[:, i]``, ``x[i, :, j]`` (index tensors apart: their dims first), broadcast index tensors,
    negative indices counted from the end, non-contiguous ``x``: one kernel with the op after it."""
    x, indices = case
    given_ = [i for i in indices if i is not None]

    def pure(x, *g):
        it = iter(g)
        return torch.ops.aten.index.Tensor(x, [None if i is None else next(it) for i in indices]) * 3

    want = x[tuple(slice(None) if i is None else i for i in indices)] * 3
    torch.testing.assert_close(pure(x, *given_), want)
    c = check(pure, x, *given_, kernels=1)
    assert gathers(c), c.report.table()


@fewer(10)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    k=st.integers(0, 6),
    dim=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_index_select_and_gather(shape, k, dim, seed):
    """``index_select`` (k positions, 0 allowed) and ``gather`` (an index of the output's shape, at most the input's
    size in every other dim) along any dim."""
    dim %= len(shape)
    x = _rand(tuple(shape), seed, torch.float64)
    picks = _ids((k,), 0, shape[dim], seed)
    check(lambda x, i: torch.index_select(x, dim, i).exp(), x, picks)
    out = [min(s, 2) if d != dim else k + 1 for d, s in enumerate(shape)]
    where = _ids(tuple(out), 0, shape[dim], seed + 1)
    c = check(lambda x, i: torch.gather(x, dim, i) - 1, x, where, kernels=1)
    assert gathers(c), c.report.table()


# ----------------------------------------------------------------------------------------------------------------------
# Where it pays: the gather inside the kernel around it


def test_embeddings_summed_and_normalized_are_one_kernel(renderer):
    """BERT's embeddings: word, position (a buffer's slice, expanded) and token type rows summed, then LayerNorm: one
    kernel reads the three tables at the ids."""
    word, pos, kind = _rand((30, 16), 0), _rand((12, 16), 1), _rand((2, 16), 2)
    ids, types = _ids((2, 7), 0, 30, 3), _ids((2, 7), 0, 2, 4)
    positions = torch.arange(12).unsqueeze(0)

    def embed(word, pos, kind, ids, types, positions):
        p = positions[:, : ids.shape[1]].expand(ids.shape[0], -1)
        x = F.embedding(ids, word) + F.embedding(types, kind) + F.embedding(p, pos)
        return F.layer_norm(x, (16,))

    c = check(embed, word, pos, kind, ids, types, positions, kernels=1)
    assert len(gathers(c)) >= 3, c.report.table()


def test_a_relative_position_bias_is_gathered_inside_the_softmax(renderer):
    """Swin's attention: ``table[index]`` viewed, permuted and made contiguous, added to the scores, softmax: one
    kernel (the bias is never stored)."""
    scores, table, index = _rand((2, 3, 7, 7), 0), _rand((13, 3), 1), _ids((49,), 0, 13, 2)

    def attend(scores, table, index):
        bias = table[index].view(7, 7, 3).permute(2, 0, 1).contiguous().unsqueeze(0)
        return (scores + bias).softmax(-1)

    check(attend, scores, table, index, kernels=1)


def test_a_gathered_tensor_computed_in_the_region_is_stored_by_a_kernel_before():
    """``(w * 2 + 1)[i]``: a value computed in the kernel cannot be read at a run-time position; the region is split
    there, a first kernel stores it and the second gathers from it (no aten call), eager's values."""
    w, i = _rand((6, 4), 0), _ids((5,), 0, 6, 1)
    c = check(lambda w, i: ((w * 2 + 1)[i] - 1).relu(), w, i, kernels=2)
    assert not c.report.skipped, c.report.table()
    assert gathers(c), c.report.table()


# ----------------------------------------------------------------------------------------------------------------------
# Out of range: eager's IndexError, on both renderers


@pytest.mark.parametrize(
    "case",
    ["embedding id past the table", "embedding id -1", "index below -size", "index at size", "gather -1"],
)
def test_an_index_out_of_range_raises_index_error(renderer, case):
    """A kernel with indexed reads checks each index (eager raises ``IndexError`` on the same input; the kernel
    never reads outside the table); in-range calls before and after give eager's values."""
    x, ids = _rand((5, 4), 0), _ids((3, 2), 0, 5, 1)
    bad = ids.clone()
    fn = {
        "embedding id past the table": (lambda x, i: F.embedding(i, x) * 2, 5),
        "embedding id -1": (lambda x, i: F.embedding(i, x) * 2, -1),
        "index below -size": (lambda x, i: x[i] + 1, -6),
        "index at size": (lambda x, i: x[i] + 1, 5),
        "gather -1": (lambda x, i: torch.gather(x, 0, i) + 1, -1),
    }[case]
    f, value = fn
    bad[1, 1] = value
    c = check(f, x, ids, kernels=1)
    with pytest.raises(IndexError, match="out of range"):
        c(x, bad)
    torch.testing.assert_close(c(x, ids), f(x, ids))


def test_the_triton_source_checks_its_indices():
    """The Triton kernel asserts each index lies in its dim (compiled with ``debug=True``: Triton runs
    ``device_assert`` only then) and reads at 0 where it does not."""
    from support import Fn

    from fusion.codegen import compile_regions

    c = compile_regions(Fn(lambda w, i: F.embedding(i, w) * 2), [_rand((5, 4), 0), _ids((3,), 0, 5, 1)])
    source = c.kernels[0].source
    assert "@triton.jit(debug=True)" in source and "tl.device_assert" in source and "tl.where" in source, source


# ----------------------------------------------------------------------------------------------------------------------
# The loop passes and the memory plan see the index value


def _load(out, idx, buffer="in0"):
    return ir.Load(out, buffer, ir.Affine(((1, ir.Var("r0")),)), "float32", None, ((idx, 5, 4),))


def test_cse_and_hoisting_see_the_index_of_an_indexed_load():
    """Two indexed loads at the same affine offset but different index values are two values (cse keeps both); one
    whose index varies along the reduce loop is not hoisted out of it."""
    i0 = ir.Load("a", "in1", ir.Affine(((1, ir.Var("r0")),)), "int64")
    i1 = ir.Load("b", "in1", ir.Affine(((1, ir.Var("r0")),), 3), "int64")
    body = (ir.ReduceLoop((i0, i1, _load("t0", "a"), _load("t1", "b"), ir.Op("t2", "add", ("t0", "t1"), "float32"),
                           ir.Reduce("s", "sum", "t2", "float32"))),)  # fmt: skip
    k = ir.Kernel("k", "reduction", (), (), (ir.Loop("r0", 4),), body)
    assert sum(isinstance(s, ir.Load) and bool(s.indirect) for s in ir_loops.cse(k).statements()) == 2
    hoisted, kept = ir_loops.invariant(list(body[0].body), {"r0"})
    assert not hoisted and len(kept) == len(body[0].body)
    fixed = ir.Load("c", "in1", ir.Affine((), 2), "int64")
    hoisted, _ = ir_loops.invariant([fixed, ir.Load("t3", "in0", ir.Affine(), "float32", None, (("c", 5, 4),))], {"r0"})
    assert len(hoisted) == 2  # an index the loop does not change: the load moves with it


def test_an_output_is_never_written_over_a_table_read_at_computed_positions():
    """memory_plan.writable_over: a table read at positions the kernel computes may be read after its element was
    written, so its memory is never reused for the output."""
    idx = ir.Load("a", "in1", ir.Affine(((1, ir.Var("x0")),)), "int64")
    load = ir.Load("t0", "in0", ir.Affine(((1, ir.Var("x0")),)), "float32", None, (("a", 5, 0),))
    store = ir.Store("out0", ir.Affine(((1, ir.Var("x0")),)), "t0")
    k = ir.Kernel("k", "pointwise", (), (ir.Loop("x0", 5),), (), (idx, load, store))
    assert not memory_plan.writable_over(k, "in0", "out0")
    direct = ir.Load("t0", "in0", ir.Affine(((1, ir.Var("x0")),)), "float32")
    assert memory_plan.writable_over(dataclasses.replace(k, body=(direct, store)), "in0", "out0")


# ----------------------------------------------------------------------------------------------------------------------
# On a GPU: the same kernels compiled by Triton (debug=True: the index checks are device_asserts)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gathers_on_cuda_inside_the_kernels_around_them(dtype):
    """BERT's summed embeddings and Swin's gathered bias inside its softmax, compiled for the GPU: one kernel each,
    eager's values."""
    word, pos = _rand((30, 16), 0, dtype).cuda(), _rand((12, 16), 1, dtype).cuda()
    ids = _ids((2, 7), 0, 30, 3).cuda()
    positions = torch.arange(12, device="cuda").unsqueeze(0)

    def embed(word, pos, ids, positions):
        p = positions[:, : ids.shape[1]].expand(ids.shape[0], -1)
        return F.layer_norm(F.embedding(ids, word) + F.embedding(p, pos), (16,))

    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    check(embed, word, pos, ids, positions, kernels=1, **tol)
    scores, table, index = _rand((2, 3, 7, 7), 0, dtype).cuda(), _rand((13, 3), 1, dtype).cuda(), _ids((49,), 0, 13, 2)

    def attend(scores, table, index):
        bias = table[index].view(7, 7, 3).permute(2, 0, 1).contiguous().unsqueeze(0)
        return (scores + bias).softmax(-1)

    check(attend, scores, table, index.cuda(), kernels=1, **tol)


@cuda
def test_an_index_out_of_range_on_cuda_stops_at_a_device_assert():
    """On a GPU the check is Triton's ``device_assert`` (eager's index kernels assert the same way): the process's
    CUDA context reports it, so it runs in a subprocess."""
    script = (
        "import torch, torch.nn.functional as F\n"
        "import fusion.codegen\n"
        "from fusion.codegen import compile_regions\n"
        "from support import Fn\n"
        "w = torch.randn(5, 4, device='cuda'); i = torch.tensor([0, 1, 7], device='cuda')\n"
        "c = compile_regions(Fn(lambda w, i: F.embedding(i, w) * 2), [w, i.clamp(0, 4)])\n"
        "c(w, i); torch.cuda.synchronize()\n"
    )
    here = Path(__file__).parent
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=here.parent, env={**os.environ, "PYTHONPATH": f"{here.parent}:{here}"})  # fmt: skip
    assert run.returncode != 0 and "index out of range" in run.stderr + run.stdout, (run.stdout, run.stderr[-2000:])


def test_a_gather_broadcast_over_many_rows_is_stored_once(renderer):
    """Swin's bias over 8 windows: each gathered element would be read 8 times (two dependent loads each), so a first
    kernel gathers it and stores it contiguous (the copy after the gather), and the softmax kernel reads it as a plain
    input; nothing runs as aten; eager's values."""
    scores, table, index = _rand((8, 3, 7, 7), 0), _rand((13, 3), 1), _ids((49,), 0, 13, 2)

    def attend(scores, table, index):
        bias = table[index].view(7, 7, 3).permute(2, 0, 1).contiguous().unsqueeze(0)
        return (scores + bias).softmax(-1)

    c = check(attend, scores, table, index, kernels=2)
    assert c.library_calls == 0, c.report.table()
    softmax = [lch.owner.plan.ir for lch in c.compiled.launchers if lch.owner.plan.ir.kind == "reduction"]
    assert len(softmax) == 1 and not any(isinstance(s, ir.Load) and s.indirect for s in softmax[0].statements()), [
        k.source for k in c.kernels
    ]


def test_gathered_ids_read_by_an_embedding_stay_in_its_kernel():
    """BERT's token types: a buffer gathered at the positions, then the ids of an embedding. Each gathered id is read
    once per hidden element (broadcast), but it is an index, not a value: it stays in the kernel (storing it would
    cost a launch), unlike a broadcast bias."""
    kind, word = _rand((2, 16), 0), _rand((30, 16), 1)
    types, ids, positions = _ids((1, 12), 0, 2, 2), _ids((3, 7), 0, 30, 3), _ids((3, 7), 0, 12, 4)

    def embed(kind, word, types, ids, positions):
        t = torch.gather(types.expand(ids.shape[0], -1), 1, positions)
        return F.layer_norm(F.embedding(ids, word) + F.embedding(t, kind), (16,))

    c = check(embed, kind, word, types, ids, positions, kernels=1)
    assert len(gathers(c)) >= 3, c.report.table()
