"""What code generation writes besides the ops: the Triton renderer's helper functions (reductions' combine
functions, Philox), tanh's series, dtype names, block sizes, kernel names, memory order, and the schema names of the
prims it takes. What a kernel takes and how it walks its region (the rule check, the rows of a reduction) is
``fusion.kernels.rows``; the ops' Triton spellings are Phase 8's (``fusion/codegen.py``) and
``fusion.kernels.triton_render``'s."""

from __future__ import annotations

import io
import itertools
import math
import tokenize
from collections.abc import Sequence

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node

# Elements a program of a pointwise kernel takes on a GPU: 1024, and 512 where the kernel computes a depthwise
# convolution (9 or 25 loads an element, the ops before the window again at each): 1.04-1.7x faster on MobileNetV2's
# layers on an H200 (scripts/gpu_probe_depthwise.py, results h200-2026-11-25-aq2-probe_depthwise.json).
POINTWISE_BLOCK, WINDOW_BLOCK = 1024, 512


_names = itertools.count()


def next_kernel_index() -> int:
    """A process-wide counter: kernel names are unique per process, as Inductor's are (``..._0``, ``..._1``)."""
    return next(_names)


# Ops the generators take outside the learner's op table (``compiler.lowering``):
# ``prims.fma`` (Inductor's prim: one rounding, ``tl.fma``, C's ``fma``) and ``fusion.philox_rand``
# (``fusion.compiler.random_ops``: Philox from a seed tensor and the element's position, ``tl.rand``), each
# recognised by its schema name: kernels/ imports neither torch._inductor nor the compiler that defines them.
FMA, PHILOX_RAND = "prims::fma", "fusion::philox_rand"


def schema_name(node: fx.Node) -> str:
    return getattr(getattr(node.target, "_schema", None), "name", "") if node.op == "call_function" else ""


def is_philox_rand(node: fx.Node) -> bool:
    return schema_name(node) == PHILOX_RAND


def is_fma(node: fx.Node) -> bool:
    return schema_name(node) == FMA


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(math.prod(shape[d + 1 :]) for d in range(len(shape)))


def tl_dtype(dtype: torch.dtype) -> str:
    names = {torch.bool: "int1", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    return "tl." + names.get(dtype, str(dtype).removeprefix("torch."))


def rounded(value: object, dtype: torch.dtype) -> object:
    """A Python float as ``dtype`` holds it (0.1 in float16 is 0.0999755859375); anything else unchanged."""
    if isinstance(value, float) and dtype.is_floating_point and math.isfinite(value):
        return torch.tensor(value, dtype=dtype).item()
    return value


TANH_SERIES = (-1 / 3, 2 / 15, -17 / 315, 62 / 2835, -1382 / 155925, 21844 / 6081075, -929569 / 638512875)


COMBINE_FUNCTIONS = [
    "@triton.jit", "def _add(a, b):", "    return a + b", "", "",
    "@triton.jit", "def _maximum(a, b):", "    return tl.where(a != a, a, tl.where(a > b, a, b))", "", "",
    "@triton.jit", "def _minimum(a, b):", "    return tl.where(a != a, a, tl.where(a < b, a, b))", "",
]  # fmt: skip


# Philox4x32-10, counter (offset, 0, 0, 0), key (seed low, seed high), then Triton's uint_to_uniform_float: bit for
# bit ``tl.rand(seed, offset)`` (triton/language/random.py), written out because the interpreter cannot call
# Triton's own @jit helpers; ``fusion.compiler.random_ops`` has the same in torch, ``c_prelude`` in C.
RAND_FUNCTION = [
    "@triton.jit", "def _philox_rand(seed, offset):",
    "    seed = seed.to(tl.uint64)",
    "    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)",
    "    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)",
    "    c0 = offset.to(tl.uint32)",
    "    c1 = c0 * 0",
    "    c2 = c1",
    "    c3 = c1",
    "    for _ in tl.static_range(10):",
    "        _c0, _c2 = c0, c2",
    "        c0 = tl.umulhi(0xCD9E8D57, _c2) ^ c1 ^ k0",
    "        c2 = tl.umulhi(0xD2511F53, _c0) ^ c3 ^ k1",
    "        c1 = _c2 * 0xCD9E8D57",
    "        c3 = _c0 * 0xD2511F53",
    "        k0 = k0 + 0x9E3779B9",
    "        k1 = k1 + 0xBB67AE85",
    "    x = c0.to(tl.int32, bitcast=True)",
    "    x = tl.where(x < 0, ~x, x)",
    "    return x * 4.6566127342e-10", "", "",
]  # fmt: skip


def memory_order(val: torch.Tensor, shape: Sequence[int]) -> list[int]:
    """The dims of ``shape`` from outermost to innermost *in memory* for an output laid out like ``val`` (largest
    stride first; size-1 dims anywhere): (N, C, H, W) channels_last → [0, 2, 3, 1]. Logical order otherwise."""
    order = list(range(len(shape)))
    if tuple(val.shape) == tuple(shape):
        order.sort(key=lambda d: -val.stride()[d] if shape[d] != 1 else 0)
    return order


# Triton's compile options of every launch and warm-up: a kernel with indexed reads is compiled with debug=True (its
# index checks are device_asserts, which Triton emits only then), and debug must not add int32 overflow checks to
# all its index arithmetic as well (Inductor passes the same option)
OPTIONS = {"sanitize_overflow": False}
UNNAMED = "KERNEL_NAME"  # the name a kernel's draft source is written with; kernel_name() puts the real one in
_named: dict[tuple[str, str], str] = {}  # (prefix, code without comments) -> the name that code was first given


def kernel_name(region, launch, draft: str) -> tuple[str, str]:
    """(name, source) for a kernel whose ``draft`` source calls it :data:`UNNAMED`, rendered with ``launch``
    (``triton_launch.Launch``: its kind, and whether its rows loop). Inductor's naming:
    triton_poi_fused_<ops>_<n> for pointwise, triton_per_fused_… for a persistent reduction (a row in one block),
    triton_red_fused_… for a looped one. A kernel whose code is an earlier kernel's, comments aside (a transformer's
    layers, ResNet's repeated blocks), gets that kernel's name: the runtime loads one module for both, and Triton
    compiles it once (Inductor's ``src_to_kernel`` does the same). Its source keeps the comments of its own region."""
    ops = sorted({n.target.overloadpacket.__name__.strip("_") for n in region.nodes if hasattr(n.target, "overloadpacket") and not is_view_node(n, getitem=False)})  # fmt: skip
    kind = "poi" if launch.kind == "pointwise" else "red" if launch.looped else "per"  # triton_launch.Launch
    prefix = f"triton_{kind}_fused_{'_'.join(ops[:8])}"
    key = (prefix, code_only(draft))
    if key not in _named:
        _named[key] = f"{prefix}_{next_kernel_index()}"
    return _named[key], draft.replace(f"def {UNNAMED}(", f"def {_named[key]}(", 1)


def code_only(source: str) -> str:
    """``source`` without its comments and blank lines (read by ``tokenize``: a '#' inside a string stays): two
    kernels with the same code compile to the same binary, whatever nodes their comments name."""
    cut = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            cut[tok.start[0]] = tok.start[1]
    lines = (ln[: cut[i]].rstrip() if i in cut else ln for i, ln in enumerate(source.splitlines(), 1))
    return "\n".join(ln for ln in lines if ln.strip())
