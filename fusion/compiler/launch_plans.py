"""A :class:`~fusion.ir.plan.KernelPlan` (the generator's answer, in terms of the graph's nodes) as the
:class:`~fusion.ir.plan.LaunchPlan` the runtime holds: data alone, decided here, at compile time.

* :func:`launch_plan` — the argument specs from the nodes' ``meta["val"]``, and each escaping value of the region as a
  recipe of ``fusion.ir.views`` records over the launch's buffers (inputs, then stored tensors).
* :func:`recipe` — one value: the buffer itself (:class:`~fusion.ir.views.Take`), a strided view of the first buffer
  its chain of views reaches (:class:`~fusion.ir.views.ViewOf`: one ``as_strided`` at run time, whatever the chain),
  else the chain's ops by name (:class:`~fusion.ir.views.Steps`: ``view.dtype`` reinterprets bytes, no strides do).
* :func:`allocated_as_returned` — a stored tensor returned once, as a view over all its memory, is allocated in
  that view's shape: the launch returns it as it is.
"""

from __future__ import annotations

import operator
import os
from collections import Counter

import torch
import torch.fx as fx

from fusion.aten.nodes import dense_strides, is_view_node, strided_view
from fusion.compiler.lower_reductions import dtype_name
from fusion.ir.plan import InputSpec, KernelPlan, LaunchPlan, TensorSpec, Unsupported
from fusion.ir.views import Prev, Recipe, Ref, Step, Steps, Take, TorchName, ViewOf, extent, reads

__all__ = ["AS_RETURNED", "allocated_as_returned", "launch_plan", "recipe"]

AS_RETURNED = os.environ.get("FUSION_AS_RETURNED", "1") != "0"  # allocated_as_returned on (0: off, for a GPU A/B)


def launch_plan(plan: KernelPlan) -> LaunchPlan:
    """``plan`` as data: raises :class:`~fusion.ir.plan.Unsupported` for an escaping value no recipe describes (the
    partition then runs the region as aten ops)."""
    where: dict[fx.Node, int] = {}
    for i, n in enumerate(plan.inputs):
        where.setdefault(n, i)
    for i, n in enumerate(plan.stored):
        where[n] = len(plan.inputs) + i  # a value both read and stored is the stored one (as the kernel wrote it)
    metas = plan.input_meta or [_meta(n.meta["val"]) for n in plan.inputs]
    inputs = tuple(
        InputSpec(tuple(shape), tuple(stride), dtype_name(dtype), n.name, n.op == "placeholder" or is_view_node(n))
        for n, (shape, stride, dtype) in zip(plan.inputs, metas, strict=True)
    )
    stored = tuple(TensorSpec(*_meta(n.meta["val"])[:2], dtype_name(n.meta["val"].dtype)) for n in plan.stored)
    results = tuple(recipe(n, where, len(plan.inputs)) for n in plan.outputs)
    if AS_RETURNED:
        stored, results = allocated_as_returned(stored, results, len(plan.inputs))
    devices = {str(n.meta["val"].device) for n in (*plan.inputs, *plan.stored) if "val" in n.meta}
    kernel = plan.kernel
    return LaunchPlan(
        kernel.name, kernel.source, kernel.kind, tuple(kernel.ops), inputs, stored,
        results, min(devices) if devices else "",
        plan.grid, tuple(plan.constexprs.items()), plan.num_warps, plan.xnumel, plan.xblock, plan.min_xblock,
        plan.ir, plan.elements,
    )  # fmt: skip


def allocated_as_returned(
    stored: tuple[TensorSpec, ...], results: tuple[Recipe, ...], first: int
) -> tuple[tuple[TensorSpec, ...], tuple[Recipe, ...]]:
    """A stored tensor the launch returns once, as a view of all of it from its start (a region's output reshaped
    or permuted: the same elements at the same places, both dense), is allocated in that view's sizes and strides
    and returned as it is. The kernel writes through a pointer, so only the memory matters, and each call rebuilds
    one view fewer (a ``reinterpret``, ~1 µs of CPU). Not for a tensor a chain of view ops reads (those ops read its
    sizes and strides)."""
    uses = Counter(i for r in results for i in reads(r))
    stored, out = list(stored), []
    for r in results:
        j = r.index - first if isinstance(r, ViewOf) else -1
        if j >= 0 and uses[r.index] == 1 and r.offset == 0 and _dense(r.sizes, r.strides):
            spec = stored[j]
            if _dense(spec.shape, spec.stride) and extent(r.sizes, r.strides) == extent(spec.shape, spec.stride):
                stored[j] = TensorSpec(r.sizes, r.strides, spec.dtype)
                r = Take(r.index)
        out.append(r)
    return tuple(stored), tuple(out)


def _dense(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Do these sizes and strides reach every element of their extent once (no hole, no overlap, not empty)?"""
    return 0 not in sizes and dense_strides(sizes, strides)


def _meta(val: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], torch.dtype]:
    return tuple(val.shape), tuple(val.stride()), val.dtype


def recipe(node: fx.Node, where: dict[fx.Node, int], first_stored: int | None = None) -> Recipe:
    """How the launch returns ``node``, given the buffer index of every node it has a tensor for (``where``; buffers
    from ``first_stored`` on are the kernel's stored outputs). A view of a stored buffer with the buffer's own sizes
    and strides (a region's output reshaped to the shape it has) is the buffer itself: one tensor fewer a call, and
    an output the memory plan sees as the kernel's (``Launcher._plain``)."""
    if node in where:
        return Take(where[node])
    base = node
    while base not in where and base.op == "call_function" and is_view_node(base) and _source(base) is not None:
        base = _source(base)
    if base in where and (view := strided_view(node, base)) is not None:
        root = base.meta["val"]
        own = (tuple(root.shape), tuple(root.stride()), 0)
        if first_stored is not None and where[base] >= first_stored and view == own:
            return Take(where[base])
        return ViewOf(where[base], *view)
    steps: list[Step] = []
    done: dict[fx.Node, int] = {}

    def value(a: object) -> object:
        if isinstance(a, fx.Node):
            if a in where:
                return Ref(where[a])
            if a not in done:
                done[a] = emit(a)
            return Prev(done[a])
        if isinstance(a, (list, tuple)):
            return tuple(value(x) for x in a)
        if isinstance(a, (torch.dtype, torch.memory_format, torch.layout)):
            return TorchName(str(a).removeprefix("torch."))
        if a is None or isinstance(a, (bool, int, float, str)):
            return a
        raise Unsupported(f"{node.name} escapes the region as a view with an argument {a!r} that is not data")

    def emit(n: fx.Node) -> int:
        if n.op != "call_function":
            raise Unsupported(f"{node.name} escapes the region through {n.name} ({n.op}), which the launch has not got")
        if n.target is operator.getitem:
            op = "getitem"
        elif isinstance(n.target, torch._ops.OpOverload):
            op = f"{n.target.namespace}.{n.target._opname}.{n.target._overloadname}"
        else:
            raise Unsupported(f"{node.name} escapes the region through {n.name} ({n.target}), not an op by name")
        args, kwargs = value(n.args), tuple((k, value(v)) for k, v in n.kwargs.items())
        steps.append(Step(op, args, kwargs))
        return len(steps) - 1

    emit(node)
    return Steps(tuple(steps))


def _source(node: fx.Node) -> fx.Node | None:
    """The tensor a view reads (its first argument), or None."""
    first = node.args[0] if node.args else None
    return first if isinstance(first, fx.Node) else None
