"""The kernel IR: one fused kernel as pure data, the hand-off between the lowering and a renderer.

    FusionRegion ──lowering (fusion.compiler.lowering)──▶ Kernel ──renderer (fusion.kernels.c_render)──▶ source

Every record is a frozen dataclass of strings, ints, floats and tuples: no ``fx.Node``, no torch object (a dtype is
its name, ``"float32"``), so a kernel can be printed, hashed, compared, pickled and rendered to any language. The shape
follows tinygrad's UOps (a flat list of SSA values, one op each, rendered through one ``code_for_op`` table per
language) and early TorchInductor's loop-level IR (loops over the output's dimensions, loads and stores at an index
expression of the loop variables, reductions folded over the innermost loops).

* :class:`Buffer` — a kernel argument: sizes, strides (in elements), dtype, offset, and whether it is read or written.
* Index expressions — :class:`Affine` (``sum(coef * atom) + const``) of atoms :class:`Var` (a loop variable),
  :class:`FloorDiv` and :class:`Mod` (a reshape that could not be simplified away). Every index is >= 0.
* Statements — :class:`Load` (masked or not; at an index the kernel computes: ``indirect``), :class:`Index` (an
  index as a value), :class:`Const`, :class:`Op` (one pointwise op: :data:`OPS`), :class:`Reduce` (folds a value over
  the reduction loops), :class:`ReduceLoop` (a loop over the reduced dims: its body and its reductions),
  :class:`Store`.
* :class:`Kernel` — the whole kernel: its buffers, its loops (outermost first), the reduction loops, the body.

Values are named ``t<i>`` and hold their *compute* dtype: float16/bfloat16 values are held in float32 (rounded to
their dtype by the ops ``round_float16``/``round_bfloat16``), as the Triton path holds them.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")

# Pointwise ops a renderer must have a line for (its ``code_for_op`` table), by arity. ``to`` converts to the Op's
# dtype with torch's rules (float -> integer truncates, anything -> bool is != 0); ``round_float16``/``round_bfloat16``
# round a float32 to the nearest half value (ties to even) and keep it in float32. Integer ``floordiv``/``remainder``
# follow torch's signs (Python's); ``truncdiv`` rounds toward zero. ``maximum``/``minimum`` propagate NaN.
# ``truediv`` is the target's float division (Triton's ``/`` on a GPU: within 2 ulp, as Inductor's); ``exact_div`` is
# rounded as IEEE on every target (a mean, a variance, a division rounded to an integer after it).
UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "sigmoid", "erf", "tanh", "reciprocal", "relu", "logical_not")
UNARY += ("to", "round_float16", "round_bfloat16", "identity", "ceil", "floor", "trunc", "sign", "sin", "cos")
BINARY = ("add", "sub", "mul", "truediv", "exact_div", "floordiv", "truncdiv", "remainder", "maximum", "minimum", "pow")
BINARY += (
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "and",
    "or",
    "bitwise_and",
    "bitwise_or",
)  # and/or: logical; bitwise: each bit
# ``rand(seed, position)``: an int64 seed and an int64 position -> float32 in [0, 1): Philox4x32-10 keyed by the seed,
# counter (position, 0, 0, 0), Triton's uniform of the first word (bit for bit ``tl.rand``: fusion.compiler.random_ops)
BINARY += ("rand",)
TERNARY = ("where", "fma")  # fma(a, b, c): a * b + c rounded once
OPS = frozenset(UNARY + BINARY + TERNARY)
REDUCE_OPS = ("sum", "max", "min")  # sum starts at +0.0; max/min propagate NaN


# ----------------------------------------------------------------------------------------------------------------------
# Index expressions


@dataclass(frozen=True)
class Var:
    """A loop variable, ``0 <= name < size`` of its :class:`Loop`."""

    name: str


@dataclass(frozen=True)
class FloorDiv:
    of: Affine
    by: int


@dataclass(frozen=True)
class Mod:
    of: Affine
    by: int


Atom = Var | FloorDiv | Mod


@dataclass(frozen=True)
class Affine:
    """``sum(coef * atom for coef, atom in terms) + const``: the index of one dimension, or an offset."""

    terms: tuple[tuple[int, Atom], ...] = ()
    const: int = 0

    def variables(self) -> frozenset[str]:
        out: set[str] = set()
        for _, atom in self.terms:
            out |= {atom.name} if isinstance(atom, Var) else atom.of.variables()
        return frozenset(out)


# ----------------------------------------------------------------------------------------------------------------------
# Buffers, loops, statements


@dataclass(frozen=True)
class Buffer:
    """A kernel argument: ``name`` (``in0``, ``out0``), element ``sizes`` and ``strides``, ``dtype``, ``offset`` (in
    elements, from the pointer passed), ``output`` (written by the kernel)."""

    name: str
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    offset: int = 0
    output: bool = False


@dataclass(frozen=True)
class Loop:
    var: str
    size: int


@dataclass(frozen=True)
class Load:
    """``out = buffer[offset]`` converted to ``dtype`` (the compute dtype: a float16 element becomes a float32).
    ``mask``: a bool value; where it is false nothing is read (the offset may lie outside the buffer: a cat input's
    shifted index) and ``out`` is 0.

    ``indirect``: ``(value, size, stride)`` triples, an indexed read (an embedding's row, a gathered bias): the element
    at ``offset + sum(value * stride)``, each ``value`` an int64 computed in the kernel that must lie in
    ``[0, size)``. A renderer checks it: a value outside is reported as eager reports it (an ``IndexError``), and
    nothing outside the buffer is ever read."""

    out: str
    buffer: str
    offset: Affine
    dtype: str
    mask: str | None = None
    indirect: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True)
class Index:
    """``out = expr`` as an int64 value (a cat compares its index along the cat dim with each input's range)."""

    out: str
    expr: Affine


@dataclass(frozen=True)
class Const:
    out: str
    value: bool | int | float
    dtype: str


@dataclass(frozen=True)
class Op:
    """``out = op(*args)`` computed in ``dtype`` (for ``to``: converted to it; comparisons give ``bool``)."""

    out: str
    op: str
    args: tuple[str, ...]
    dtype: str


@dataclass(frozen=True)
class Reduce:
    """Inside a :class:`ReduceLoop`: fold ``value`` into ``out`` with ``op`` (``sum``/``max``/``min``); ``out`` is
    defined after the loop."""

    out: str
    op: str
    value: str
    dtype: str


@dataclass(frozen=True)
class ReduceLoop:
    """A loop over the kernel's reduction loops (all of them, nested), running ``body`` once per element of a row."""

    body: tuple[Statement, ...]


@dataclass(frozen=True)
class Store:
    """``buffer[offset] = value`` (converted from its compute dtype to the buffer's dtype)."""

    buffer: str
    offset: Affine
    value: str


Statement = Load | Index | Const | Op | Reduce | ReduceLoop | Store


@dataclass(frozen=True)
class Kernel:
    """One fused kernel. ``loops``: the outer loops, outermost first (a pointwise kernel walks its output in memory
    order, the innermost loop contiguous; a reduction kernel walks its rows); ``reduce_loops``: the dims a row
    spans (empty for a pointwise kernel). ``body`` runs once per element of ``loops``; its :class:`ReduceLoop`
    statements walk the row. ``buffers``: the arguments in call order (inputs, then outputs)."""

    name: str
    kind: str  # "pointwise" or "reduction"
    buffers: tuple[Buffer, ...]
    loops: tuple[Loop, ...]
    reduce_loops: tuple[Loop, ...]
    body: tuple[Statement, ...]
    ops: tuple[str, ...] = ()  # the aten ops it computes, for the report
    in_place: tuple[tuple[str, str], ...] = ()  # (input, output) buffers given the same memory (memory_plan)

    def statements(self) -> list[Statement]:
        """Every statement, the bodies of reduce loops included, in order."""
        out: list[Statement] = []
        for s in self.body:
            out += [s, *s.body] if isinstance(s, ReduceLoop) else [s]
        return out

    def checks_indices(self) -> bool:
        """Does a load read at an index the kernel computes (``Load.indirect``): must a renderer check ranges?"""
        return any(isinstance(s, Load) and s.indirect for s in self.statements())

    def describe(self) -> str:
        """A readable listing (what a renderer starts from)."""
        lines = [f"kernel {self.name} ({self.kind})"]
        lines += [f"  {'out' if b.output else 'in '} {b.name}: {b.dtype}{list(b.sizes)} strides {list(b.strides)}"
                  for b in self.buffers]  # fmt: skip
        lines.append("  for " + ", ".join(f"{lp.var} < {lp.size}" for lp in self.loops) or "  (no loops)")
        for s in self.body:
            if isinstance(s, ReduceLoop):
                lines.append("    over the row " + ", ".join(f"{lp.var} < {lp.size}" for lp in self.reduce_loops))
                lines += [f"      {_describe(t)}" for t in s.body]
            else:
                lines.append(f"    {_describe(s)}")
        return "\n".join(lines)


def _describe(s: Statement) -> str:
    if isinstance(s, Load):
        masked = f" if {s.mask}" if s.mask else ""
        at = index_text(s.offset) + "".join(f" + {st}*{v} ({v} < {n})" for v, n, st in s.indirect)
        return f"{s.out} = load {s.buffer}[{at}]{masked} : {s.dtype}"
    if isinstance(s, Index):
        return f"{s.out} = index {index_text(s.expr)} : int64"
    if isinstance(s, Const):
        return f"{s.out} = {s.value!r} : {s.dtype}"
    if isinstance(s, Op):
        return f"{s.out} = {s.op}({', '.join(s.args)}) : {s.dtype}"
    if isinstance(s, Reduce):
        return f"{s.out} = reduce {s.op}({s.value}) : {s.dtype}"
    if isinstance(s, Store):
        return f"store {s.buffer}[{index_text(s.offset)}] = {s.value}"
    return repr(s)


def index_text(e: Affine) -> str:
    """An index as text with ``//`` and ``%`` (every value >= 0, so C's ``/`` and ``%`` compute the same)."""
    terms = []
    for coef, atom in e.terms:
        a = atom.name if isinstance(atom, Var) else (
            f"({index_text(atom.of)} // {atom.by})" if isinstance(atom, FloorDiv) else f"({index_text(atom.of)} % {atom.by})"
        )  # fmt: skip
        terms.append(a if coef == 1 else f"{coef}*{a}")
    if e.const or not terms:
        terms.append(str(e.const))
    return " + ".join(terms)
