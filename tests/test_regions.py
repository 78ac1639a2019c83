"""Phase 6: aten capture, fusible nodes, fusion regions (vs brute force), byte accounting, collapse/expand."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion import models
from fusion.common import report_of
from fusion.regions import (
    BANDWIDTH_PROFILES_GBPS,
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
        assert is_fusible_node(node) is want, label
    for node in b.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            assert not is_fusible_node(node), node.op


def test_collectives_are_not_fusible():
    wait = getattr(getattr(torch.ops, "_c10d_functional", None), "wait_tensor", None)
    if wait is None:
        pytest.skip("this torch build has no _c10d_functional ops")
    g = fx.Graph()
    x = g.placeholder("x")
    node = g.call_function(wait.default, (x,))
    assert not is_fusible_node(node)


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
    regions = unique_regions(region_of)
    assert len(regions) == 2  # LayerNorm and GELU; the residual add is one op alone
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for r in regions:
        assert [order[n] for n in r.nodes] == sorted(order[n] for n in r.nodes)
        assert all(region_of[n] is r for n in r.nodes)
    layer_norm = {str(n.target) for n in regions[0].nodes}
    assert {"aten.var_mean.correction", "<built-in function getitem>", "aten.rsqrt.default"} <= layer_norm
    assert "aten.erf.default" in {str(n.target) for n in regions[1].nodes}


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


def test_costing_without_meta_names_the_fix():
    b = Builder()
    x = b.input("x", torch.randn(2, 2))
    gm = b.done(b.op(aten.mul.Tensor, b.op(aten.add.Tensor, x, 1.0), 2.0))
    for node in gm.graph.nodes:
        node.meta.clear()
    (region,) = unique_regions(build_fusion_regions(gm))
    with pytest.raises(MissingMetaError, match="capture_aten"):
        region.total_bytes  # noqa: B018


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
    ready = [v for v, d in indegree.items() if d == 0]
    done = 0
    while ready:
        v = ready.pop()
        done += 1
        for src, dst in edges:
            if src == v:
                indegree[dst] -= 1
                if indegree[dst] == 0:
                    ready.append(dst)
    assert done == len(indegree), "contracting the regions created a cycle"


@given(dag=random_dags())
def test_regions_match_brute_force_on_random_dags(dag):
    gm, _, labels = dag
    for node, (fusible, _) in labels.items():
        assert is_fusible_node(node) is fusible, node.name
    region_of = build_fusion_regions(gm)
    assert region_sets(region_of) == brute_force_regions(gm, labels)
    regions = unique_regions(region_of)
    # disjoint, and every member maps to its own region object
    assert sum(len(r.nodes) for r in regions) == len(region_of)
    for r in regions:
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
    regions = unique_regions(build_fusion_regions(gm))
    assert regions[1].total_bytes == 2 * 64 * 4096 * 256 * 4  # GELU: read fc1's output, write its result


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
    gelu = unique_regions(region_of)[1]
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
    verdicts = [row[0] for row in rows]
    assert verdicts == ["merged", "same"]  # our LayerNorm region takes in var_mean through its getitems
    assert "getitem" in rows[0][3] and "Inductor not fusible" in rows[0][3]


def test_phase_runs(capsys):
    from fusion import regions

    regions.run(quick=True)
    out = capsys.readouterr().out
    assert "decompose=True" in out and "kernels:" in out and "collapse_regions" in out and "H100" in out
