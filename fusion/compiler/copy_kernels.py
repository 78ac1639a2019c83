"""Phase 9's pass ``copy_kernels``: a layout copy that no region takes runs as a generated kernel of its own, not as
aten's copy (GPU).

Attention moves heads around: ``q.view(B, N, H, D).permute(0, 2, 1, 3).contiguous()`` before a batched GEMM, the
GEMM's result copied back after it. Such a ``clone`` of a permuted view is often alone: it reads a GEMM's output and
a GEMM reads it, or the region it came from was split by its outputs' shapes, and Phase 6's rule (a region needs two
ops) leaves a piece of one op to aten. On a GPU aten's copy of a 5- or 6-d permutation is a generic elementwise
kernel that divides every index by every size and stores two bytes at a time; the generated kernel reads the same
view through its strides (the kernel IR's index algebra, as inside any region). MaxViT-T's inference call ran 66 such
copies as aten calls: 851 us of an H200's time and ~24 us of CPU each, against 256 us for Inductor's generated
copies of the same tensors (scripts/results/h200-2026-11-28-afternoon-prof/).

The pass only marks each copy that qualifies (``node.meta["own_kernel"]``, :mod:`fusion.compiler.lone_kernels`); code
generation then gives every marked op a region of its own where no region holds it (``lone_kernel_regions``, from
``compile_graph``) and keeps a marked op's piece where a region is cut (``partition``). A copy qualifies when its input is not already laid out as
its output (a dense input in the output's strides is a memcpy: aten's vectorised copy is as fast) and it holds
elements. CUDA only: on a CPU aten's copy loop is at memory speed and a C kernel adds a compile; ``ON_CPU`` (the
tests) marks CPU copies too. Switch it off with ``options={"copy_kernels": False}``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.compiler.lone_kernels import OWN_KERNEL
from fusion.compiler.passes import Pass, noted

aten = torch.ops.aten

ON_CPU = False  # the tests: mark copies of CPU tensors too
_FORMATS = (None, torch.contiguous_format, torch.preserve_format)


def copy_refusal(node: fx.Node) -> str | None:
    """Why ``node`` stays aten's copy, or None where it qualifies (see the module's docstring)."""
    if node.op != "call_function" or node.target is not aten.clone.default:
        return "not a clone"
    if node.kwargs.get("memory_format") not in _FORMATS:
        return f"a copy into {node.kwargs['memory_format']}"
    x = node.args[0]
    xv, v = (getattr(x, "meta", {}).get("val"), node.meta.get("val"))
    if not isinstance(xv, torch.Tensor) or not isinstance(v, torch.Tensor):
        return "no tensor metadata"
    if v.device.type != "cuda" and not ON_CPU:
        return f"on {v.device.type}: aten's copy loop runs at memory speed, a C kernel adds a compile"
    if v.numel() == 0:
        return "no elements"
    if xv.stride() == v.stride():  # the output is dense: so is an input of its strides
        return "its input is laid out as its output: a memcpy, aten's copy is as fast"
    return None


def mark_copy_kernels(gm: fx.GraphModule, note: Callable[..., None]) -> None:
    """Pass ``copy_kernels``: mark every copy that qualifies (:func:`copy_refusal`)."""
    marked = []
    for node in gm.graph.find_nodes(op="call_function", target=aten.clone.default):
        if copy_refusal(node) is None:
            node.meta[OWN_KERNEL] = True
            marked.append(node.name)
    if marked:
        note("copy kernels", marked[:4] + (["..."] if len(marked) > 4 else []), "marked",
             f"{len(marked)} layout copies of a strided view: a generated kernel where no region holds them")  # fmt: skip


COPY_KERNELS = Pass("copy_kernels", noted(mark_copy_kernels), requires=("codegen",),
                    doc="a lone layout copy (a clone of a strided view) as a generated kernel, not aten's copy (GPU)")  # fmt: skip
