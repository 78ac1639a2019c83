"""fusion.fxutils.pieces: the connected pieces of a set of graph nodes, through producer and consumer edges."""

import pytest
import torch
import torch.fx as fx

from fusion.fxutils.pieces import connected_pieces

pytestmark = pytest.mark.tooling


def f(x, y):
    a = torch.relu(x)  # piece 1: a, b (b reads a)
    b = a + 1
    c = torch.sin(y)  # piece 2: c, d, e (joined through a consumer: e reads d and c)
    d = torch.cos(y)
    e = c * d
    g = b * e  # outside the set: does not join the two pieces
    return g


def test_pieces_follow_edges_inside_the_set_in_graph_order():
    gm = fx.symbolic_trace(f)
    by_name = {n.name: n for n in gm.graph.nodes}
    chosen = [by_name[k] for k in ("relu", "add", "sin", "cos", "mul")]
    pieces = connected_pieces(chosen)
    assert [[n.name for n in p] for p in pieces] == [["relu", "add"], ["sin", "cos", "mul"]]
    assert connected_pieces([by_name["cos"], by_name["sin"]]) == [[by_name["cos"]], [by_name["sin"]]]
    assert connected_pieces([]) == []
    every = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert connected_pieces(every) == [every]  # mul_1 joins them


def test_sibling_sums_merge_and_a_cut_that_comes_back_whole_runs_as_aten():
    """Pieces of a cut whose reductions walk the same rows are one piece (two sums of (4, 8) over dim 0, unconnected);
    and a cut that would hand the same region back (a SplitRegion at its first node, nothing stored first) ends as aten
    ops with the reason, instead of going round the work list for ever."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion.compiler.partition import Worklist, merge_siblings
    from fusion.ir.plan import Region, SplitRegion

    gm = make_fx(lambda x, y: (x.sum(0), y.sum(0), y.sum(1)), tracing_mode="fake")(torch.randn(4, 8), torch.randn(4, 8))
    sums = [n for n in gm.graph.nodes if n.op == "call_function"]
    merged = merge_siblings(sums, connected_pieces(sums))
    assert [[n.name for n in p] for p in merged] == [[sums[0].name, sums[1].name], [sums[2].name]]
    work = Worklist(gm, [Region(sums[:2])])
    if not work.runs:
        pytest.skip("neither Triton nor a C compiler here: every region runs as aten anyway")
    region = next(iter(work))
    work.refuse(region, SplitRegion("a test's cut", sums[0], []))
    assert work.work == [], work.work
    assert any("came back whole" in s.reason for s in work.report.skipped), work.report.table()
