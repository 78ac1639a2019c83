"""How a launch hands back a region's outputs, as data: one recipe per escaping value, over the launch's buffers.

A kernel stores some members of its region (the *stored* tensors); the region's outputs are those stored tensors,
inputs it passes through, or views of either (an escaping ``h.t()`` is not written by the kernel: it is the stored
``h`` seen through other strides). The compiler decides which at compile time (``fusion.compiler.launch_plans``);
the runtime (``fusion.kernels.triton_runtime.Launcher``) returns the outputs from these records alone:

* :class:`Take` — buffer ``index`` itself.
* :class:`ViewOf` — buffer ``index`` seen through (sizes, strides) from ``offset`` elements past its own start: one
  ``as_strided`` (Inductor's ``reinterpret_tensor``), whatever chain of view ops made it.
* :class:`Steps` — a view that is not strided over its buffer (``view.dtype`` reinterprets bytes): a short list of
  :class:`Step` s, each an aten op by name (``"aten.view.dtype"``, resolved through ``torch.ops`` by
  :func:`resolve`) over arguments that are data: ints, floats, bools, strings, None, tuples of them, :class:`Ref`
  (a buffer), :class:`Prev` (an earlier step's result) and :class:`TorchName` (``torch.float16`` as ``"float16"``).

A buffer index counts the launch's tensors in argument order: the inputs, then the stored tensors (as
``fusion.ir.kernel_ir.Kernel.buffers`` does). Every record is a frozen dataclass of plain values; :func:`runner`
turns a recipe into the function of the buffers a launch calls.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Take:
    """The output is buffer ``index`` as it is."""

    index: int


@dataclass(frozen=True)
class ViewOf:
    """The output is buffer ``index`` through ``sizes`` and ``strides`` (elements), ``offset`` elements past its start."""

    index: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class Ref:
    """A step's argument: buffer ``index`` of the launch."""

    index: int


@dataclass(frozen=True)
class Prev:
    """A step's argument: the result of step ``index`` of the same recipe."""

    index: int


@dataclass(frozen=True)
class TorchName:
    """A step's argument that is a torch constant: ``torch.<name>`` (a dtype, a memory format or a layout)."""

    name: str


@dataclass(frozen=True)
class Step:
    """``op(*args, **dict(kwargs))``: ``op`` is an op's qualified name (``"aten.view.dtype"``) or ``"getitem"``."""

    op: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Steps:
    """The output is the last step's result, the steps applied in order."""

    steps: tuple[Step, ...]


Recipe = Take | ViewOf | Steps


def extent(sizes: Sequence[int], strides: Sequence[int]) -> int:
    """Elements of memory from a strided tensor's first element to its last, both included (0 if it is empty)."""
    if 0 in sizes:
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(sizes, strides, strict=True))


def reads(recipe: Recipe) -> list[int]:
    """The buffer indices ``recipe`` reads, once per reference (a chain of steps may read one buffer twice)."""
    if isinstance(recipe, (Take, ViewOf)):
        return [recipe.index]

    def refs(a: Any) -> list[int]:
        if isinstance(a, Ref):
            return [a.index]
        if isinstance(a, Step):
            return refs(a.args) + refs(tuple(v for _, v in a.kwargs))
        if isinstance(a, tuple):
            return [i for x in a for i in refs(x)]
        return []

    return refs(recipe.steps)


def resolve(op: str) -> Any:
    """The callable a step names: ``"aten.view.dtype"`` is ``torch.ops.aten.view.dtype``; ``"getitem"`` is
    ``operator.getitem`` (an element of a tuple-valued view, as ``split``'s)."""
    if op == "getitem":
        return operator.getitem
    import torch

    namespace, packet, overload = op.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def runner(recipe: Recipe) -> Callable[[Sequence[Any]], Any]:
    """``recipe`` as a function of the launch's buffers (inputs, then stored tensors), its ops and torch constants
    resolved once, here. Steps are applied in order; the last one's result is the output."""
    if isinstance(recipe, Take):
        return operator.itemgetter(recipe.index)
    if isinstance(recipe, ViewOf):
        from fusion.aten.nodes import reinterpret

        i, view = recipe.index, (recipe.sizes, recipe.strides, recipe.offset)
        return lambda buffers: reinterpret(buffers[i], *view)
    calls = [(resolve(s.op), _constants(s.args), _constants(dict(s.kwargs))) for s in recipe.steps]

    def run(buffers: Sequence[Any]) -> Any:
        done: list[Any] = []

        def value(a: Any) -> Any:
            if isinstance(a, Ref):
                return buffers[a.index]
            if isinstance(a, Prev):
                return done[a.index]
            if isinstance(a, tuple):
                return tuple(value(x) for x in a)
            return a

        for fn, args, kwargs in calls:
            done.append(fn(*value(args), **{k: value(v) for k, v in kwargs.items()}))
        return done[-1]

    return run


def _constants(a: Any) -> Any:
    """``a`` with every :class:`TorchName` replaced by its torch object (the rest as it is)."""
    if isinstance(a, TorchName):
        import torch

        return getattr(torch, a.name)
    if isinstance(a, tuple):
        return tuple(_constants(x) for x in a)
    if isinstance(a, dict):
        return {k: _constants(v) for k, v in a.items()}
    return a
