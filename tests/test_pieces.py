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
