"""The boxed calling convention for a GraphModule's code: ``forward(self, args)`` takes ONE list, moves each input
into its local and clears the list, so that the graph's own code (FX sets every value to None after its last use)
holds the only reference to an input and frees it when the graph is done with it.

Why it matters: AOTAutograd hands a compiled backward its saved activations in a list it gives away
(``steal_args``). Called as ``forward(*args)``, the tuple of the call keeps every saved tensor alive until the
backward returns, while the weight gradients pile up beside them: a GPT-2 training step's peak was 0.7 GB above what
the forward saved, Inductor's 0.04 GB (its output code clears the list too). torch's own ``_BoxedCodeGen`` does this
in newer versions; this is the same few lines, for every torch the course supports.
"""

from __future__ import annotations

import torch.fx as fx


class BoxedCodeGen(fx.graph.CodeGen):
    """``def forward(self, args_list)``: each placeholder taken from the list in order, then the list cleared."""

    def gen_fn_def(self, free_vars, maybe_return_annotation, *args, **kwargs) -> str:
        name = getattr(self, "_func_name", "forward")
        names = [v.split(":")[0].split("=")[0].strip() for v in free_vars if v != "self"]
        lines = [f"def {name}(self, args_list){maybe_return_annotation}:"]
        if names:
            lines += ["    args_iter = iter(args_list)", *(f"    {v} = next(args_iter)" for v in names)]
        lines.append("    args_list.clear()")
        return "\n".join(lines)


def make_boxed(gm: fx.GraphModule) -> None:
    """Give ``gm`` the boxed convention (in place): from now on ``gm.forward(list_of_inputs)``, which empties the list."""
    gm.graph.set_codegen(BoxedCodeGen())
    gm.recompile()
