"""The compiler's intermediate types, shared by the lessons (Phases 6, 8, 9) and the machinery behind them."""

from __future__ import annotations

import torch.fx as fx


class Unsupported(Exception):
    """The generator cannot compile this region; the message is the reason the report shows. ``node``: the member
    that has no rule (compile_graph cuts the region there), or None when the region as a whole is refused."""

    def __init__(self, reason: str, node: fx.Node | None = None) -> None:
        super().__init__(reason)
        self.node = node
