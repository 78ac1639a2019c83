"""The compiler's intermediate types, handed from stage to stage (Phases 6, 8, 9 and the machinery behind them).

    aten graph ──regions──▶ Region ──codegen──▶ KernelPlan (holding a Kernel) | Unsupported ──partition──▶ graph

* :class:`Region` — a group of fusible aten nodes one kernel computes (Phase 6 builds them; its lesson type
  ``fusion.regions.FusionRegion`` adds the byte costs).
* :class:`Kernel` — one generated kernel: its name, its Triton source, the region it computes.
* :class:`KernelPlan` — the generator's answer at compile time: the kernel, its argument nodes, specialisation, grid.
* :class:`LaunchPlan` — what the runtime holds instead: the same launch as data alone (no ``fx.Node``, no torch
  object): argument specs, the grid, and how each output comes back (``fusion.ir.views``: a stored tensor, a strided
  view of one, or aten steps by name). ``fusion.compiler.launch_plans`` builds it from a KernelPlan.
* :class:`Unsupported` — the generator's refusal, with the reason and the node it could not take.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.ir import kernel_ir
from fusion.ir.views import Recipe


class Unsupported(Exception):
    """The generator cannot compile this region; the message is the reason the report shows. ``node``: the member
    that has no rule (compile_graph cuts the region there), or None when the region as a whole is refused."""

    def __init__(self, reason: str, node: fx.Node | None = None) -> None:
        super().__init__(reason)
        self.node = node


class SplitRegion(Unsupported):
    """The region is fine in two kernels, not in one (its outputs walk shapes that do not broadcast together, as a
    Llama layer's rotated q (b, heads, s, d) and its k repeated for grouped-query attention (b, kv, rep, s, d)):
    compile_graph generates the outputs ``first`` (those that broadcast with the first) and the rest as two kernels,
    or cuts the region just before ``before``; no op is left to aten."""

    def __init__(self, reason: str, before: fx.Node, first: list[fx.Node]) -> None:
        super().__init__(reason)
        self.before, self.first = before, first  # the first output that does not fit; the outputs that do


@dataclass(eq=False)  # identity semantics: region_of maps every member to the *same* object
class Region:
    """A group of fusible nodes that one kernel can compute. ``nodes`` are in topological (graph) order."""

    nodes: list[fx.Node]
    index: int = -1  # position among the graph's regions, in order of their first node
    # node -> bytes, shared by all regions of one build_fusion_regions call: each value is measured once
    byte_cache: dict[fx.Node, int] = field(default_factory=dict, repr=False)

    @cached_property
    def members(self) -> frozenset[fx.Node]:
        return frozenset(self.nodes)

    @cached_property
    def external_inputs(self) -> list[fx.Node]:
        """Nodes outside the region that members read, each once, in order of first use."""
        members, seen = self.members, {}
        for node in self.nodes:
            for inp in node.all_input_nodes:
                if inp not in members:
                    seen[inp] = None
        return list(seen)

    @cached_property
    def external_outputs(self) -> list[fx.Node]:
        """Members whose value is needed after the region: a user outside it (the graph's output included)."""
        members = self.members
        return [node for node in self.nodes if any(user not in members for user in node.users)]

    @property
    def non_view_count(self) -> int:
        return sum(not is_view_node(n) for n in self.nodes)

    def piece(self, nodes: list[fx.Node]) -> Region:
        """A region of the same kind over some of this one's nodes (the partition cuts a region into pieces)."""
        return dataclasses.replace(self, nodes=nodes)

    def summary(self, width: int = 60) -> str:
        """'var_mean→getitem→…→add_1 (9 ops)': the ops of the region in order, shortened to ``width``."""
        names = "→".join(n.name for n in self.nodes)
        if len(names) > width:
            names = names[: width - 1] + "…"
        return f"{names} ({len(self.nodes)} nodes)"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.index}: {[n.name for n in self.nodes]})"


@dataclass
class Kernel:
    """A region's kernel: ``name`` (what the profiler shows), ``source`` (the Triton code), ``region``, ``kind``."""

    name: str
    source: str
    region: Region
    kind: str = "pointwise"  # or "reduction"
    ops: list[str] = field(default_factory=list)  # the aten ops it computes, one per line of the body

    def __repr__(self) -> str:
        return f"Kernel({self.name}, {len(self.ops)} ops)"


GeneratedKernel = Kernel  # the name Phase 8's text and older code use


class LaunchGeometry:
    """The launch grid of a plan with ``grid``, ``constexprs``, ``xnumel``, ``xblock``, ``min_xblock`` and
    ``elements`` (both plans)."""

    grid: int
    constexprs: dict[str, int]
    xnumel: int
    xblock: int
    min_xblock: int
    elements: int

    def launch_config(self, device: torch.device) -> tuple[int, dict[str, int]]:
        """(programs, constexprs): a pointwise kernel takes ``xblock`` (1024) elements per program on a GPU, and many
        more in the interpreter, where every program costs ~1 ms of Python; a reduction kernel takes XBLOCK of its
        rows (:func:`rows_per_program`)."""
        rblock = 0 if self.xnumel else dict(self.constexprs).get("RBLOCK", 0)
        cuda = device.type == "cuda"
        return launch_grid(self.xnumel or self.grid, rblock, cuda, self.xblock, self.min_xblock, self.elements)


@dataclass
class KernelPlan(LaunchGeometry):
    """Everything a launch needs besides the tensors, decided at code-generation time (in terms of the graph's
    nodes: the partition wires the call with them; the runtime gets the :class:`LaunchPlan` made from it)."""

    kernel: Kernel
    inputs: list[fx.Node]  # external inputs, in kernel-argument order
    input_meta: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]  # (shape, stride, dtype) specialised on
    stored: list[fx.Node]  # members written by the kernel, in argument order
    outputs: list[fx.Node]  # the region's external outputs, in the order the launch returns them
    grid: int  # rows of a reduction kernel (XBLOCK rows per program, chosen at launch); 0 for a pointwise kernel
    constexprs: dict[str, int]  # e.g. {"RBLOCK": 1024}
    num_warps: int = 4
    xnumel: int = 0  # elements of a pointwise kernel: XBLOCK and the grid are chosen at launch, per device
    xblock: int = 1024  # a pointwise kernel's elements a program on a GPU (fewer for a window's many loads)
    min_xblock: int = 1  # a reduction's fewest rows a program on a GPU (a column walk's: whole sectors a warp)
    ir: kernel_ir.Kernel | None = None  # the pure-data kernel IR the source was rendered from (C renders it again)
    launch: LaunchPlan | None = None  # the run-time plan, once the partition has made it
    elements: int = 0  # a reduction program's XBLOCK x RBLOCK on a GPU (0: ELEMENTS_PER_PROGRAM)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor a launch is specialised on (an input) or allocates (a stored output): sizes, strides, dtype's name."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str  # "float32": torch.<dtype>


@dataclass(frozen=True)
class InputSpec(TensorSpec):
    """An input: also its node's name (for errors) and whether its address can move from call to call (a graph
    input or a view, which may start anywhere: Triton's 16-byte alignment is checked per call for those)."""

    name: str = ""
    movable: bool = False


@dataclass(frozen=True)
class LaunchPlan(LaunchGeometry):
    """A kernel's launch as data alone, what ``fusion.kernels.triton_runtime.RegionKernel`` holds: no ``fx.Node``, no
    torch object. The launch passes ``(*inputs, *stored)`` (its *buffers*, in this order) and returns one tensor per
    recipe of ``results`` (``fusion.ir.views``)."""

    name: str  # the kernel's name (what the profiler shows), and its function's name in ``source``
    source: str  # Triton source
    kind: str  # "pointwise" or "reduction"
    ops: tuple[str, ...]  # the aten ops it computes, one per line of the body
    inputs: tuple[InputSpec, ...]
    stored: tuple[TensorSpec, ...]
    results: tuple[Recipe, ...]
    device: str  # where its tensors live ("cpu", "cuda:0"); "" for a kernel without tensors
    grid: int
    constexprs: tuple[tuple[str, int], ...]  # e.g. (("RBLOCK", 1024),)
    num_warps: int = 4
    xnumel: int = 0
    xblock: int = 1024
    min_xblock: int = 1
    ir: kernel_ir.Kernel | None = None  # the pure-data kernel IR (the C renderer's input)
    elements: int = 0  # a reduction program's XBLOCK x RBLOCK on a GPU (0: ELEMENTS_PER_PROGRAM)


# A reduction kernel's block of XBLOCK rows x RBLOCK lanes, as a table (Inductor autotunes over a few such configs):
# short rows share a program up to ~4096 elements (16 per thread at 8 warps), but never so many that fewer than
# FILL_PROGRAMS programs are left to spread over the SMs (an H100 has 132). The interpreter takes far more: each
# program costs it ~1 ms of Python.
ELEMENTS_PER_PROGRAM, FILL_PROGRAMS, INTERPRETER_ELEMENTS = 4096, 256, 16384
INTERPRETER_BLOCK = 16384  # a pointwise program's elements in the interpreter (a GPU's: the plan's xblock)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for 0 and 1): a block that holds ``n`` lanes."""
    return 1 << max(n - 1, 0).bit_length()


def rows_per_program(rows: int, rblock: int, cuda: bool = True, least: int = 1, elements: int = 0) -> int:
    """XBLOCK, a power of two: 1 for rows of 4096+ lanes, 32 for ConvNeXt's rows of 96 channels (RBLOCK 128); never
    below ``least`` to fill the GPU (a column walk's rows are neighbouring addresses: a warp must read whole sectors).
    ``elements``: the block's XBLOCK x RBLOCK on a GPU where not :data:`ELEMENTS_PER_PROGRAM` (a looped column walk's)."""
    budget = (elements or ELEMENTS_PER_PROGRAM) if cuda else INTERPRETER_ELEMENTS
    xblock = min(next_power_of_2(rows), max(1, budget // rblock))
    while cuda and xblock > least and -(-rows // xblock) < FILL_PROGRAMS:
        xblock //= 2
    return xblock


def launch_grid(
    numel: int, rblock: int, cuda: bool, xblock: int = 1024, least: int = 1, elements: int = 0
) -> tuple[int, dict[str, int]]:
    """(programs, constexprs) of a launch over ``numel`` elements (a pointwise kernel, ``rblock`` 0: ``xblock`` a
    program on a GPU, :data:`INTERPRETER_BLOCK` in the interpreter) or ``numel`` rows of ``rblock`` lanes (a
    reduction: :func:`rows_per_program` rows a program, never fewer than ``least`` on a GPU)."""
    if rblock:
        rows = rows_per_program(numel, rblock, cuda, least, elements)
        return -(-numel // rows), {"XBLOCK": rows, "RBLOCK": rblock}
    block = min(xblock if cuda else INTERPRETER_BLOCK, next_power_of_2(numel))
    return -(-numel // block), {"XBLOCK": block}


def row_warps(rows: int, rblock: int, least: int = 1, elements: int = 0) -> int:
    """Warps for a reduction kernel on a GPU: one per 512 elements of its block, 2 to 8."""
    return min(8, max(2, rows_per_program(rows, rblock, True, least, elements) * rblock // 512))
