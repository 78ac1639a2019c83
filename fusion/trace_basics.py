"""Phase 1 — trace basics: what torch.fx sees when it looks at your model.

Run it:   uv run python -m fusion.trace_basics
Test it:  uv run pytest -m phase1

What you learn
--------------
* ``torch.fx.symbolic_trace`` runs ``forward()`` once with *Proxy* objects instead of tensors and records every
  operation into a ``Graph``; a ``GraphModule`` is that graph plus the model's submodules and parameters, compiled
  back into Python (``gm.code``).
* Every node has one of six opcodes — and every fusion pass in this package is a walk over those nodes:

  ============== ======================================= ==============================
  opcode         what it is                              ``node.target``
  ============== ======================================= ==============================
  placeholder    a forward() argument                    the argument's name
  get_attr       read a parameter/buffer directly        its qualified name ("scale")
  call_function  a free function: torch.add, F.relu, +   the function object
  call_module    a submodule's forward: self.linear(x)   the submodule's path ("linear")
  call_method    a method on a value: x.relu(), x.view   the method name ("relu")
  output         the return statement                    "output"
  ============== ======================================= ==============================

* ``node.args`` point at the nodes a node reads; ``node.users`` at the nodes that read it. Fusion legality is
  mostly a question about ``users``.
* A graph has no shapes until you run something through it: ``ShapeProp`` runs real example inputs and stores
  each node's shape and dtype in ``node.meta["tensor_meta"]``.
* What tracing cannot see: Python control flow on tensor *values*. ``if x.sum() > 0:`` needs a real number, and
  a Proxy has none.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.fx as fx
from torch.fx.passes.shape_prop import ShapeProp

from fusion import models
from fusion.common import UntraceableModelError, heading, lesson_cli, table, trace_module
from fusion.common import node_table as _node_table

OPCODES = ("placeholder", "get_attr", "call_function", "call_module", "call_method", "output")


def trace(model: torch.nn.Module) -> fx.GraphModule:
    """``symbolic_trace`` with a clear error: a non-Module gets a TypeError, an untraceable one an
    :class:`~fusion.common.UntraceableModelError` naming the model, the line and the fix.

    >>> gm = trace(models.TinyNet())
    >>> [n.op for n in gm.graph.nodes]
    ['placeholder', 'call_module', 'get_attr', 'call_function', 'call_method', 'output']
    """
    return trace_module(model, what="trace")


def node_table(gm: fx.GraphModule) -> str:
    """The node table every phase prints: opcode, name, target, args, users."""
    return _node_table(gm)


def opcode_counts(gm: fx.GraphModule) -> dict[str, int]:
    """How many nodes of each of the six opcodes the graph has (every opcode present as a key, zeros included).

    >>> opcode_counts(trace(models.TinyNet()))["call_module"]
    1
    """
    # TODO(human): count the nodes of each opcode and return all six opcodes as keys, in OPCODES order. Hint: every node has node.op, and an opcode the graph lacks still gets a 0. More: collections.Counter counts the items of any iterable (it is imported above) and answers 0 for a key it never saw; OPCODES gives the keys and their order
    # BEGIN SOLUTION
    seen = Counter(node.op for node in gm.graph.nodes)
    return {op: seen[op] for op in OPCODES}
    # END SOLUTION


def shape_rows(gm: fx.GraphModule, *example_inputs: torch.Tensor) -> list[tuple[str, str, tuple[int, ...], str]]:
    """Run ShapeProp on ``example_inputs`` and return (name, opcode, shape, dtype) for every node that holds a tensor.

    ``shape`` is a tuple of ints, ``dtype`` the dtype's name without ``torch.``: ``"float32"``. Nodes without a single
    tensor result are left out: the output node, a node returning a tuple (``x.chunk(2, 1)``), a node returning a
    Python number (``x.size(0)``).
    """
    ShapeProp(gm).propagate(*example_inputs)
    # TODO(human): return (name, opcode, shape tuple, dtype as 'float32' without 'torch.') for every node ShapeProp gave a single tensor result. Hint: ShapeProp stored each result's metadata in node.meta; skip the output node, a tuple result and a non-tensor one. More: ShapeProp writes node.meta['tensor_meta']: absent for the output node, a tuple (or another container) for several results, an object with .shape and .dtype for one tensor; str of a dtype reads 'torch.float32', and str.removeprefix trims it
    # BEGIN SOLUTION
    rows = []
    for node in gm.graph.nodes:
        meta = node.meta.get("tensor_meta")
        if node.op == "output" or not hasattr(meta, "shape"):
            continue
        rows.append((node.name, node.op, tuple(meta.shape), str(meta.dtype).removeprefix("torch.")))
    return rows
    # END SOLUTION


class DataDependentNet(torch.nn.Module):
    """Branches on a tensor's *value*: fine in eager mode, impossible to trace symbolically."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x.relu()
        return -x


def run(quick: bool = False) -> None:
    model = models.TinyNet()
    (x,) = models.tiny_inputs()

    heading("Phase 1 — trace basics")
    print("TinyNet.forward:  h = self.linear(x); h = torch.add(h, self.scale); return h.relu()")

    gm = trace(model)
    heading("The graph, one row per node", "-")
    print(node_table(gm))

    heading("Opcode counts", "-")
    print(table(opcode_counts(gm).items(), ["opcode", "count"]))

    heading("gm.code: the graph compiled back to Python", "-")
    print(gm.code.strip())

    heading("ShapeProp: shapes and dtypes from one real run", "-")
    print(table(shape_rows(gm, x), ["node", "opcode", "shape", "dtype"]))
    torch.testing.assert_close(gm(x), model(x))
    print("gm(x) == model(x): the traced graph computes what the model computes.")

    heading("What tracing cannot see", "-")
    print("DataDependentNet.forward:  if x.sum() > 0: return x.relu()  else: return -x")
    try:
        trace(DataDependentNet())
    except UntraceableModelError as e:
        print(f"trace() refused it:\n  {e}")
        print(
            "In plain words: during tracing `x` is a Proxy, a stand-in that records operations but holds no numbers.\n"
            "`x.sum() > 0` is just another recorded node; `if` needs True or False *now*, and there is none yet.\n"
            "Compilers handle this with guards and graph breaks (torch.compile) or by tracing one branch (jit.trace)."
        )


def main(argv: list[str] | None = None) -> int:
    return lesson_cli(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
