"""The Triton renderer of the kernel IR (issue 37): kernel IR -> Triton source (fusion.kernels.triton_render, with
Phase 8's ``triton_expr`` and ``split_index``), launched from data alone, here in Triton's interpreter, against eager
and against the C renderer of the same IR (fusion.kernels.c_render). The regions come from Phase 6's builder and the
ops are spelled by Phase 8's learner, so the file is Phase 8's (skipped while their TODOs are)."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from hypothesis import given, settings
from hypothesis import strategies as st
from support import Fn

from fusion.codegen import compile_regions, generate_kernel, split_index, triton_expr
from fusion.compiler import random_ops
from fusion.compiler.lowering import Lowering
from fusion.ir import kernel_ir as ir
from fusion.kernels import c_runtime, ir_loops, triton_launch, triton_render
from fusion.kernels import triton_runtime as rt
from fusion.regions import aten_inputs, build_fusion_regions, capture_aten, unique_regions

pytestmark = [
    pytest.mark.phase8,  # the regions come from Phase 6's builder and Phase 8's generator (the learner's code)
    pytest.mark.skipif(not rt.triton_status()[0], reason="Triton is not installed"),
]
HAS_CC = c_runtime.available()[0]


def _values(gm: fx.GraphModule, args) -> dict[fx.Node, object]:
    """Every node's eager value."""
    env: dict[fx.Node, object] = {}

    class Record(fx.Interpreter):
        def run_node(self, n):
            env[n] = out = super().run_node(n)
            return out

    Record(gm).run(*args)
    return env


def render(kernel: ir.Kernel) -> tuple[str, triton_launch.Launch]:
    """The Triton source of ``kernel`` and its launch facts, the ops spelled by Phase 8's ``triton_expr``."""
    return triton_render.render(kernel, triton_expr, split_index)


class IRKernel:
    """``kernel`` rendered to Triton, launched in the interpreter on the IR's buffers in call order (inputs, then
    outputs) with the grid and blocks of its launch facts; every load and store checked in bounds (interp_check)."""

    def __init__(self, kernel: ir.Kernel) -> None:
        self.kernel = kernel
        self.source, self.launch = render(kernel)

    def __call__(self, *tensors: torch.Tensor) -> None:
        assert len(tensors) == len(self.kernel.buffers), (len(tensors), self.kernel.describe())
        for b, t in zip(self.kernel.buffers, tensors, strict=True):
            assert (tuple(t.shape), str(t.dtype).removeprefix("torch.")) == (b.sizes, b.dtype), (b, t.shape, t.dtype)
        grid, constexprs = self.launch.launch_config(False)
        if grid > 0:
            fn = rt.load_kernel(self.source, self.kernel.name, interpret=True)
            fn[(grid,)](*tensors, num_warps=self.launch.num_warps, **constexprs)


def rendered(fn, *inputs, exact_c: bool = False, kernels: int | None = None):
    """Each region of ``fn`` lowered to the kernel IR, rendered to Triton and run in the interpreter on the eager
    values of its inputs: every stored value equals eager's, and the C renderer's of the same IR (bit for bit with
    ``exact_c``). Returns [(kernel, IRKernel, outputs)]."""
    model = Fn(fn)
    gm = capture_aten(model, inputs)
    env = _values(gm, aten_inputs(model, inputs))
    out = []
    for r in unique_regions(build_fusion_regions(gm)):
        low = Lowering(r)
        kernel = low.kernel(f"k_ir{r.index}")
        args = [env[n] for n in low.inputs]
        want = [env[n] for n in low.stored]
        outs = [torch.empty_strided(w.shape, w.stride(), dtype=w.dtype) for w in want]
        k = IRKernel(kernel)
        k(*args, *outs)
        for got, w in zip(outs, want, strict=True):
            torch.testing.assert_close(got, w, equal_nan=True, msg=lambda m: f"{m}\n{k.source}")  # noqa: B023
        if HAS_CC:
            c_outs = [torch.empty_strided(w.shape, w.stride(), dtype=w.dtype) for w in want]
            c_runtime.compile_kernel(kernel)(*args, *c_outs)
            for got, c in zip(outs, c_outs, strict=True):
                if exact_c:
                    assert torch.equal(got.view(-1).view(torch.uint8), c.view(-1).view(torch.uint8)), (got, c)
                else:
                    torch.testing.assert_close(got, c, equal_nan=True)
        out.append((kernel, k, outs))
    assert kernels is None or len(out) == kernels, [k.describe() for k, _, _ in out]
    return out


def _r(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ----------------------------------------------------------------------------------------------------------------------
# Pointwise kernels


POINTWISE = {
    "broadcast": (lambda x, b: (x * 2 + b).relu(), (_r(5, 7), _r(7, seed=1))),
    "transposed": (lambda x, y: x.t() * y + 1, (_r(6, 4), _r(4, 6, seed=1))),
    "sliced": (lambda x: (x[:, 1::2] * 3).exp() - x[:, 0:8:2], (_r(5, 9),)),
    "split_flat": (lambda x: (x * 2).reshape(4, 6, 10).permute(0, 2, 1).reshape(40, 6) + 1, (_r(24, 10),)),
    "size_one": (lambda x, y: (x + y) * y, (_r(3, 1, 4), _r(1, 5, 1, seed=1))),
    "channels_last": (lambda x: (x * 2).sigmoid() + x, (_r(2, 3, 4, 5).to(memory_format=torch.channels_last),)),
    "reshape": (lambda x: (x * 2).reshape(4, 6, 10).permute(0, 2, 1) + 1, (_r(24, 10),)),
    "zero_dim": (lambda x, s: x * s + s.exp(), (_r(5), torch.tensor(1.5))),
    "math": (lambda x: torch.tanh(x * 1e-3) * 1e3 + torch.erf(x) + x.abs().sqrt().rsqrt() + x.sin() * x.cos(), (_r(40),)),
    "pow": (lambda x: x.abs() ** 1.7 + x**3 + x ** -2, (_r(33),)),
    "where_clamp": (lambda x, y: torch.where(x > y, x.clamp(-0.5, 0.5), y.clamp_min(0.1)), (_r(6, 5), _r(5, seed=1))),
}  # fmt: skip


@pytest.mark.parametrize("case", POINTWISE)
def test_pointwise_kernels_equal_eager_and_c(case):
    fn, inputs = POINTWISE[case]
    for kernel, k, _ in rendered(fn, *inputs):
        assert kernel.kind == "pointwise" and k.launch.kind == "pointwise"
        assert "xmask = xindex < " in k.source and "@triton.jit" in k.source


DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
DTYPES += [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype(dtype):
    g = torch.Generator().manual_seed(3)
    if dtype == torch.bool:
        a, b = torch.rand(7, 6, generator=g) > 0.5, torch.rand(6, generator=g) > 0.5
        rendered(lambda a, b: ((a + b) * torch.logical_not(a)) + (a & b), a, b, exact_c=True)
        return
    if dtype.is_floating_point:
        a, b = _r(7, 6, seed=3, dtype=dtype), _r(6, seed=4, dtype=dtype)
    else:
        lo = 0 if dtype == torch.uint8 else -9
        a, b = torch.randint(lo, 10, (7, 6), generator=g).to(dtype), torch.randint(lo, 10, (6,), generator=g).to(dtype)
    rendered(lambda a, b: torch.maximum(a * b, b) - torch.minimum(a, b + 1), a, b, exact_c=not dtype.is_floating_point)
    rendered(lambda a, b: (a > b).to(dtype) + (a.float() * 2.5).to(dtype), a, b)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.float64], ids=str)
def test_division_and_remainder_have_torchs_signs(dtype):
    g = torch.Generator().manual_seed(5)
    a = torch.randint(-60, 60, (97,), generator=g).to(dtype)
    b = (torch.randint(1, 9, (97,), generator=g) * (torch.randint(0, 2, (97,), generator=g) * 2 - 1)).to(dtype)
    if dtype.is_floating_point:
        a = a + torch.rand(97, generator=g, dtype=dtype)

    def fn(a, b):
        out = (torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b), torch.div(a, b, rounding_mode="trunc"))
        return tuple(o * 1 for o in out) + (
            (a.sign() * 2, a.trunc() + a.floor() + a.ceil()) if a.is_floating_point() else ()
        )

    rendered(fn, a, b, exact_c=True)


def test_cat_loads_each_input_under_its_mask():
    a, b, c = _r(3, 4), _r(3, 5, seed=1), _r(3, 2, seed=2)
    ((kernel, k, _),) = rendered(lambda a, b, c: torch.cat([a * 2, b.exp(), c], 1) + 1, a, b, c)
    assert any(isinstance(s, ir.Load) and s.mask for s in kernel.statements())
    assert "other=0" in k.source
    rendered(lambda a, b: torch.cat([a, b], 0).relu() * 3, _r(2, 5), _r(4, 5, seed=1))


@settings(max_examples=6, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.data())
def test_broadcast_shapes(shape, data):
    other = [data.draw(st.sampled_from([1, s])) for s in shape[data.draw(st.integers(0, len(shape))) :]]
    x, y = _r(*shape), _r(*other, seed=1)
    rendered(lambda x, y: (x - y) * (x + 1.5), x, y)


# ----------------------------------------------------------------------------------------------------------------------
# Reductions


def test_row_reductions_in_one_block():
    x, w = _r(8, 33), _r(33, seed=1)
    for kernel, k, _ in rendered(lambda x: torch.softmax(x * 0.5, -1), x, kernels=1):
        assert kernel.kind == "reduction" and not k.launch.looped and k.launch.rblock == 64
    rendered(lambda x, w: torch.nn.functional.layer_norm(x, (33,), w) + x, x, w, kernels=1)
    rendered(lambda x: torch.var_mean(x, -1, keepdim=True)[0] * x.mean(-1, keepdim=True), x)


def test_looped_rows_fold_blocks_and_compute_again():
    x = _r(3, 17000)
    ((kernel, k, _),) = rendered(lambda x: torch.softmax(x, -1), x)
    assert k.launch.looped and k.launch.rblock == triton_launch.MAX_RBLOCK // 4
    assert k.source.count("for roffset in range(0, 17000, RBLOCK):") == 3, k.source  # max, sum, the stores
    rendered(lambda x: (x * x).sum(-1) + x.amax(-1), x)


def test_streaming_loads_leave_l2_first():
    """In a reduction kernel, a load each program reads its own elements of, once, is ``evict_first`` (Inductor's
    rule); a weight every row reads again, or a row a looped kernel reads in each of its loops, keeps the default."""

    def loads(source: str, buffer: str) -> list[str]:
        return [ln for ln in source.splitlines() if f"tl.load({buffer} +" in ln]

    ((kernel, k, _),) = rendered(lambda x: (x * 2).sum(-1), _r(8, 33))
    assert all("evict_first" in ln for ln in loads(k.source, "in0")), k.source
    ((_, k, _),) = rendered(lambda x: (x * 2).sum(0), _r(64, 48))  # a column walk: its own columns, once
    assert all("evict_first" in ln for ln in loads(k.source, "in0")), k.source
    x, w = _r(8, 33), _r(33, seed=1)
    ((kernel, k, _),) = rendered(lambda x, w: torch.nn.functional.layer_norm(x, (33,), w), x, w)
    weight = kernel.buffers[1].name
    assert loads(k.source, weight) and not any("evict" in ln for ln in loads(k.source, weight)), k.source
    ((_, k, _),) = rendered(lambda x: torch.softmax(x, -1), _r(3, 17000))  # read again in each of three loops
    assert "evict" not in k.source, k.source
    ((_, k, _),) = rendered(lambda x: (x * 2).exp(), _r(8, 33))  # a pointwise kernel: the default everywhere
    assert "evict" not in k.source, k.source


def test_column_reductions_walk_neighbouring_rows():
    for fn, x in ((lambda x: (x * 2).sum(0), _r(64, 48)), (lambda x: x.sum([0, 1]) * 3, _r(2, 6, 24))):
        ((kernel, k, _),) = rendered(fn, x)
        assert k.launch.column and k.launch.min_xblock == 16, kernel.describe()
    ((_, k, _),) = rendered(lambda x: (x * 2).sum(0), _r(600, 20))  # long columns: a loop of short blocks
    assert k.launch.column and k.launch.looped and k.launch.rblock == 64


def test_a_looped_reductions_independent_walks_are_one_loop(monkeypatch):
    """A looped walk reads memory again: walks that need nothing of each other are one loop (``ir_loops.one_walk``).
    A bias gradient's sum and the values it sums stored (GELU's backward), a LayerNorm's weight and bias gradients
    and its input gradient: one loop over the row, each input loaded once in it. A walk that reads a fold (softmax's
    sum, then its stores) stays apart; ``JOIN_WALKS = False`` renders one loop a walk. Eager's values every time."""

    def loops(k) -> int:
        return k.source.count("for roffset in range(")

    x, g, w = (_r(*shape, seed=i, dtype=torch.float64) for i, shape in enumerate([(600, 20), (600, 20), (20,)]))

    def gelu_grad(x, g):
        y = g * (0.5 * (1 + torch.erf(x * 0.7071067811865476)) + x * torch.exp(-0.5 * x * x) * 0.3989422804014327)
        return y, y.sum(0)

    def ln_grads(x, g, w):
        d = g * w
        return (d * x).sum(0), d.sum(0), d + x

    for fn, args in ((gelu_grad, (x, g)), (ln_grads, (x, g, w))):
        ((kernel, k, _),) = rendered(fn, *args)
        assert k.launch.looped and k.launch.column and loops(k) == 1, k.source
        assert k.source.count("tl.load(in0 +") == 1, k.source  # one load of x in the joined loop
        monkeypatch.setattr(triton_launch, "JOIN_WALKS", False)
        assert loops(IRKernel(kernel)) > 1
        monkeypatch.setattr(triton_launch, "JOIN_WALKS", True)
    ((_, k, _),) = rendered(lambda x: torch.softmax(x, 0), x)  # each walk reads the fold before it
    assert k.launch.looped and loops(k) == 3, k.source


def test_the_wide_column_tile_holds_one_fold_a_walk(monkeypatch):
    """A looped column walk of half inputs takes the wide tile (``rows.WIDE_COLUMN_LOOP_*``) for one sum a walk;
    sibling sums joined into one walk (a LayerNorm's weight and bias gradients) take the 64 x 64 tile, as they did
    the wide one with a walk each (``JOIN_WALKS = False``). Eager's values."""
    x, g = (_r(600, 32, seed=i, dtype=torch.bfloat16) for i in range(2))

    def one(x, g):
        return (g * x).sum(0)

    def siblings(x, g):
        d = g * 2
        return (d * x).sum(0), d.sum(0), d + x

    wide, narrow = triton_launch.WIDE_COLUMN_LOOP_RBLOCK, triton_launch.COLUMN_LOOP_RBLOCK
    ((_, k, _),) = rendered(one, x, g)
    assert k.launch.column and k.launch.looped and k.launch.rblock == wide, k.launch
    ((kernel, k, _),) = rendered(siblings, x, g)
    assert k.launch.column and k.launch.looped and k.launch.rblock == narrow and k.launch.elements == 0, k.launch
    monkeypatch.setattr(triton_launch, "JOIN_WALKS", False)
    assert triton_launch.launch_facts(kernel).rblock == wide


def test_a_column_walk_that_stores_its_values_takes_the_narrow_tile_when_asked(monkeypatch):
    """GELU's backward with its bias gradient: the values summed are stored too. The wide tile by default (one sum a
    walk), the 64 x 64 tile with ``NARROW_STORING_WALKS``, and a plain sum keeps the wide one either way. Eager's
    values with either tile."""
    x, g = (_r(600, 32, seed=i, dtype=torch.bfloat16) for i in range(2))

    def storing(x, g):
        d = g * torch.sigmoid(x)
        return d, d.sum(0)

    def plain(x, g):
        return (g * x).sum(0)

    wide, narrow = triton_launch.WIDE_COLUMN_LOOP_RBLOCK, triton_launch.COLUMN_LOOP_RBLOCK
    ((kernel, k, _),) = rendered(storing, x, g)
    assert k.launch.column and k.launch.looped and k.launch.rblock == wide, k.launch
    ((plain_kernel, _, _),) = rendered(plain, x, g)
    monkeypatch.setattr(triton_launch, "NARROW_STORING_WALKS", True)
    assert triton_launch.launch_facts(kernel).rblock == narrow
    assert triton_launch.launch_facts(kernel).elements == 0
    assert triton_launch.launch_facts(plain_kernel).rblock == wide
    ((_, k, _),) = rendered(storing, x, g)  # rendered and run with the narrow tile: eager's values
    assert k.launch.rblock == narrow, k.launch


def test_a_cats_columns_side_by_side_are_a_column_walk(monkeypatch):
    """Three inputs stacked and packed side by side along the contiguous dim, summed over the rows (attention's
    packed q/k/v bias gradient): each input is read at ``x % 16``, contiguous 16 columns at a time, so the kernel
    walks columns, 16 or more neighbouring ones a program, not one scattered row a program (as with
    ``COLUMNS_THROUGH_MOD = False``); runs of 12 columns are too short for whole sectors. Eager's values (float64:
    the C renderer's sums, added in another order, agree to its precision)."""

    def packed(a, b, c):
        n, d = a.shape
        y = torch.cat([a * 2, b, c + 1], 0).view(3, n, d).permute(1, 0, 2).reshape(n, 3 * d)
        return y, y.sum(0)

    ((kernel, k, _),) = rendered(packed, *(_r(600, 16, seed=i, dtype=torch.float64) for i in range(3)))
    assert any(isinstance(a, ir.Mod) for s in kernel.statements() if isinstance(s, ir.Load) for _, a in s.offset.terms)
    assert k.launch.column and k.launch.min_xblock == 16, kernel.describe()
    assert k.source.count("for roffset in range(") == 1, k.source
    monkeypatch.setattr(triton_launch, "COLUMNS_THROUGH_MOD", False)
    assert not triton_launch.launch_facts(kernel).column
    monkeypatch.setattr(triton_launch, "COLUMNS_THROUGH_MOD", True)
    ((kernel, k, _),) = rendered(packed, *(_r(600, 12, seed=i, dtype=torch.float64) for i in range(3)))
    assert not k.launch.column, kernel.describe()


@settings(max_examples=4, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=3), st.data())
def test_reductions_over_drawn_dims(shape, data):
    """Any reduced dims (trailing, leading, middle) of a drawn shape, transposed or not: the rows the IR walks."""
    dims = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True))
    x = _r(*shape)
    if len(shape) >= 2 and data.draw(st.booleans()):
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    rendered(lambda x: ((x * 2).sum(dims, keepdim=True) + (x - 1).amax(dims, keepdim=True)) * x, x)


@pytest.mark.parametrize("n", [7, 300])
def test_sum_max_min_propagate_nan(n):
    x = _r(5, n)
    x[1, 3], x[2, 0], x[3, n - 1] = float("nan"), float("inf"), float("-inf")
    x[4] = -0.0
    outs = rendered(lambda x: (x.sum(-1), x.amax(-1), x.amin(-1)), x)
    assert all(o.isnan().any() for _, _, res in outs for o in res)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_values_are_rounded_as_eager(dtype):
    a, b, c = (_r(9, 31, seed=i, dtype=dtype) for i in range(3))
    rendered(lambda a, b, c: (a * b + c).exp() * a - b, a, b, c, exact_c=True)
    rendered(lambda a: torch.softmax(a, -1) * a, a)


# ----------------------------------------------------------------------------------------------------------------------
# rand and fma


def test_rand_is_the_c_renderers_and_tl_rand_bit_for_bit():
    seeds, shape = torch.tensor([3, 2**62 + 987654321], dtype=torch.int64), (6, 37)

    def fn(seeds, x):
        return torch.ops.fusion.philox_rand(seeds[1:2], list(shape)) + x

    ((_, _, (got,)),) = rendered(fn, seeds, torch.zeros(shape), exact_c=True)
    assert torch.equal(got, random_ops.philox_rand_reference(seeds[1:2], list(shape)))
    ((_, _, (col,)),) = rendered(lambda s, x: fn(s, x).sum(0), seeds, torch.zeros(shape))  # a permuted walk
    torch.testing.assert_close(col, got.sum(0))
    big = torch.zeros(4096)
    ((_, _, (u,)),) = rendered(lambda s, x: torch.ops.fusion.philox_rand(s[1:2], [4096]) + x, seeds, big)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 6 * (1 / 12 / 4096) ** 0.5


def test_fma_rounds_once():
    from torch._inductor import inductor_prims  # noqa: F401  (registers prims.fma)

    a, b, c = _r(64), _r(64, seed=1), _r(64, seed=2)
    a[0] = b[0] = 1 + 2**-12
    c[0] = -1.0
    ((kernel, k, (got,)),) = rendered(lambda a, b, c: torch.ops.prims.fma(a, b, c) * 2.0, a, b, c, exact_c=True)
    assert "tl.fma(" in k.source and got[0].item() == (2**-11 + 2**-24) * 2


# ----------------------------------------------------------------------------------------------------------------------
# Transposed walks


@settings(max_examples=12, deadline=None)
@given(
    b=st.integers(1, 3),
    m=st.sampled_from([1, 5, 15, 16, 17, 40, 64, 65, 96, 130]),
    n=st.sampled_from([1, 5, 15, 16, 17, 40, 64, 65, 128, 192]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    scaled=st.booleans(),
)
def test_a_transposed_copy_is_walked_in_tiles(b, m, n, dtype, scaled):
    """``x.transpose(1, 2).contiguous()`` (T5's key before its batched GEMM): walked in the output's order, each lane
    of a warp would read its own sector, so the walk is tiles of rows (along which the input is contiguous) by lanes
    (along which the output is), the innermost loop split into TILE_LANES blocks where it is longer. Where both
    loops are TILE_MIN long or more (the lanes at most TILE_LANES or a multiple) it is tiled; either way every value
    is eager's and the C renderer's of the same IR, bit for bit (a copy and a multiply round the same)."""
    x, w = _r(b, m, n, dtype=dtype), _r(m, seed=1, dtype=dtype)

    def fn(x, w):
        t = x.transpose(1, 2).contiguous()
        return t * w if scaled else t * 2

    kernels = rendered(fn, x, w, exact_c=True)
    if not kernels:  # a transpose of a size-1 dim is a view: one multiply, which Phase 6 leaves to aten
        assert min(m, n) == 1
        return
    ((kernel, k, _),) = kernels
    lanes_ok = m <= ir_loops.TILE_LANES or m % ir_loops.TILE_LANES == 0
    assert k.launch.tiled == (min(m, n) >= ir_loops.TILE_MIN and lanes_ok), (k.launch, kernel.describe())
    if k.launch.tiled:
        assert k.launch.rblock <= ir_loops.TILE_LANES and "[:, None]" in k.source, k.source


def test_tiles_keep_a_broadcast_operand_and_refuse_a_gathered_walk():
    """A tiled walk reads a lane-wise operand (a bias along the output's rows) at its lanes only; a walk whose input
    is already contiguous along the output's lanes is the plain one; a pointwise kernel with a gathered load is
    never tiled (its index is computed per element)."""
    x, bias = _r(2, 128, 80), _r(128, seed=1)
    ((_, k, _),) = rendered(lambda x, bias: x.transpose(1, 2).contiguous() + bias, x, bias)
    assert k.launch.tiled and k.launch.rnumel == ir_loops.TILE_LANES, k.source
    ((_, k, _),) = rendered(lambda x: (x * 2).exp(), x)  # read in its own order: the plain walk
    assert not k.launch.tiled
    table, idx = _r(64, 80), torch.randint(0, 64, (2, 96))
    for _, k, _ in rendered(lambda t, i: t[i].transpose(1, 2).contiguous() * 2, table, idx):
        assert not k.launch.tiled


# ----------------------------------------------------------------------------------------------------------------------
# Launch facts, wide offsets, the runtime's choice


@pytest.mark.parametrize(
    "fn, x",
    [
        (lambda x: (x * 2).relu() + 1, _r(33, 70)),
        (lambda x: torch.softmax(x, -1), _r(40, 33)),
        (lambda x: torch.softmax(x, -1), torch.empty(128, 20000)),
        (lambda x: (x * 2).sum(0), _r(64, 48)),
        (lambda x: (x * 2).sum(0), torch.empty(300, 2048)),
        (lambda x: (x * 2).mean((2, 3)), torch.empty(4, 64, 7, 7).to(memory_format=torch.channels_last)),
        (lambda x: x.transpose(1, 2).contiguous() * 2, torch.empty(3, 200, 96)),  # a transposed walk: tiles
        (lambda x: x.mT.contiguous() * 2, torch.empty(5000, 40)),
    ],
)
def test_the_plans_launch_facts_are_the_renderers(fn, x):
    """The block sizes, grid and warps a generated kernel launches with (``KernelPlan.launch_config``) are those the
    Triton renderer read off its kernel IR (``triton_launch.launch_facts``), on a GPU and in the interpreter."""
    (region,) = unique_regions(build_fusion_regions(capture_aten(Fn(fn), (x,))))
    plan = generate_kernel(region)
    assert plan.ir is not None and plan.ir.name == plan.kernel.name
    launch = triton_launch.launch_facts(plan.ir)
    for device in (torch.device("cuda"), torch.device("cpu")):
        assert launch.launch_config(device.type == "cuda") == plan.launch_config(device), device
    assert launch.num_warps == plan.num_warps and (launch.kind == "pointwise" and not launch.tiled) == bool(plan.xnumel)
    if launch.kind == "reduction" or launch.tiled:
        assert (launch.rblock, launch.min_xblock) == (plan.constexprs["RBLOCK"], plan.min_xblock)


def test_index_source_parenthesises_each_floor_division_and_remainder():
    a, b = ir.Var("a"), ir.Var("b")
    inner = ir.Affine(((1, a), (3, b)), 1)
    e = ir.Affine(((2, ir.FloorDiv(inner, 4)), (1, ir.Mod(inner, 5)), (7, b)), 2)
    for va in range(6):
        for vb in range(6):
            want = 2 * ((va + 3 * vb + 1) // 4) + (va + 3 * vb + 1) % 5 + 7 * vb + 2
            assert eval(triton_render.index_source(e), {"a": va, "b": vb}) == want  # noqa: S307


def test_offsets_past_two_to_the_31_are_int64():
    at = ir.Affine(((2**30, ir.Var("x0")), (1, ir.Var("x1"))))
    buffers = (ir.Buffer("in0", (3, 2**30), (2**30, 1), "float32"),
               ir.Buffer("out0", (3, 2**30), (2**30, 1), "float32", output=True))  # fmt: skip
    body = (ir.Load("t0", "in0", at, "float32"), ir.Store("out0", at, "t0"))
    big = ir.Kernel("k_big", "pointwise", buffers, (ir.Loop("x0", 3), ir.Loop("x1", 2**30)), (), body)
    source, _ = render(big)
    assert "tl.program_id(0).to(tl.int64)" in source
    small, _ = render(rendered(lambda x: x * 2 + 1, _r(5))[0][0])
    assert "tl.program_id(0).to(tl.int64)" not in small
    empty = triton_launch.Launch("k_empty", "pointwise", 0)  # an empty output: no program is launched
    assert empty.launch_config(True)[0] == empty.launch_config(False)[0] == 0


def _compiled(fn, *inputs):
    """compile_regions in Triton's interpreter against eager: {kernel: what ran it}, each kernel rendered from its IR."""
    with c_runtime.use("triton"):
        model = compile_regions(Fn(fn), inputs)
    torch.testing.assert_close(model(*inputs), fn(*inputs), equal_nan=True)
    owners = [lch.owner for lch in model.compiled.launchers]
    assert all(o.plan.ir is not None and o.plan.ir.name == o.kernel.name for o in owners)
    return {o.kernel.name: o.ran for o in owners}


def test_compile_regions_runs_the_kernels_rendered_from_the_ir():
    x, w = _r(6, 40), _r(40, seed=1)
    ran = _compiled(lambda x, w: torch.nn.functional.layer_norm(x * 2, (40,), w).relu() + x, x, w)
    assert ran and set(ran.values()) == {"triton-interpreter"}, ran
    pool = _compiled(lambda x: torch.nn.functional.max_pool2d(x.relu(), 3, 1, 1) * 2, _r(1, 2, 6, 6))
    assert pool and set(pool.values()) == {"triton-interpreter"}, pool  # a window too (fusion.compiler.lower_windows)


def test_the_retired_triton_source_option_is_an_unknown_option():
    from fusion.compiler.driver import Options

    with pytest.raises(ValueError, match="triton_source"):
        Options.parse({"triton_source": "ir"})


def test_torch_compile_runs_the_ir_s_triton_source():
    from fusion import backend  # registers backend="fusion"

    backend.reset()  # only this test's reports
    torch._dynamo.reset()
    x = _r(8, 24)

    def f(x):
        return torch.softmax(x * 3, -1) + x.sigmoid()

    got = torch.compile(f, backend="fusion", options={"renderer": "triton"})(x)
    torch.testing.assert_close(got, f(x))
    from fusion.compiler.driver import reports

    owners = [lch.owner for r in reports for p in r.parts for lch in p.launchers()]
    assert owners and all(o.ran == "triton-interpreter" and o.plan.ir is not None for o in owners)
    for o in owners:  # the source launched is the renderer's, of the plan's IR
        assert o.kernel.source == render(o.plan.ir)[0], o.kernel.name
    torch._dynamo.reset()


def test_the_report_says_which_renderer_ran_each_kernel():
    """The report names each kernel's renderer: "triton-interpreter" under ``renderer="triton"``, "c" under "c"."""
    from fusion import backend

    def f(x):
        return (torch.sigmoid(x) * 2.0 + 1.0).sum(-1)

    x = torch.randn(5, 33)
    cases = [({"renderer": "triton"}, "triton-interpreter")] + [({"renderer": "c"}, "c")] * HAS_CC
    for options, want in cases:
        backend.reset()
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(f, backend="fusion", options=options)(x), f(x))
        ran = backend.reports[0].parts[0].renderers()
        assert ran and set(ran.values()) == {want}, ran


def test_an_offset_that_is_the_walk_itself_is_the_flat_index():
    # a BatchNorm-style epilogue: x read at its own contiguous position (xindex), the channel's parameters at x1;
    # the loop variables no line reads are not computed
    gm = capture_aten(Fn(lambda x, s: x * s + 1), (torch.randn(2, 3, 4, 5), torch.randn(3, 1, 1)))
    (region,) = unique_regions(build_fusion_regions(gm))
    source, _ = render(Lowering(region).kernel("k"))
    body = source.split("def k(")[1]
    assert "in0 + (xindex)" in body and "out0 + (xindex)" in body, body
    assert "xindex // 60" not in body, body  # the batch index: nobody reads it
