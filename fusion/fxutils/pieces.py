"""Connected pieces of a set of graph nodes: union-find over producer → consumer edges inside the set."""

from __future__ import annotations

import torch.fx as fx


def connected_pieces(nodes: list[fx.Node]) -> list[list[fx.Node]]:
    """``nodes`` (in graph order) grouped into the pieces their edges connect, each piece in graph order.

    Union by size with path halving over positions: one pass over the nodes and their input edges, near-linear.
    """
    index = {node: i for i, node in enumerate(nodes)}
    parent, size = list(range(len(nodes))), [1] * len(nodes)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving
            i = parent[i]
        return i

    for i, node in enumerate(nodes):
        for inp in node.all_input_nodes:
            j = index.get(inp)
            if j is None:
                continue
            a, b = find(i), find(j)
            if a != b:
                if size[a] < size[b]:
                    a, b = b, a
                parent[b], size[a] = a, size[a] + size[b]
    pieces: dict[int, list[fx.Node]] = {}
    for i, node in enumerate(nodes):
        pieces.setdefault(find(i), []).append(node)
    return list(pieces.values())
