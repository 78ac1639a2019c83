"""Phase 6: aten capture, fusible nodes, fusion regions (vs brute force), byte accounting, collapse/expand."""

from __future__ import annotations

import operator
import subprocess
import sys
from unittest import mock

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion import models, regions
from fusion.common import report_of
from fusion.regions import (
    BANDWIDTH_PROFILES_GBPS,
    INDEXING_OPS,
    INPLACE_VIEW_OPS,
    MAX_POINTWISE_CAT_INPUTS,
    POOLING_OPS,
    FusionRegion,
    MissingMetaError,
    aten_inputs,
    bandwidth_gbps,
    build_fusion_regions,
    capture_aten,
    collapse_regions,
    compare_with_inductor,
    expand_regions,
    inductor_fusion_regions,
    is_fusible_node,
    kernel_counts,
    node_bytes,
    unique_regions,
    value_bytes,
)

pytestmark = pytest.mark.phase6

aten = torch.ops.aten
F64 = 8  # bytes per float64 element


# ----------------------------------------------------------------------------------------------------------------------
# A tiny graph builder: every node's meta["val"] is the real value, so the same graph can be costed and run.


class Builder:
    def __init__(self):
        self.graph = fx.Graph()
        self.inputs: list[torch.Tensor] = []

    def input(self, name: str, value: torch.Tensor) -> fx.Node:
        node = self.graph.placeholder(name)
        node.meta["val"] = value
        self.inputs.append(value)
        return node

    def op(self, target, *args) -> fx.Node:
        base = target.overloadpacket.__name__ if isinstance(target, torch._ops.OpOverload) else target.__name__
        node = self.graph.create_node("call_function", target, args, name=base)  # add, add_1, mul, ...
        real = fx.node.map_arg(args, lambda n: n.meta["val"])
        node.meta["val"] = target(*real)
        return node

    def done(self, *outputs: fx.Node) -> fx.GraphModule:
        self.graph.output(outputs[0] if len(outputs) == 1 else tuple(outputs))
        return fx.GraphModule(nn.Module(), self.graph)


def names(region) -> list[str]:
    return [n.name for n in region.nodes]


def region_sets(region_of) -> set[frozenset[str]]:
    return {frozenset(names(r)) for r in unique_regions(region_of)}


def region_with(region_of, target: str):
    """The region holding a node of ``target`` (its str), whatever order the regions come in."""
    (region,) = {id(r): r for n, r in region_of.items() if str(n.target) == target}.values()
    return region


def run_graph(gm: fx.GraphModule, inputs) -> list[torch.Tensor]:
    out = gm(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


# ----------------------------------------------------------------------------------------------------------------------
# is_fusible_node


def test_is_fusible_node_by_op():
    b = Builder()
    x = b.input("x", torch.randn(4, 4, dtype=torch.float64))
    idx = b.input("idx", torch.tensor([0, 2]))
    verdicts = {
        "add": (b.op(aten.add.Tensor, x, x), True),  # pointwise
        "relu": (b.op(aten.relu.default, x), True),
        "sum": (b.op(aten.sum.dim_IntList, x, [1]), True),  # reduction
        "amax": (b.op(aten.amax.default, x, [0]), True),
        "view": (b.op(aten.view.default, x, [16]), True),  # views
        "permute": (b.op(aten.permute.default, x, [1, 0]), True),
        "expand": (b.op(aten.expand.default, b.op(aten.sum.dim_IntList, x, [1], True), [4, 4]), True),
        "slice": (b.op(aten.slice.Tensor, x, 0, 1, 3), True),  # indexing
        "select": (b.op(aten.select.int, x, 0, 1), True),
        "index_select": (b.op(aten.index_select.default, x, 0, idx), True),
        "gather": (b.op(aten.gather.default, x, 1, b.op(aten.view.default, idx, [1, 2])), True),
        "embedding": (b.op(aten.embedding.default, x, idx), True),
        "mm": (b.op(aten.mm.default, x, x), False),  # compute-heavy
        "addmm": (b.op(aten.addmm.default, x, x, x), False),
        "to_copy": (b.op(aten._to_copy.default, x), False),  # anything else
        "full": (b.op(aten.full.default, [2], 1.0), False),
    }
    var_mean = b.op(aten.var_mean.correction, x, [1])
    verdicts["var_mean"] = (var_mean, True)
    verdicts["getitem_of_fusible"] = (b.op(operator.getitem, var_mean, 0), True)
    sort = b.op(aten.sort.default, x)  # not tagged: its outputs are not fusible either
    verdicts["getitem_of_other"] = (b.op(operator.getitem, sort, 0), False)
    clone = b.op(aten.clone.default, x)
    verdicts["copy_"] = (b.op(aten.copy_.default, clone, x), False)  # mutates its input
    verdicts["add_"] = (b.op(aten.add_.Tensor, clone, x), False)
    verdicts["torch.add"] = (b.op(torch.add, x, x), False)  # not an aten op: the aten graph never has it
    b.graph.get_attr("weight")
    b.graph.output(x)
    for label, (node, want) in verdicts.items():
        assert bool(is_fusible_node(node)) == want, label
    for node in b.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            assert not is_fusible_node(node), node.op


def op_node(target, *args) -> fx.Node:
    """A call_function node of ``target`` on placeholders (the rule reads the op and, for cat, its argument list)."""
    g = fx.Graph()
    fill = [g.placeholder(f"x{i}") if a is None else a for i, a in enumerate(args)]
    nodes = [
        [g.placeholder(f"t{i}_{j}") for j in range(a)] if isinstance(a, Tensors) else a for i, a in enumerate(fill)
    ]
    return g.call_function(target, tuple(nodes))


class Tensors(int):
    """op_node(aten.cat.default, Tensors(3)): a list of 3 placeholder tensors as the argument."""


def overloads_of(qualified: str) -> list[torch._ops.OpOverload]:
    """Every overload of 'aten::avg_pool2d' in this torch (none when this version lacks the op)."""
    namespace, name = qualified.split("::")
    packet = getattr(getattr(torch.ops, namespace), name, None)
    return [getattr(packet, o) for o in packet.overloads()] if packet is not None else []


@pytest.mark.parametrize("name", sorted(POOLING_OPS))
def test_pooling_is_fusible_and_its_out_variants_are_not(name):
    import torch._inductor.inductor_prims  # noqa: F401  (registers the prims that Inductor decomposes max-pool into)

    import fusion.compiler.depthwise  # noqa: F401  (registers fusion::depthwise_conv2d, Phase 9's window sum)

    ops = overloads_of(name)
    if not ops:
        assert "prims::" in name, f"{name} missing from this torch"  # older spelling of a prim
        pytest.skip(f"{name} is not in torch {torch.__version__}")
    for op in ops:  # functional overloads read a window of loads; .out overloads write into their argument
        assert bool(is_fusible_node(op_node(op, None))) == (not op._schema.is_mutable), op


def test_max_pool_prims_exist_in_this_torch():
    import torch._inductor.inductor_prims  # noqa: F401

    assert any(overloads_of(n) for n in POOLING_OPS if n.startswith("prims::"))


def test_indexing_ops_are_fusible():
    for name in INDEXING_OPS:
        ops = [op for op in overloads_of(name) if not op._schema.is_mutable]
        assert ops, name
        for op in ops:
            assert is_fusible_node(op_node(op, None)), op


def test_cat_is_fusible_up_to_max_pointwise_cat_inputs():
    import torch._inductor.config as inductor_config

    assert MAX_POINTWISE_CAT_INPUTS == inductor_config.max_pointwise_cat_inputs
    for n in (1, 2, MAX_POINTWISE_CAT_INPUTS):
        assert is_fusible_node(op_node(aten.cat.default, Tensors(n), 1)), n
    assert not is_fusible_node(op_node(aten.cat.default, Tensors(MAX_POINTWISE_CAT_INPUTS + 1), 1))
    assert not is_fusible_node(op_node(aten.cat.out, Tensors(2), 1, None))  # writes into its out= argument


def test_a_long_cat_cuts_the_span_even_after_a_short_one():
    b = Builder()
    xs = [b.input(f"x{i}", torch.randn(2, 3, dtype=torch.float64)) for i in range(MAX_POINTWISE_CAT_INPUTS + 1)]
    short = b.op(aten.relu.default, b.op(aten.cat.default, [b.op(aten.neg.default, xs[0]), xs[1]]))
    long = b.op(aten.cat.default, [b.op(aten.neg.default, x) for x in xs])  # 9 inputs: not fusible
    out = b.op(aten.add.Tensor, b.op(aten.exp.default, long), 1.0)
    gm = b.done(short, out)
    assert region_sets(build_fusion_regions(gm)) == {frozenset({"neg", "cat", "relu"}), frozenset({"exp", "add"})}


def test_in_place_views_are_fusible_other_mutations_are_not():
    for name in INPLACE_VIEW_OPS:  # they rewrite sizes and strides only
        for op in overloads_of(name):
            assert is_fusible_node(op_node(op, None, [4], [1])), op
    for op in (aten.add_.Tensor, aten.relu_.default, aten.mul_.Tensor, aten.copy_.default, aten.resize_.default):
        assert not is_fusible_node(op_node(op, None, None)), op  # they write data (add_, relu_ are tagged pointwise)
    for op in (aten.sum.IntList_out, aten.add.out, aten.index_select.out, aten.permute_copy.out):
        assert not is_fusible_node(op_node(op, None, None)), op  # out= variants of fusible ops


def test_getitem_takes_its_producers_verdict():
    import torch._inductor.inductor_prims  # noqa: F401

    with_offsets = next(op for n in sorted(POOLING_OPS) if n.endswith("with_offsets") for op in overloads_of(n))
    g = fx.Graph()
    x = g.placeholder("x")
    pool = g.call_function(with_offsets, (x, [2, 2]))
    mm = g.call_function(aten.native_batch_norm.default, (x,))  # not fusible: neither tagged nor named
    assert is_fusible_node(g.call_function(operator.getitem, (pool, 0)))
    assert not is_fusible_node(g.call_function(operator.getitem, (mm, 0)))


def test_collectives_are_not_fusible():
    import torch.distributed  # noqa: F401  (registers the functional collectives)

    ops = [getattr(getattr(torch.ops, "_c10d_functional", None), n, None) for n in ("wait_tensor", "all_reduce")]
    if None in ops:
        pytest.skip("this torch build has no _c10d_functional ops")
    for op in ops:
        assert not is_fusible_node(op_node(op.default, None, "sum", "0")), op


# ----------------------------------------------------------------------------------------------------------------------
# build_fusion_regions on small, named cases


class Chain(nn.Module):
    def forward(self, a):
        return (a + 1) * 2 - 3


def test_a_plus_1_times_2_minus_3_is_one_region():
    gm = capture_aten(Chain(), (torch.randn(8, 16),))
    region_of = build_fusion_regions(gm)
    (region,) = unique_regions(region_of)
    assert [str(n.target) for n in region.nodes] == ["aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor"]
    assert all(region_of[n] is region for n in region.nodes)
    assert [n.name for n in region.external_inputs] == ["x"]
    assert region.external_outputs == [region.nodes[-1]]
    assert region.total_bytes == 2 * 8 * 16 * 4  # read a, write the result; scalars 1, 2, 3 count 0
    assert region.unfused_bytes == 3 * 2 * 8 * 16 * 4  # three kernels, each reads and writes 8x16 floats
    assert kernel_counts(gm, region_of) == (3, 1)


def test_matmul_between_two_chains_splits_them():
    b = Builder()
    x = b.input("x", torch.randn(3, 3, dtype=torch.float64))
    w = b.input("w", torch.randn(3, 3, dtype=torch.float64))
    h = b.op(aten.relu.default, b.op(aten.add.Tensor, x, 1.0))
    m = b.op(aten.mm.default, h, w)
    out = b.op(aten.neg.default, b.op(aten.mul.Tensor, m, 2.0))
    gm = b.done(out)
    region_of = build_fusion_regions(gm)
    assert region_sets(region_of) == {frozenset({"add", "relu"}), frozenset({"mul", "neg"})}
    assert m not in region_of
    assert kernel_counts(gm, region_of) == (5, 3)


def test_two_independent_chains_in_one_span_are_two_regions():
    b = Builder()
    x = b.input("x", torch.randn(3, 3, dtype=torch.float64))
    y = b.input("y", torch.randn(3, 3, dtype=torch.float64))
    a1 = b.op(aten.add.Tensor, x, 1.0)
    b1 = b.op(aten.sub.Tensor, y, 1.0)  # interleaved: one span, two components
    a2 = b.op(aten.mul.Tensor, a1, 2.0)
    b2 = b.op(aten.mul.Tensor, b1, 3.0)
    gm = b.done(a2, b2)
    region_of = build_fusion_regions(gm)
    assert region_sets(region_of) == {frozenset({"add", "mul"}), frozenset({"sub", "mul_1"})}
    assert region_of[a1] is region_of[a2] and region_of[b1] is region_of[b2]
    assert region_of[a1] is not region_of[b1]


def test_view_only_and_single_op_components_are_not_regions():
    b = Builder()
    x = b.input("x", torch.randn(4, 6, dtype=torch.float64))
    v = b.op(aten.view.default, x, [6, 4])
    t = b.op(aten.permute.default, v, [1, 0])
    s = b.op(aten.add.Tensor, t, 1.0)  # one real op + two views: nothing to fuse
    w = b.input("w", torch.randn(6, 4, dtype=torch.float64))
    m = b.op(aten.mm.default, s, w)
    views = b.op(aten.view.default, b.op(aten.slice.Tensor, m, 0, 0, 2), [8])  # views only
    gm = b.done(views)
    assert build_fusion_regions(gm) == {}


def test_views_and_getitem_join_their_region_and_members_are_in_order():
    gm = capture_aten(models.TransformerMLP(), models.transformer_inputs())
    region_of = build_fusion_regions(gm)
    found = unique_regions(region_of)
    assert len(found) == 2  # LayerNorm and GELU; the residual add is one op alone
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for r in found:
        assert [order[n] for n in r.nodes] == sorted(order[n] for n in r.nodes)
        assert all(region_of[n] is r for n in r.nodes)
    layer_norm = region_with(region_of, "aten.var_mean.correction")
    assert {"<built-in function getitem>", "aten.rsqrt.default"} <= {str(n.target) for n in layer_norm.nodes}
    assert region_with(region_of, "aten.erf.default") is not layer_norm


# ----------------------------------------------------------------------------------------------------------------------
# Byte accounting


def test_value_bytes():
    assert value_bytes(torch.ones(2, 3)) == 24
    assert value_bytes(torch.ones(4).expand(1000, 4)) == 16  # broadcast: real storage, not logical size
    assert value_bytes(torch.ones(3, 5, dtype=torch.float64).t()) == 15 * F64  # a permutation spans all of it
    assert value_bytes(torch.ones(10, dtype=torch.float16)[::3]) == 10 * 2  # elements 0..9 are spanned
    assert value_bytes(torch.ones(0, 7)) == 0
    assert value_bytes(torch.tensor(3.0)) == 4  # a 0-dim tensor is one element in memory
    assert value_bytes((torch.ones(2), torch.ones(3, dtype=torch.int64))) == 8 + 24
    assert value_bytes(2.5) == 0 and value_bytes(7) == 0 and value_bytes(None) == 0  # scalars travel as arguments


def test_value_bytes_of_empty_tensors_is_zero_whatever_their_strides():
    # numel() == 0 reads nothing. The span formula alone gives (size - 1) * stride = -stride for a size-0 dim, which
    # cancels out for ones(0, 7) but not here: empty(3, 0) has strides (1, 1), so 1 + 2 - 1 = 2 elements, 8 bytes.
    for t in (torch.empty(3, 0), torch.empty(0), torch.empty(2, 0, 3), torch.empty(5, 4)[:, 4:], torch.empty(4, 0).t()):
        assert value_bytes(t) == 0, (tuple(t.shape), t.stride())
    assert value_bytes((torch.empty(3, 0), torch.ones(2))) == 8


def test_value_bytes_of_lists_nested_tuples_and_sym_ints():
    assert value_bytes([torch.ones(2), torch.ones(3, dtype=torch.int8)]) == 8 + 3  # a list counts its parts too
    assert value_bytes(((torch.ones(2), [torch.ones(1, dtype=torch.float64)]), None, 3)) == 8 + 8  # recursively
    assert value_bytes([]) == 0 and value_bytes(()) == 0 and value_bytes("x") == 0


DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int64, torch.bool]


@st.composite
def strided_tensors(draw):
    """A view with odd, size-0 and size-1 dims, permuted, sliced with steps and offsets, maybe broadcast."""
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=4))
    base = torch.zeros(shape, dtype=draw(st.sampled_from(DTYPES)))
    t = base.permute(draw(st.permutations(range(base.dim()))))
    for d in range(t.dim()):
        size = t.shape[d]
        start = draw(st.integers(0, max(size - 1, 0)))
        t = t.narrow(d, start, draw(st.integers(0, size - start))) if size else t
        step = draw(st.integers(1, 3))
        t = t[(slice(None),) * d + (slice(None, None, step),)]
    if draw(st.booleans()):
        t = t.unsqueeze(0).expand(draw(st.integers(0, 3)), *t.shape)  # a stride-0 dim
    return t


def _spanned_bytes(t: torch.Tensor) -> int:
    """Brute force: the offsets of every element (a view of arange over the storage); first to last, inclusive."""
    if t.numel() == 0:
        return 0
    positions = torch.arange(t.untyped_storage().nbytes() // t.element_size())
    offsets = positions.as_strided(t.shape, t.stride(), t.storage_offset())
    return int(offsets.max() - offsets.min() + 1) * t.element_size()


@given(t=strided_tensors())
def test_value_bytes_matches_the_elements_the_strides_reach(t):
    # not the storage: a slice reads only what it spans (an upper bound), an expanded dim reads nothing more
    assert value_bytes(t) == _spanned_bytes(t), (tuple(t.shape), t.stride(), t.dtype)


def test_shared_input_counts_once_and_scalars_count_zero():
    b = Builder()
    x = b.input("x", torch.randn(5, 7, dtype=torch.float64))
    p = b.op(aten.add.Tensor, x, 1.0)
    q = b.op(aten.mul.Tensor, x, x)  # x read twice by one op and once more by another
    out = b.op(aten.sub.Tensor, p, q)
    gm = b.done(out)
    (region,) = unique_regions(build_fusion_regions(gm))
    assert region.external_inputs == [x]
    assert region.total_bytes == 2 * 35 * F64
    # unfused: add (x, out), mul (x once, out), sub (p, q, out)
    assert region.unfused_bytes == (2 + 2 + 3) * 35 * F64


def test_broadcast_and_expanded_inputs_count_their_storage():
    b = Builder()
    x = b.input("x", torch.randn(100, 4, dtype=torch.float64))
    bias = b.input("bias", torch.randn(4, dtype=torch.float64))  # broadcast by the add
    scale = b.input("scale", torch.randn(4, dtype=torch.float64).expand(100, 4))  # stride-0 input
    h = b.op(aten.add.Tensor, x, bias)
    out = b.op(aten.mul.Tensor, h, scale)
    gm = b.done(out)
    (region,) = unique_regions(build_fusion_regions(gm))
    assert region.external_inputs == [x, bias, scale]
    assert region.total_bytes == (400 + 4 + 4 + 400) * F64


def test_multi_output_region_counts_every_external_output():
    b = Builder()
    x = b.input("x", torch.randn(6, 6, dtype=torch.float64))
    w = b.input("w", torch.randn(6, 6, dtype=torch.float64))
    stats = b.op(aten.var_mean.correction, x, [1])  # a tuple (var, mean), each (6,)
    var = b.op(operator.getitem, stats, 0)
    mean = b.op(operator.getitem, stats, 1)
    h = b.op(aten.relu.default, b.op(aten.sub.Tensor, x, mean))  # (6, 6): read by the matmul below
    out = b.op(aten.add.Tensor, var, 1.0)  # (6,): a graph output
    used = b.op(aten.mm.default, h, w)
    gm = b.done(out, used)
    region_of = build_fusion_regions(gm)
    (region,) = unique_regions(region_of)
    assert names(region) == ["var_mean", "getitem", "getitem_1", "sub", "relu", "add"]
    assert region.external_inputs == [x]
    assert region.external_outputs == [h, out]
    assert region.total_bytes == (36 + 36 + 6) * F64  # read x once; write relu and add
    # unfused: var_mean reads x, writes (var, mean); sub reads x and mean, writes; relu; add reads var, writes
    assert region.unfused_bytes == ((36 + 12) + (36 + 6 + 36) + (36 + 36) + (6 + 6)) * F64
    assert region.cost_ms(100.0) == pytest.approx(region.total_bytes / 100e9 * 1e3)


def test_escaping_views_write_what_they_alias():
    b = Builder()
    x = b.input("x", torch.randn(20, dtype=torch.float64))
    xv = b.op(aten.view.default, x, [4, 5])  # a view of an external input: escapes, writes nothing
    h = b.op(aten.relu.default, b.op(aten.mul.Tensor, xv, 2.0))  # (4, 5)
    hv = b.op(aten.view.default, h, [20])  # relu's value escapes only through views ...
    hv2 = b.op(aten.view.default, h, [5, 4])  # ... two of them: relu is still written once
    gm = b.done(xv, hv, hv2)
    (region,) = unique_regions(build_fusion_regions(gm))
    assert region.external_outputs == [xv, hv, hv2]
    assert region.total_bytes == (20 + 20) * F64  # read x, write relu
    assert region.unfused_bytes == (20 + 20 + 20 + 20) * F64  # mul and relu each read 20 and write 20


def hand_region(graph: fx.Graph, members: list[fx.Node], nbytes: dict[str, int]) -> FusionRegion:
    """A FusionRegion built by hand, its byte_cache filled: total/unfused bytes use no other TODO of the phase."""
    cache = {n: nbytes[n.name] for n in graph.nodes if n.name in nbytes}
    return FusionRegion(members, byte_cache=cache)


def hand_built_regions() -> tuple[FusionRegion, FusionRegion]:
    """Two regions over one graph, bytes given by hand: x (80 B) viewed, added to y (8 B), squared, var_mean'd."""
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    xv = g.call_function(aten.view.default, (x, [10]), name="xv")  # a view of an input: escapes, writes nothing
    a = g.call_function(aten.add.Tensor, (xv, y), name="a")
    m = g.call_function(aten.mul.Tensor, (a, a), name="m")  # reads a once
    stats = g.call_function(aten.var_mean.correction, (m, [0]), name="stats")
    mean = g.call_function(operator.getitem, (stats, 1), name="mean")  # a real output of var_mean: written
    mv = g.call_function(aten.view.default, (m, [2, 5]), name="mv")  # m escapes through two views: written once
    mv2 = g.call_function(aten.view.default, (m, [5, 2]), name="mv2")
    g.output((xv, mean, mv, mv2))
    sizes = {"x": 80, "y": 8, "xv": 80, "a": 80, "m": 80, "stats": 16, "mean": 8, "mv": 80, "mv2": 80}
    return hand_region(g, [xv, a, m, stats, mean, mv, mv2], sizes), hand_region(g, [a, m], sizes)


def test_total_bytes_of_hand_built_regions():
    whole, only_ops = hand_built_regions()
    assert whole.total_bytes == (80 + 8) + (8 + 80)  # read x, y; write mean and m (once, though two views escape)
    assert only_ops.total_bytes == (80 + 8) + 80  # read xv, y; write m


def test_unfused_bytes_of_hand_built_regions():
    whole, only_ops = hand_built_regions()
    # add reads xv, y and writes a; mul reads a (once), writes m; var_mean reads m, writes (var, mean); views: 0
    assert whole.unfused_bytes == (80 + 8 + 80) + (80 + 80) + (80 + 16)
    assert only_ops.unfused_bytes == (80 + 8 + 80) + (80 + 80)


def test_total_bytes_follows_a_chain_of_views_to_what_it_aliases():
    g = fx.Graph()
    x = g.placeholder("x")
    xv = g.call_function(aten.view.default, (x, [10]), name="xv")
    xvv = g.call_function(aten.permute.default, (xv, [0]), name="xvv")  # a view of a view of an input: no write
    a = g.call_function(aten.neg.default, (x,), name="a")
    av = g.call_function(aten.view.default, (a, [2, 5]), name="av")
    avv = g.call_function(aten.t.default, (av,), name="avv")  # a view of a view of a: a is written once
    g.output((xvv, a, avv))
    sizes = {"x": 80, "xv": 80, "xvv": 80, "a": 80, "av": 80, "avv": 80}
    region = hand_region(g, [xv, xvv, a, av, avv], sizes)
    assert region.total_bytes == 80 + 80  # read x, write a
    assert region.unfused_bytes == 80 + 80  # neg reads x, writes a; the views move nothing


def test_an_op_of_a_collective_namespace_is_never_fusible_even_when_tagged():
    # Today's collectives carry no pointwise/reduction tag: a tagged one (a new op) must still stay out of kernels.
    import torch.distributed  # noqa: F401  (registers the functional collectives)

    lib = torch.library.Library("_c10d_functional", "FRAGMENT")
    lib.define("fusion_test_scaled(Tensor x) -> Tensor", tags=(torch.Tag.pointwise,))
    try:
        op = torch.ops._c10d_functional.fusion_test_scaled.default
        assert torch.Tag.pointwise in op.tags
        assert not is_fusible_node(op_node(op, None))
    finally:
        lib._destroy()


def test_costing_without_meta_names_the_fix():
    b = Builder()
    x = b.input("x", torch.randn(2, 2))
    gm = b.done(b.op(aten.mul.Tensor, b.op(aten.add.Tensor, x, 1.0), 2.0))
    for node in gm.graph.nodes:
        node.meta.clear()
    add = next(n for n in gm.graph.nodes if n.target == aten.add.Tensor)
    with pytest.raises(MissingMetaError, match="capture_aten"):  # node_bytes is given code, not an exercise
        node_bytes(add)
    with pytest.raises(MissingMetaError, match="capture_aten"):
        FusionRegion([add]).bytes_of(add)


def test_bandwidth_profiles():
    assert bandwidth_gbps("H100") == BANDWIDTH_PROFILES_GBPS["H100"] == 3350
    assert BANDWIDTH_PROFILES_GBPS["H200"] == 4800 and BANDWIDTH_PROFILES_GBPS["A100"] == 2039
    assert bandwidth_gbps(1234) == 1234.0
    with pytest.raises(ValueError, match="H100"):
        bandwidth_gbps("TPU9000")


# ----------------------------------------------------------------------------------------------------------------------
# Random DAGs against brute force

# (name, target, arity, fusible, view)
OPS = [
    ("add", aten.add.Tensor, 2, True, False),
    ("mul", aten.mul.Tensor, 2, True, False),
    ("relu", aten.relu.default, 1, True, False),
    ("tanh", aten.tanh.default, 1, True, False),
    ("t", aten.t.default, 1, True, True),
    ("mm", aten.mm.default, 2, False, False),
    ("rowmax", aten.amax.default, 1, True, False),  # followed by an expand (a view) back to (n, n)
]


@st.composite
def random_dags(draw):
    """A random aten DAG of (n, n) float64 values with mixed fusible and non-fusible ops; returns (gm, inputs, labels)."""
    n = draw(st.integers(2, 4))
    b = Builder()
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    values = [
        b.input(f"in{i}", torch.rand(n, n, generator=gen, dtype=torch.float64)) for i in range(draw(st.integers(1, 3)))
    ]
    labels: dict[fx.Node, tuple[bool, bool]] = {}  # node -> (fusible, view), from the generator, not the code
    for _ in range(draw(st.integers(1, 24))):
        name, target, arity, fusible, view = draw(st.sampled_from(OPS))
        args = [draw(st.sampled_from(values)) for _ in range(arity)]
        if name == "rowmax":
            red = b.op(target, args[0], [1], True)
            labels[red] = (True, False)
            node = b.op(aten.expand.default, red, [n, n])
            labels[node] = (True, True)
        else:
            node = b.op(target, *args)
            labels[node] = (fusible, view)
        values.append(node)
    produced = [v for v in values if v.op != "placeholder"]
    outputs = draw(st.lists(st.sampled_from(produced), min_size=1, max_size=4, unique=True))
    return b.done(*outputs), b.inputs, labels


def brute_force_regions(gm: fx.GraphModule, labels) -> set[frozenset[str]]:
    """Spans by a plain scan, components by graph search over undirected edges inside each span."""
    spans, current = [], []
    for node in gm.graph.nodes:
        if labels.get(node, (False, False))[0]:
            current.append(node)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    regions = set()
    for span in spans:
        inside = set(span)
        seen = set()
        for start in span:
            if start in seen:
                continue
            component, stack = set(), [start]
            while stack:
                node = stack.pop()
                if node in component:
                    continue
                component.add(node)
                neighbours = list(node.all_input_nodes) + list(node.users)
                stack.extend(m for m in neighbours if m in inside)
            seen |= component
            if sum(not labels[m][1] for m in component) >= 2:
                regions.add(frozenset(m.name for m in component))
    return regions


def assert_convex_and_acyclic(gm: fx.GraphModule, region_of) -> None:
    # no path leaves a region and re-enters it
    for region in unique_regions(region_of):
        members = region.members
        stack = [u for n in region.nodes for u in n.users if u not in members]
        seen = set()
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            assert node not in members, f"a path leaves {region} and re-enters it at {node.name}"
            stack.extend(node.users)
    # contract every region to one vertex: the result is still a DAG (Kahn's algorithm consumes every vertex)
    rep = {n: ("r", id(region_of[n])) if n in region_of else ("n", n.name) for n in gm.graph.nodes}
    edges = {(rep[i], rep[n]) for n in gm.graph.nodes for i in n.all_input_nodes if rep[i] != rep[n]}
    indegree = dict.fromkeys(rep.values(), 0)
    for _, dst in edges:
        indegree[dst] += 1
    successors: dict[tuple, list[tuple]] = {}
    for src, dst in edges:
        successors.setdefault(src, []).append(dst)
    ready = [v for v, d in indegree.items() if d == 0]
    done = 0
    while ready:
        v = ready.pop()
        done += 1
        for dst in successors.get(v, ()):
            indegree[dst] -= 1
            if indegree[dst] == 0:
                ready.append(dst)
    assert done == len(indegree), "contracting the regions created a cycle"


@given(dag=random_dags())
def test_regions_match_brute_force_on_random_dags(dag):
    gm, _, labels = dag
    # The grouping is tested on its own: the generator's labels stand in for is_fusible_node (tested above).
    with mock.patch.object(regions, "is_fusible_node", lambda n: labels.get(n, (False, False))[0]):
        region_of = build_fusion_regions(gm)
    assert region_sets(region_of) == brute_force_regions(gm, labels)
    for node, (fusible, _) in labels.items():
        assert bool(is_fusible_node(node)) == fusible, node.name
    found = unique_regions(region_of)
    # disjoint, and every member maps to its own region object
    assert sum(len(r.nodes) for r in found) == len(region_of)
    for r in found:
        assert all(region_of[n] is r for n in r.nodes)
        assert r.total_bytes <= r.unfused_bytes
    assert_convex_and_acyclic(gm, region_of)


@given(dag=random_dags())
def test_collapse_and_expand_compute_the_same_on_random_dags(dag):
    gm, inputs, _ = dag
    code = gm.code
    region_of = build_fusion_regions(gm)
    want = run_graph(gm, inputs)
    collapsed = collapse_regions(gm, region_of)
    collapsed.graph.lint()
    expanded = expand_regions(collapsed)
    expanded.graph.lint()
    for got in (run_graph(collapsed, inputs), run_graph(expanded, inputs)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert gm.code == code  # the input graph is untouched
    fused = report_of(collapsed).fused
    assert len(fused) == sum(1 for n in collapsed.graph.nodes if n.op == "call_module")
    assert not any(n.op == "call_module" for n in expanded.graph.nodes)
    # meta survived the round trip: the expanded graph can be regioned and costed again
    assert all("val" in n.meta for n in expanded.graph.nodes if n.op == "call_function")
    for region in unique_regions(build_fusion_regions(expanded)):
        assert 0 < region.total_bytes <= region.unfused_bytes


def test_dead_fusible_chain_does_not_crash_collapse():
    b = Builder()
    x = b.input("x", torch.randn(3, 3, dtype=torch.float64))
    w = b.input("w", torch.randn(3, 3, dtype=torch.float64))
    b.op(aten.relu.default, b.op(aten.add.Tensor, x, 1.0))  # dead: nobody uses it
    live = b.op(aten.mul.Tensor, b.op(aten.tanh.default, b.op(aten.mm.default, x, w)), 2.0)
    gm = b.done(live)
    region_of = build_fusion_regions(gm)
    assert len(unique_regions(region_of)) == 2
    collapsed = collapse_regions(gm, region_of)
    collapsed.graph.lint()
    report = report_of(collapsed)
    assert [d.nodes for d in report.skipped] == [("add", "relu")]
    assert "dead" in report.skipped[0].reason
    assert len(report.fused) == 1
    torch.testing.assert_close(collapsed(*b.inputs), gm(*b.inputs))
    torch.testing.assert_close(expand_regions(collapsed)(*b.inputs), gm(*b.inputs))


def test_collapse_refuses_regions_of_another_graph():
    gm1 = capture_aten(Chain(), (torch.randn(2, 2),))
    gm2 = capture_aten(Chain(), (torch.randn(2, 2),))
    with pytest.raises(ValueError, match="same GraphModule"):
        collapse_regions(gm2, build_fusion_regions(gm1))


def _plan(name, nodes, inputs, outputs):
    """A hand-made KernelPlan (never launched): enough for build_compiled_graph to place its call."""
    from fusion.ir.plan import Kernel, KernelPlan, Region

    return KernelPlan(Kernel(name, "", Region(list(nodes))), list(inputs), [], list(outputs), list(outputs), 0, {})


def test_collapse_and_the_compiled_graph_share_one_rebuild(monkeypatch):
    from fusion.aten import collapse
    from fusion.compiler import partition
    from fusion.fxutils.rebuild import rebuild
    from fusion.kernels.triton_runtime import Launcher, RegionKernel

    calls = []

    def spy(gm, groups, emit, *args, **kwargs):
        calls.append([(g.name, g.returns_tuple) for g in groups])
        return rebuild(gm, groups, emit, *args, **kwargs)

    monkeypatch.setattr(collapse, "rebuild", spy)
    monkeypatch.setattr(partition, "rebuild", spy)
    b = Builder()
    x = b.input("x", torch.randn(3, 3, dtype=torch.float64))
    w = b.input("w", torch.randn(3, 3, dtype=torch.float64))
    relu = b.op(aten.relu.default, b.op(aten.add.Tensor, x, 1.0))
    out = b.op(aten.mul.Tensor, b.op(aten.tanh.default, b.op(aten.mm.default, relu, w)), 2.0)
    gm = b.done(out, relu)
    code = gm.code
    region_of = build_fusion_regions(gm)
    collapsed = collapse_regions(gm, region_of)
    assert calls == [[("fusion_region_0", False), ("fusion_region_1", False)]]  # one output each: no getitem
    assert not any(n.target is operator.getitem for n in collapsed.graph.nodes)
    torch.testing.assert_close(collapsed(*b.inputs), gm(*b.inputs))

    plans = [_plan(f"k{r.index}", r.nodes, r.external_inputs, r.external_outputs) for r in unique_regions(region_of)]
    compiled = partition.build_compiled_graph(gm, plans)
    assert calls[1] == [("k0", True), ("k1", True)]
    launches = [n for n in compiled.graph.nodes if isinstance(n.target, Launcher)]
    assert [n.meta["kernel"] for n in launches] == ["k0", "k1"]
    assert [type(m) for _, m in compiled.named_children()] == [RegionKernel, RegionKernel]
    items = [n for n in compiled.graph.nodes if n.target is operator.getitem]
    assert [n.args[0] for n in items] == launches and all("val" in n.meta for n in items)
    assert gm.code == code  # neither rebuild touches its input


def test_non_convex_group_is_a_value_error_in_collapse_and_the_compiled_graph():
    from fusion.compiler.partition import build_compiled_graph

    b = Builder()
    x = b.input("x", torch.randn(3, 3, dtype=torch.float64))
    w = b.input("w", torch.randn(3, 3, dtype=torch.float64))
    relu = b.op(aten.relu.default, x)
    mm = b.op(aten.mm.default, relu, w)  # leaves the group [relu, add] and comes back
    add = b.op(aten.add.Tensor, mm, relu)
    gm = b.done(add)
    region = FusionRegion([relu, add], index=0)
    with pytest.raises(ValueError, match=r"group fusion_region_0 .*'relu'.* reads 'mm'.*not convex"):
        collapse_regions(gm, {relu: region, add: region})
    with pytest.raises(ValueError, match=r"'(relu|mm)'.* reads '(mm|relu)'.*not convex"):  # the call placed after
        build_compiled_graph(gm, [_plan("k0", [relu, add], [x, mm], [add])])  # mm (what it reads) or at relu


# ----------------------------------------------------------------------------------------------------------------------
# capture_aten and the demo models


def test_capture_aten_decomposes_and_keeps_parameters():
    model = models.TransformerMLP()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = models.transformer_inputs()
    plain = capture_aten(model, inputs, decompose=False)
    decomposed = capture_aten(model, inputs)
    targets = {str(n.target) for n in decomposed.graph.nodes}
    assert "aten.native_layer_norm.default" not in targets and "aten.gelu.default" not in targets
    assert {"aten.var_mean.correction", "aten.erf.default", "aten.rsqrt.default"} <= targets
    assert {"aten.native_layer_norm.default", "aten.gelu.default"} <= {str(n.target) for n in plain.graph.nodes}
    assert build_fusion_regions(plain) == {}  # opaque composites: nothing to fuse
    placeholders = [n for n in decomposed.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(list(model.parameters())) + len(inputs)
    assert placeholders[0].name == "p_norm_weight" and placeholders[-1].name == "x"
    for node in decomposed.graph.nodes:
        if node.op not in ("output",):
            val = node.meta["val"]
            if isinstance(val, torch.Tensor):
                assert isinstance(val, torch._subclasses.FakeTensor), node.name
    with torch.no_grad():
        torch.testing.assert_close(decomposed(*aten_inputs(model, inputs)), model(*inputs))
        torch.testing.assert_close(plain(*aten_inputs(model, inputs)), model(*inputs))
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k])


def test_capture_aten_with_fake_inputs_allocates_nothing():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(64, 4096, 64)  # 64 MiB logically, no storage
    gm = capture_aten(models.TransformerMLP(), (x,))
    gelu = region_with(build_fusion_regions(gm), "aten.erf.default")
    assert gelu.total_bytes == 2 * 64 * 4096 * 256 * 4  # GELU: read fc1's output, write its result


def test_capture_aten_train_mode_batchnorm_updates_are_not_fused():
    model = models.ConvBNNet()  # training mode: BN updates running stats
    gm = capture_aten(model, models.conv_inputs())
    copies = [n for n in gm.graph.nodes if n.target == aten.copy_.default]
    assert copies and not any(is_fusible_node(n) for n in copies)
    assert_convex_and_acyclic(gm, build_fusion_regions(gm))


def test_capture_aten_refuses_non_modules():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        capture_aten(models.TinyNet, models.tiny_inputs())


@settings(max_examples=5)  # each example captures a model: keep the phase's test time small
@given(batch=st.integers(1, 3), size=st.integers(4, 9))
def test_conv_bn_net_regions_collapse_and_expand(batch, size):
    model = models.ConvBNNet().eval()
    inputs = models.conv_inputs(batch=batch, size=size)
    gm = capture_aten(model, inputs)
    region_of = build_fusion_regions(gm)
    assert len(unique_regions(region_of)) == 3  # one per Conv's BN(+ReLU, +residual, +pool)
    assert_convex_and_acyclic(gm, region_of)
    collapsed = collapse_regions(gm, region_of)
    expanded = expand_regions(collapsed)
    real = aten_inputs(model, inputs)
    with torch.no_grad():
        want = model(*inputs)
        for got in (gm(*real), collapsed(*real), expanded(*real)):
            torch.testing.assert_close(got, want)
    before, after = kernel_counts(gm, region_of)
    assert after < before


@settings(max_examples=5)
@given(batch=st.integers(1, 3), seq=st.integers(1, 6))
def test_transformer_mlp_collapse_and_expand(batch, seq):
    model = models.TransformerMLP(d_model=16)
    inputs = models.transformer_inputs(batch=batch, seq=seq, d_model=16)
    gm = capture_aten(model, inputs)
    region_of = build_fusion_regions(gm)
    gelu = region_with(region_of, "aten.erf.default")
    assert gelu.total_bytes == 2 * batch * seq * 64 * 4
    collapsed = collapse_regions(gm, region_of)
    assert sum(n.op == "call_module" for n in collapsed.graph.nodes) == 2
    real = aten_inputs(model, inputs)
    with torch.no_grad():
        want = model(*inputs)
        torch.testing.assert_close(collapsed(*real), want)
        torch.testing.assert_close(expand_regions(collapsed)(*real), want)


def test_comparison_with_inductor_explains_the_difference():
    if inductor_fusion_regions() is None:
        pytest.skip("this torch has no torch._inductor.fx_passes.fusion_regions")
    gm = capture_aten(models.TransformerMLP(), models.transformer_inputs())
    rows = compare_with_inductor(gm, build_fusion_regions(gm))
    assert sorted(row[0] for row in rows) == ["merged", "same"]  # our LayerNorm region takes in var_mean's getitems
    (merged,) = [row for row in rows if row[0] == "merged"]
    assert "getitem" in merged[3] and "Inductor not fusible" in merged[3] and "[known difference]" in merged[3]


# ----------------------------------------------------------------------------------------------------------------------
# Real architectures (torchvision, random init, small inputs): pooling, concatenation, in-place views

FRESH_PROCESS_CAPTURE = """
import sys, torch
from fusion.aten.capture import capture_aten
assert 'torch._inductor.lowering' not in sys.modules
x = torch.randn(1, 3, 8, 8)
gm = capture_aten(torch.nn.MaxPool2d(2), (x,))
torch.testing.assert_close(gm(x), torch.nn.functional.max_pool2d(x, 2))
capture_aten(torch.nn.MaxPool3d(2), (torch.randn(1, 2, 4, 4, 4),))
"""


@pytest.fixture(scope="module", autouse=True)
def fresh_process_capture():
    """Capture a max-pool in a process where nothing imported torch._inductor.lowering yet (this one may have).

    Started with the module's first test, it runs beside the others; test_capture_max_pool_in_a_fresh_process waits.
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", FRESH_PROCESS_CAPTURE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_capture_max_pool_in_a_fresh_process(fresh_process_capture):
    _, err = fresh_process_capture.communicate(timeout=600)
    assert fresh_process_capture.returncode == 0, err[-3000:]


def _real(name: str):
    from torchvision import models as tv
    from torchvision.models.convnext import CNBlock, LayerNorm2d
    from torchvision.models.densenet import _DenseBlock, _Transition
    from torchvision.models.googlenet import Inception

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, shape = {
            "resnet18": (lambda: tv.resnet18(), (1, 3, 32, 32)),
            "mobilenet_v2": (lambda: tv.mobilenet_v2().features[:5], (1, 3, 64, 64)),  # stem + 4 inverted residuals
            # a dense block (cat of 2, 3, 4 inputs) and a transition (avg_pool2d)
            "densenet_block": (
                lambda: nn.Sequential(_DenseBlock(3, 16, 2, 8, 0.0), _Transition(40, 16)),
                (1, 16, 8, 8),
            ),
            # four branches joined by one cat; a 3x3 max-pool branch
            "inception_block": (lambda: Inception(16, 8, 8, 8, 4, 8, 8), (1, 16, 8, 8)),
            # a ConvNeXt block and its head: the decomposed mean leaves an as_strided_
            "convnext_block": (
                lambda: nn.Sequential(CNBlock(16, 1e-6, 0.0), nn.AdaptiveAvgPool2d(1), LayerNorm2d(16)),
                (1, 16, 8, 8),
            ),
        }[name]
        model = models.randomize_batchnorm_(model()).eval().double()  # float64: eager and aten graph agree exactly
        inputs = (torch.randn(*shape, dtype=torch.float64),)
    return model, inputs


REAL = ["resnet18", "mobilenet_v2", "densenet_block", "inception_block", "convnext_block"]
MUST_FUSE = {  # ops each real model brings that the rule must accept (as Inductor's does)
    "resnet18": ["prims._low_memory_max_pool_with_offsets"],
    "densenet_block": ["aten.cat", "aten.avg_pool2d"],
    "inception_block": ["aten.cat", "prims._low_memory_max_pool_with_offsets"],
    "convnext_block": ["aten.as_strided_"],
}


@pytest.fixture(scope="module")
def captured():
    cache = {}

    def get(name):
        if name not in cache:
            model, inputs = _real(name)
            cache[name] = (model, inputs, capture_aten(model, inputs))
        return cache[name]

    return get


@pytest.mark.parametrize("name", REAL)
def test_real_architectures_regions_collapse_and_expand(name, captured):
    model, inputs, gm = captured(name)
    region_of = build_fusion_regions(gm)
    assert_convex_and_acyclic(gm, region_of)
    for op in MUST_FUSE.get(name, []):
        nodes = [n for n in gm.graph.nodes if str(n.target).rsplit(".", 1)[0] == op]
        assert nodes and all(is_fusible_node(n) for n in nodes), op
        if op == "aten.cat":  # each dense layer's cat opens the region of the BN and ReLU after it
            assert all(n in region_of for n in nodes)
    collapsed = collapse_regions(gm, region_of)
    collapsed.graph.lint()
    real = aten_inputs(model, inputs)
    with torch.no_grad():
        want = model(*inputs)
        for got in (gm(*real), collapsed(*real), expand_regions(collapsed)(*real)):
            torch.testing.assert_close(got, want)
    before, after = kernel_counts(gm, region_of)
    assert after < before


def test_resnet18_stem_bn_relu_and_max_pool_are_one_region():
    model = models.resnet18_block()
    gm = capture_aten(model, (torch.randn(1, 3, 32, 32),))
    region_of = build_fusion_regions(gm)
    pool = next(n for n in gm.graph.nodes if "max_pool" in str(n.target))
    relu = next(n for n in gm.graph.nodes if n.target == aten.relu.default)
    assert region_of[pool] is region_of[relu]


@pytest.mark.parametrize("name", REAL)
def test_real_architectures_differ_from_inductor_only_where_documented(name, captured):
    from fusion.aten.inductor import KNOWN_DIFFERENCES, fusibility_differences

    if inductor_fusion_regions() is None:
        pytest.skip("this torch has no torch._inductor.fx_passes.fusion_regions")
    _, _, gm = captured(name)
    differences = fusibility_differences(gm, is_fusible_node)
    assert {key.split(":")[0] for key in differences} <= set(KNOWN_DIFFERENCES), differences
    for verdict, _, _, why in compare_with_inductor(gm, build_fusion_regions(gm)):
        assert verdict == "same" or (verdict == "merged" and "[known difference]" in why), why


def test_machinery_never_imports_the_lesson():
    import ast
    import pathlib

    for path in pathlib.Path(regions.__file__).parent.joinpath("aten").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(n == "fusion.regions" or n.startswith("fusion.regions.") for n in names), path


def test_phase_runs(capsys):
    from fusion import regions

    regions.run(quick=True)
    out = capsys.readouterr().out
    assert "decompose=True" in out and "kernels:" in out and "collapse_regions" in out and "H100" in out


# Issue 41: the lesson's picture, `uv run --extra plot python -m fusion.regions --plot regions.png`


def test_the_regions_picture_is_a_png_of_the_lessons_regions(tmp_path):
    """Both demo graphs drawn from the lesson's own functions: a PNG, each region one colour, every cut labelled."""
    pytest.importorskip("matplotlib")  # the `plot` extra: uv run --extra plot pytest -m phase6
    from fusion.viz import regions as picture

    path = tmp_path / "regions.png"
    picture.draw_lesson(regions, str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, len(data)
    gm = capture_aten(models.TransformerMLP(), models.transformer_inputs(batch=2, seq=8))
    params = set(list(gm.graph.find_nodes(op="placeholder"))[:-1])
    nodes, inputs = picture.drawn_graph(gm, params)
    assert not any(regions.is_view_node(n) for n in nodes if n.op == "call_function") and not params & set(nodes)
    at = picture.layout(nodes, inputs)
    assert len(set(at.values())) == len(nodes), at  # no two boxes in one place
    assert all(at[i][0] < at[n][0] for n in nodes for i in inputs[n]), at  # every edge points right
    assert [picture.label(n) for n in picture.spine(nodes, inputs)][-4:] == ["mul", "addmm", "add", "output"]


def test_plot_is_offered_where_a_lesson_has_a_picture_and_names_the_extra_without_matplotlib(capsys):
    """`--plot` belongs to the shared lesson CLI (fusion.common.lesson_cli): Phase 6 and 9 have it, Phase 1 not; without
    matplotlib the run stops before the lesson with the command that installs the extra."""
    from fusion import trace_basics, viz

    assert viz.picture_of("fusion.regions") and viz.picture_of("fusion.backend") and not viz.picture_of("fusion.x")
    with pytest.raises(SystemExit):
        regions.main(["--help"])
    assert "--plot FILE.png" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        trace_basics.main(["--help"])
    assert "--plot" not in capsys.readouterr().out
    with mock.patch.object(viz, "have_matplotlib", lambda: False), pytest.raises(SystemExit) as stop:
        regions.main(["--quick", "--plot", "regions.png"])
    assert stop.value.code == 2
    assert "uv run --extra plot python -m fusion.regions --plot regions.png" in capsys.readouterr().err


def test_a_constant_between_two_fusible_ops_does_not_cut_their_region():
    """``where(mask.any(-1), p, 0.0)`` traces a ``scalar_tensor`` (no inputs, not fusible) between the softmax and
    its ``where``: nothing of the region feeds a constant, so it cannot close a cycle and must not end the region."""

    class MaskedSoftmax(nn.Module):
        def forward(self, x, m):
            return (torch.where(m.any(-1, keepdim=True), torch.softmax(x, -1), 0.0),)

    x, m = torch.randn(4, 7), torch.rand(4, 7) > 0.5
    gm = capture_aten(MaskedSoftmax(), [x, m])
    assert any(n.target is torch.ops.aten.scalar_tensor.default for n in gm.graph.nodes)
    (region,) = unique_regions(build_fusion_regions(gm))
    names = {n.target.overloadpacket.__name__ for n in region.nodes if n.op == "call_function"}
    assert {"amax", "exp", "sum", "div", "any", "where"} <= names, names
