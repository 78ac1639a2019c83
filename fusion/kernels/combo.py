"""One kernel for many independent dtype casts: a combo kernel (Inductor's combo kernels, horizontal fusion of
unrelated pointwise nodes), for ``fusion::combo_cast`` (Phase 9's pass ``combo_casts``, ``fusion.compiler.combo_casts``).

Under autocast every weight is cast to bfloat16 (or float16) before its GEMM, and every weight's gradient back to
float32: one tiny kernel each, launched from Python, in a training step that is CPU-bound (a BERT step: ~245 casts).
Here a list of tensors is cast in ONE launch. Tensor ``i`` has ``n_i`` elements copied flat, in ``ceil(n_i / BLOCK)``
programs; the programs of the launch are partitioned by static ranges, one after the other::

    tensor:     0        1    2 (empty)   3
    programs: [0, 4)  [4, 5)   -        [5, 9)      grid = 9; program p finds its tensor by comparing p with
                                                    the ranges' starts (a binary tree of ifs: log2(N) compares)

Each branch loads ``BLOCK`` elements of its input, converts them (``.to(dtype)``: round to nearest even, as eager's
casts; NaN stays NaN, infinities and subnormals as the GPU converts them) and stores them. Element counts and dtypes
are in the source (one kernel per (counts, dtypes, target dtype), cached), so the kernel takes only pointers.

A flat copy is right for any *dense* tensor (non-overlapping, its elements filling ``numel`` consecutive slots:
contiguous, or a permutation of contiguous such as a transposed weight gradient) when the output has the same
strides: :func:`combo_cast` allocates each output with ``torch.empty_like(x, dtype=dtype)``, which keeps a dense
input's strides, and copies any other input with aten (``copy_``): never a wrong answer.

On CUDA the kernel is compiled by Triton; its first call goes through Triton's JIT, later calls through torch's
static launcher (``launchers.static_launcher``, the one ``triton_runtime.Launcher`` uses), falling back to the JIT
for good if that fails. On a CPU the copies are a loop of aten casts (:func:`combo_cast`), or, where the renderer of
CPU kernels is Triton's interpreter (``FUSION_RENDERER=triton``; tests), the same kernel interpreted.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence

import torch

from fusion.aten.nodes import is_dense
from fusion.kernels import c_runtime
from fusion.kernels import triton_runtime as rt
from fusion.kernels.launchers import static_launcher
from fusion.kernels.triton_lang import tl_dtype

BLOCK = 1024  # elements a program copies (4 warps: 8 elements a thread)
NUM_WARPS = 4
INT32_LIMIT = 2**31 - 1  # offsets past this need int64 arithmetic (the kernel then computes them in int64)

FLOATS = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))  # what it casts from and to


def programs(numels: Sequence[int]) -> list[int]:
    """The first program of each tensor, then the grid: ``starts[i]`` to ``starts[i + 1]`` copy tensor ``i``."""
    starts = [0]
    for n in numels:
        starts.append(starts[-1] + -(-n // BLOCK))
    return starts


def kernel_source(numels: Sequence[int], dtypes: Sequence[torch.dtype], dst: torch.dtype) -> tuple[str, str]:
    """(source, name) of the combo kernel casting tensors of ``numels`` elements and ``dtypes`` to ``dst``, flat.
    Arguments: the inputs' pointers, then the outputs'. Tensors of no element get no program (and no branch)."""
    if not numels or len(numels) != len(dtypes):
        raise ValueError(f"combo kernel of {len(numels)} tensors and {len(dtypes)} dtypes: one dtype per tensor, >= 1")
    bad = sorted({str(d) for d in (*dtypes, dst) if d not in FLOATS})
    if bad:
        raise ValueError(f"combo kernel: {bad} is not one of {sorted(map(str, FLOATS))} (cast those with aten)")
    key = repr((tuple(numels), tuple(map(str, dtypes)), str(dst), BLOCK))
    name = "combo_cast_" + hashlib.sha256(key.encode()).hexdigest()[:12]
    starts = programs(numels)
    wide = any(n + BLOCK > INT32_LIMIT for n in numels)  # an offset past int32: int64 program ids
    ins = [f"in{i}" for i in range(len(numels))]
    outs = [f"out{i}" for i in range(len(numels))]
    lines = [
        f"# {len(numels)} casts to {dst} in one launch: {starts[-1]} programs of {BLOCK} elements",
        "import triton",
        "import triton.language as tl",
        "",
        "",
        "@triton.jit",
        f"def {name}({', '.join(ins + outs)}):",
        "    pid = tl.program_id(0)" + (".to(tl.int64)" if wide else ""),
    ]
    live = [i for i, n in enumerate(numels) if n > 0]

    def branch(members: list[int], depth: int) -> None:
        pad = "    " * depth
        if len(members) == 1:  # each branch its own names: nothing is defined on both sides of an if (no yields)
            i, to = members[0], tl_dtype(dst)
            first = "pid" if starts[i] == 0 else f"(pid - {starts[i]})"
            lines.append(f"{pad}offs{i} = {first} * {BLOCK} + tl.arange(0, {BLOCK})")
            if numels[i] % BLOCK:
                lines.append(f"{pad}mask{i} = offs{i} < {numels[i]}")
                lines.append(f"{pad}x{i} = tl.load(in{i} + offs{i}, mask=mask{i})")
                lines.append(f"{pad}tl.store(out{i} + offs{i}, x{i}.to({to}), mask=mask{i})")
            else:
                lines.append(f"{pad}x{i} = tl.load(in{i} + offs{i})")
                lines.append(f"{pad}tl.store(out{i} + offs{i}, x{i}.to({to}))")
            return
        half = len(members) // 2
        lines.append(f"{pad}if pid < {starts[members[half]]}:")
        branch(members[:half], depth + 1)
        lines.append(f"{pad}else:")
        branch(members[half:], depth + 1)

    if live:
        branch(live, 1)
    else:
        lines.append("    pass")
    return "\n".join(lines) + "\n", name


class ComboKernel:
    """The combo kernel of one (counts, dtypes, target dtype, device type): launched by :meth:`__call__`."""

    def __init__(self, numels: tuple[int, ...], dtypes: tuple[torch.dtype, ...], dst: torch.dtype) -> None:
        self.numels, self.dtypes, self.dst = numels, dtypes, dst
        self.source, self.name = kernel_source(numels, dtypes, dst)
        self.grid = programs(numels)[-1]
        self.direct = None  # torch's static launcher, after the first CUDA call
        self.fallback = ""  # why the direct path is off
        self.failed = ""  # why the kernel itself is off (CUDA: Triton refused it): aten copies instead
        self.launches = 0

    def __call__(self, xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        if self.grid == 0:
            return
        if self.direct is not None and not any(x.data_ptr() & 15 for x in xs):
            try:
                self.direct(*xs, *outs)
                self.launches += 1
                return
            except Exception as e:  # noqa: BLE001 - any failure: the JIT call, from now on (a launch only writes outs)
                self.direct, self.fallback = None, f"static launch failed ({type(e).__name__}: {str(e)[:120]})"
        device = xs[0].device
        if self.failed:
            _copy(xs, outs)
            return
        try:
            fn = rt.load_kernel(self.source, self.name, interpret=device.type != "cuda")
            compiled = fn[(self.grid,)](*xs, *outs, num_warps=NUM_WARPS)
        except Exception as e:  # CUDA: Triton could not compile or launch it; aten copies, for good (the interpreter,
            if device.type != "cuda":  # tests, raises: a bug must be seen)
                raise
            self.failed = f"{type(e).__name__}: {str(e)[:200]}"
            warnings.warn(
                f"combo kernel {self.name} failed ({self.failed}); its casts run as aten copies", stacklevel=2
            )
            _copy(xs, outs)
            return
        if (
            device.type == "cuda"
            and self.direct is None
            and not self.fallback
            and not any(x.data_ptr() & 15 for x in xs)
        ):
            try:
                self.direct = static_launcher(compiled, self.grid, 2 * len(xs), device)
            except Exception as e:  # noqa: BLE001 - no static launcher here: the JIT call each time
                self.fallback = f"no static launcher ({type(e).__name__}: {str(e)[:120]})"


def _copy(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
    for x, out in zip(xs, outs, strict=True):
        out.copy_(x)


_KERNELS: dict[tuple, ComboKernel] = {}


def kernel_for(xs: Sequence[torch.Tensor], dst: torch.dtype) -> ComboKernel:
    """The cached combo kernel casting tensors like ``xs`` (their element counts and dtypes) to ``dst``."""
    key = (tuple(x.numel() for x in xs), tuple(x.dtype for x in xs), dst, xs[0].device.type)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = ComboKernel(key[0], key[1], dst)
    return k


def use_triton(device: torch.device) -> bool:
    """Does a combo cast on ``device`` run the Triton kernel? On CUDA, yes; on a CPU where CPU kernels are Triton's
    interpreter (``FUSION_RENDERER=triton``); else the aten loop."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and c_runtime.chosen() == "triton" and rt.triton_status()[0]


class ComboPlan:
    """What a combo cast of inputs like ``xs`` to ``dtype`` does, worked out once: each output's (size, stride,
    dtype), allocated by the fast allocator of the generated kernels (``triton_runtime.empty_strided_on``); which
    inputs the combo kernel copies (dense, floating, not empty) and which aten copies (the rest, if not empty)."""

    def __init__(self, xs: Sequence[torch.Tensor], dtype: torch.dtype, triton: bool) -> None:
        device = xs[0].device
        self.specs = []
        for x in xs:
            out = torch.empty_like(x, dtype=dtype)  # once: the layout empty_like gives (a dense input's strides)
            self.specs.append((tuple(out.shape), tuple(out.stride()), dtype))
        picked = [i for i, x in enumerate(xs) if x.device == device and x.dtype in FLOATS and x.numel() and is_dense(x)]
        self.picked = picked if triton and dtype in FLOATS else []
        self.copied = [i for i, x in enumerate(xs) if x.numel() and i not in set(self.picked)]
        self.kernel = kernel_for([xs[i] for i in self.picked], dtype) if self.picked else None
        self.every = len(self.picked) == len(xs)  # the kernel copies them all: no lists to pick from
        self.alloc = rt.empty_strided_on(device)

    def __call__(self, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        alloc = self.alloc
        outs = [alloc(size, stride, dtype) for size, stride, dtype in self.specs]
        if self.kernel is not None:
            if self.every:
                self.kernel(xs, outs)
            else:
                self.kernel([xs[i] for i in self.picked], [outs[i] for i in self.picked])
        for i in self.copied:
            outs[i].copy_(xs[i])
        return outs


_PLANS: dict[tuple, ComboPlan] = {}


def combo_cast(xs: Sequence[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """Each of ``xs`` cast to ``dtype`` (a new tensor each, as ``empty_like(x, dtype=dtype)`` lays it out: a dense
    input's strides). The dense floating-point inputs of one device are copied by one combo kernel where
    :func:`use_triton` says so; every other input by aten's ``copy_`` (the same rounding; an empty one: nothing).
    The plan (:class:`ComboPlan`) is cached per (shapes, strides, dtypes, device)."""
    if not xs:
        return []
    device = xs[0].device
    triton = use_triton(device)
    key = (dtype, device, triton, *[(x.shape, x.stride(), x.dtype, x.device) for x in xs])
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = ComboPlan(xs, dtype, triton)
    return plan(xs)


class ComboCall:
    """``fusion::combo_cast`` as one node of a compiled graph calls it (pass ``python_bindings`` puts one per node):
    the plan of its first call, kept. Later calls trust their inputs as a generated kernel's ``Launcher`` does: the
    graph's entry is checked (Dynamo's guards) and every tensor inside it follows from that, so the node's inputs
    keep their shapes, strides and dtypes. What this saves per call, against the op: the dispatcher's boxing of two
    lists of tensors and the plan's key, four attributes read from every input (a combo of 58 weights: tens of
    microseconds of CPU in a step that waits on its CPU)."""

    def __init__(self, name: str) -> None:
        self.__name__ = self.__qualname__ = name  # how the compiled graph's code names it
        self.plan: ComboPlan | None = None

    def __call__(self, xs: Sequence[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
        plan = self.plan
        if plan is None:
            if not xs:
                return []
            plan = self.plan = ComboPlan(xs, dtype, use_triton(xs[0].device))
        return plan(xs)


def combo_cast_fake(xs: Sequence[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """The op's outputs on fake (meta) tensors: the shapes and strides :func:`combo_cast` gives."""
    return [torch.empty_like(x, dtype=dtype) for x in xs]


NAME = "fusion::combo_cast"


def _define() -> torch._ops.OpOverload:
    """Define ``fusion::combo_cast`` once per process: CPU and CUDA implementations, and a fake one."""
    if not hasattr(torch.ops.fusion, "combo_cast"):
        lib = torch.library.Library("fusion", "FRAGMENT")
        lib.define("combo_cast(Tensor[] xs, ScalarType dtype) -> Tensor[]")
        lib.impl("combo_cast", combo_cast, "CompositeExplicitAutograd")
        torch.library.register_fake(NAME, combo_cast_fake, lib=lib)
        _define.lib = lib  # the registration lives as long as the Library object
    return torch.ops.fusion.combo_cast.default


COMBO_CAST = _define()  # fusion::combo_cast(Tensor[] xs, ScalarType dtype) -> Tensor[] (pass combo_casts' node)
