"""The ending every graph rewrite shares: the graph checked, then its ``forward`` regenerated from it."""

from __future__ import annotations

import torch.fx as fx


def relint(gm: fx.GraphModule) -> None:
    """``gm.graph.lint()`` (every node's inputs defined before it, no dangling users), then ``gm.recompile()``: a
    rewrite that changed ``gm.graph`` calls this once, at its end, so the module runs the graph it now holds."""
    gm.graph.lint()
    gm.recompile()
