"""What the code generator (Phase 8, ``fusion.codegen``) writes besides the op lines: Triton spellings of dtypes and
constants, the combine functions of reductions, kernel names, memory order, and the check that a region is one the
generator has rules for. Machinery: a learner reads ``fusion/codegen.py``."""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence

import torch
import torch.fx as fx

from fusion.compiler.ir import Unsupported

_names = itertools.count()


def next_kernel_index() -> int:
    """A process-wide counter: kernel names are unique per process, as Inductor's are (``..._0``, ``..._1``)."""
    return next(_names)


def bind_args(node: fx.Node) -> dict:
    """The node's arguments by schema name, defaults filled in: {'self': x, 'other': 2.0, 'alpha': 1}."""
    schema = node.target._schema
    bound = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    bound.update({a.name: v for a, v in zip(schema.arguments, node.args, strict=False)})
    bound.update(node.kwargs)
    return bound


def const_source(value: object) -> str:
    """A Python scalar as Triton source: 2.0, 1e-05, float('inf')."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'
    if isinstance(value, (int, float)):
        return repr(value)
    raise Unsupported(f"argument {value!r} of type {type(value).__name__} is not a scalar")


def tl_dtype(dtype: torch.dtype) -> str:
    names = {torch.bool: "int1", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    return "tl." + names.get(dtype, str(dtype).removeprefix("torch."))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half and bfloat16 compute in float32 (loaded up, rounded once at the store), like Inductor."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


COMBINE_FUNCTIONS = [
    "@triton.jit", "def _add(a, b):", "    return a + b", "", "",
    "@triton.jit", "def _maximum(a, b):", "    return tl.where(a != a, a, tl.where(a > b, a, b))", "", "",
    "@triton.jit", "def _minimum(a, b):", "    return tl.where(a != a, a, tl.where(a < b, a, b))", "",
]  # fmt: skip


def is_view(node: fx.Node) -> bool:
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and t.is_view


def memory_order(val: torch.Tensor, shape: Sequence[int]) -> list[int]:
    """The dims of ``shape`` from outermost to innermost *in memory* for an output laid out like ``val`` (largest
    stride first; size-1 dims anywhere): (N, C, H, W) channels_last → [0, 2, 3, 1]. Logical order otherwise."""
    order = list(range(len(shape)))
    if tuple(val.shape) == tuple(shape):
        order.sort(key=lambda d: -val.stride()[d] if shape[d] != 1 else 0)
    return order


def kernel_name(region, reduction: bool) -> str:
    """Inductor's naming: triton_poi_fused_<ops>_<n> for pointwise, triton_per_fused_… for a persistent reduction."""
    ops = sorted({n.target.overloadpacket.__name__.strip("_") for n in region.nodes if hasattr(n.target, "overloadpacket") and not is_view(n)})  # fmt: skip
    return f"triton_{'per' if reduction else 'poi'}_fused_{'_'.join(ops[:8])}_{next_kernel_index()}"


def check_region(region, stored: list[fx.Node], reductions: set) -> None:
    """Raise :class:`Unsupported` unless every member is an op the generator has a rule for (pointwise, a view, one of
    ``reductions``, a getitem of var_mean) and every tensor has static sizes and lives on one device."""
    if not stored:
        raise Unsupported("nothing in the region is used outside it")
    devices = set()
    for n in [*region.nodes, *region.external_inputs]:
        val = n.meta.get("val")
        if n in region.members:
            t = n.target
            if n.op != "call_function" or val is None:
                raise Unsupported(f"{n.name} has no meta['val']: capture the graph with fusion.regions.capture_aten", n)
            if t is operator.getitem:
                src = n.args[0]
                if getattr(src, "target", None) is not torch.ops.aten.var_mean.correction or src not in region.members:
                    raise Unsupported(f"no Triton expression for {n.name} = {src}[{n.args[1]}] ({src.target})", n)
                continue
            if isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable:
                raise Unsupported(f"{n.name} ({t}) changes its input in place", n)
            if not isinstance(t, torch._ops.OpOverload) or not (
                is_view(n) or t in reductions or torch.Tag.pointwise in t.tags
            ):
                raise Unsupported(
                    f"no Triton expression for {n.name} ({t}): neither pointwise, a view, nor a sum/mean/amax/amin/var/var_mean",
                    n,
                )
        for v in val if isinstance(val, (tuple, list)) else [val]:
            if isinstance(v, torch.Tensor):
                if not all(type(d) is int for d in (*v.shape, *v.stride())):
                    raise Unsupported(
                        f"{n.name} has symbolic sizes {tuple(v.shape)}: kernels are generated for static shapes"
                    )
                if v.numel() == 0:
                    raise Unsupported(f"{n.name} is empty {tuple(v.shape)}")
                if max(v.numel(), sum((s - 1) * st for s, st in zip(v.shape, v.stride(), strict=True))) >= 2**31:
                    raise Unsupported(f"{n.name} {tuple(v.shape)} needs 64-bit indexing; kernels index with int32")
                devices.add(v.device)
    if len(devices) > 1:
        raise Unsupported(f"tensors on several devices {sorted(map(str, devices))}")
