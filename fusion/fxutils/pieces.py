"""Connected pieces of a set of graph nodes: a depth-first walk over the producer → consumer edges inside the set."""

from __future__ import annotations

import torch.fx as fx


def connected_pieces(nodes: list[fx.Node]) -> list[list[fx.Node]]:
    """``nodes`` (in graph order) grouped into the pieces their edges connect, each piece in graph order, the pieces
    in the order of their first node.

    Each node not yet reached starts a piece; a stack walks from it along inputs and users that lie in the set, and
    every node it reaches joins that piece: each node and each edge is seen once or twice, linear in the set's size.
    """
    piece_of: dict[fx.Node, int] = dict.fromkeys(nodes, -1)  # -1: not reached yet
    count = 0
    for start in nodes:
        if piece_of[start] >= 0:
            continue
        piece_of[start], stack = count, [start]
        while stack:
            node = stack.pop()
            for other in (*node.all_input_nodes, *node.users):
                if piece_of.get(other) == -1:
                    piece_of[other] = count
                    stack.append(other)
        count += 1
    pieces: list[list[fx.Node]] = [[] for _ in range(count)]
    for node in nodes:
        pieces[piece_of[node]].append(node)
    return pieces
