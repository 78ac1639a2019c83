"""Printing: node tables, plain tables, headings, short strings and the numbers every lesson prints (the largest
difference, the aten ops a call dispatches)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
import torch.fx as fx
from tabulate import tabulate


def shorten(x: object, width: int = 48) -> str:
    """``str(x)``, cut to ``width`` characters with a trailing "…" when longer."""
    s = str(x)
    return s if len(s) <= width else s[: width - 1] + "…"


def target_name(node: fx.Node) -> str:
    """A readable target: 'torch.relu', 'operator.add', 'encoder.0.0', 'relu' (method)."""
    t = node.target
    if isinstance(t, str):
        return t
    if isinstance(t, torch._ops.OpOverload):
        return str(t)
    mod = getattr(t, "__module__", None) or ""
    name = getattr(t, "__name__", None) or str(t)
    mod = {"torch._C._nn": "torch.nn.functional", "_operator": "operator", "torch._C._VariableFunctions": "torch"}.get(
        mod, mod
    )
    return f"{mod}.{name}" if mod else name


def node_table(gm: fx.GraphModule) -> str:
    """One row per node: opcode, name, target, args, users — the five things every pass reads."""
    rows = [
        (n.op, n.name, shorten(target_name(n), 40), shorten(n.args), ", ".join(u.name for u in n.users))
        for n in gm.graph.nodes
    ]
    return tabulate(rows, headers=["opcode", "name", "target", "args", "users"], tablefmt="simple")


def table(rows: Iterable[Sequence[object]], headers: Sequence[str], floatfmt: str = ".3g") -> str:
    return tabulate(list(rows), headers=list(headers), tablefmt="simple", floatfmt=floatfmt)


def heading(title: str, char: str = "=") -> None:
    print(f"\n{title}\n{char * len(title)}")


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().double() - b.detach().double()).abs().max().item() if a.numel() else 0.0


def aten_ops(fn: Callable[..., object], *args: object) -> list[str]:
    """The aten ops one call of ``fn(*args)`` dispatches, in order (below autograd: each is one CPU kernel call).

    Measured, not predicted: a TorchDispatchMode (what FlopCounterMode is built on) sees every op that really runs.

    >>> aten_ops(torch.relu, torch.ones(2))
    ['relu']
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class _RecordOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with _RecordOps() as recorder:
        fn(*args)
    return recorder.ops
