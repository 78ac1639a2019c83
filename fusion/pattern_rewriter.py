"""Phase 3 — pattern rewriting: state the fusion as "this subgraph becomes that one", let torch.fx find it.

Run it:   uv run python -m fusion.pattern_rewriter [--quick]
Test it:  uv run pytest -m phase3

What you learn
--------------
* ``torch.fx.subgraph_rewriter.replace_pattern(gm, pattern, replacement)`` traces two tiny Python functions into
  graphs and swaps every non-overlapping match of the first for a copy of the second. Declarative rules like this
  are how production compilers state fusions (Inductor's ``register_replacement``, TensorRT's and XLA's pattern
  tables): the rule says *what* to fuse, the matcher decides *where*.
* The rule here: ``relu(x @ w + b)``, three kernels (matmul, add, relu) with two round trips of the
  (M, N) intermediate through memory, becomes one call to :func:`fused_matmul_add_relu`, which on a 2-D ``x``
  is ``torch._addmm_activation(b, x, w)``: one GEMM whose epilogue adds the bias and applies the ReLU while the
  tile is still in registers (one cuBLASLt kernel on CUDA).
* The sharp edge: **matching is syntactic**. The matcher compares node targets, so ``x @ w`` (operator.matmul),
  ``torch.matmul(x, w)`` and ``torch.mm(x, w)`` are three different nodes; ``h + b`` and ``b + h`` have their
  arguments in a different order; ``torch.relu(h)``, ``F.relu(h)`` and ``h.relu()`` are three targets again
  (the last a ``call_method``). One hand-written pattern catches one spelling and silently misses the others.
* Legality comes from the matcher, not from the rule: a match is only taken when every *internal* node of the
  pattern (the matmul and the add) is read by nothing outside it. ``h = x @ w + b; return relu(h) + h`` is left
  alone, because the fused call would never produce the ``h`` that the final add needs.
* ``torch.fx.wrap`` keeps the fused function one ``call_function`` node: the tracer records the call, not its body.

The idea: generate the pattern set
----------------------------------
There are two ways to catch every spelling:

1. **Normalize first**: a hand-written pre-pass rewrites every spelling to one canonical form (``torch.matmul``,
   ``operator.add`` with the matmul on the left, ``torch.relu``), then one pattern does the work. One pass over
   the graph, but that pre-pass is exactly the node-walking code Phase 2 wrote by hand, the declarative rule no
   longer describes what it matches, and it rewrites nodes that end up fused nowhere.
2. **Generate the set** (what this module does, and what Inductor does with its pattern variants): write the rule
   *once*, parameterized by spelling, and take the product of the spelling tables ``MATMULS`` x ``ADDS`` x
   ``RELUS`` — 3 x 4 x 3 = **36 patterns**, each an honest, readable rule. The price is multiplicative: one more
   spelling of any op multiplies the set, the pass runs the matcher once per pattern (36 walks over the graph),
   and tracing the 72 rule functions costs more than all the rewrites, so the traced rules are cached (Inductor
   ships its traced patterns pre-serialized). Anything outside the tables (``x.matmul(w)``, ``torch.add(h, b,
   alpha=2)``, an ``nn.ReLU`` module) is not matched: still correct, not fused, and the report says why.

No ``match_filters`` are needed for legality: the matcher refuses matches whose intermediates escape, and
:func:`fused_matmul_add_relu` decides *per call*, on the real shapes, dtypes and autograd state, whether the
one-kernel path applies. (``replace_pattern_with_filters`` is called for the replacement nodes it returns.)

    >>> from fusion import models
    >>> gm = fuse_matmul_add_relu(models.MatmulAddReLU(32, 64, 16))
    >>> fused_call_count(gm)
    2
    >>> {name: n for name, n in pattern_counts(gm).items() if n}
    {'torch.relu(x @ w + b)': 2}
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.benchmark as benchmark
from torch.fx.subgraph_rewriter import replace_pattern_with_filters

from fusion import models
from fusion.common import (
    FusionReport,
    aten_ops,
    attach_report,
    copy_to_graph_module,
    finish_rewrite,
    heading,
    lesson_cli,
    max_abs_diff,
    node_table,
    report_of,
    table,
    target_name,
)
from fusion.compiler import registry

PATTERN = "MatMul+Add+ReLU"
PATTERN_COUNTS_KEY = "pattern_counts"

# ----------------------------------------------------------------------------------------------------------------------
# The fused op


@torch.fx.wrap  # the tracer records a call to this function instead of tracing into it: one call_function node
def fused_matmul_add_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | float) -> torch.Tensor:
    """``relu(x @ w + b)`` as one call: a single ``torch._addmm_activation`` GEMM where that is exact, else unfused.

    The one-kernel path is the GEMM epilogue's: ``x`` of shape (..., K) (leading dims folded into M, exactly as
    ``torch.matmul`` folds them), ``w`` of shape (K, N), one bias value per output column (a bias of shape (N,)),
    one dtype and one device (the unfused ``+`` would type-promote, addmm refuses), and no autograd
    (``_addmm_activation`` has no derivative). Every other input the unfused expression accepts (1-D ``x`` or
    ``w``, a bias of shape (M, 1), (1,), a scalar, a float, a broadcast batch bias, ``x``/``w``/``b`` that require
    grad) takes the unfused path, which *is* the original expression. (addmm would take an (M, 1) bias of a 2-D ``x``
    exactly, as the lesson measures, but by copying it into the output first: not the epilogue, so not fused.)

    "Exact" is the algebra, not the bits: the epilogue adds the bias to the unrounded product, where the unfused
    expression first rounds ``x @ w`` to the output dtype. In float32/float64 the two agree to rounding; in
    float16/bfloat16 they can differ by an ulp or two (the fused result is the more accurate one).

    >>> x, w, b = torch.randn(4, 3), torch.randn(3, 5), torch.randn(5)
    >>> torch.testing.assert_close(fused_matmul_add_relu(x, w, b), torch.relu(x @ w + b))
    """
    # TODO(human): compute relu(x @ w + b) as one torch._addmm_activation(b, x2d, w) where its GEMM epilogue applies (the docstring's conditions, and K = x.shape[-1] > 0: on CUDA _addmm_activation returns the bias without the ReLU when K == 0, as Phase 2 found), else as the unfused expression. Hint: the epilogue adds one bias value per output column, in one dtype on one device, without autograd; a batched x is folded to 2-D first. More: check the conditions of the one-kernel path first and take the unfused expression at the first that fails (the docstring lists them); math.prod folds the leading dims and a view unfolds them
    # BEGIN SOLUTION
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (x, w, b))
    one_gemm = (
        isinstance(b, torch.Tensor)
        and x.dim() >= 2
        and w.dim() == 2
        and x.shape[-1] > 0  # K == 0: on CUDA _addmm_activation returns the bias without the ReLU
        and b.dim() == 1
        and b.shape[0] == w.shape[1]  # a bias per output column: what the GEMM epilogue adds
        and x.dtype == w.dtype == b.dtype  # x @ w + b would promote mixed dtypes; addmm raises instead
        and x.device == w.device == b.device
        and not needs_grad  # torch._addmm_activation has no autograd formula
    )
    if not one_gemm:
        return torch.relu(torch.matmul(x, w) + b)  # the original expression: exact on every input it accepts
    m = math.prod(x.shape[:-1])  # fold (..., K) into (M, K) (a 2-D x as it is); explicit M, not reshape(-1, K)
    out = torch._addmm_activation(b, x.reshape(m, x.shape[-1]), w)  # (M, N)
    return out.view(*x.shape[:-1], w.shape[1])  # (..., N)
    # END SOLUTION


# ----------------------------------------------------------------------------------------------------------------------
# The spellings. Each entry is a tiny function that, called on Proxies while tracing, records exactly the node the
# same spelling records in a model's forward(). The keys are templates that print it ({h} is the inner expression).

MATMULS: dict[str, Callable] = {
    "x @ w": operator.matmul,
    "torch.matmul(x, w)": torch.matmul,
    "torch.mm(x, w)": torch.mm,
}
ADDS: dict[str, Callable] = {
    "{h} + b": lambda h, b: h + b,
    "b + {h}": lambda h, b: b + h,
    "torch.add({h}, b)": lambda h, b: torch.add(h, b),
    "torch.add(b, {h})": lambda h, b: torch.add(b, h),
}
RELUS: dict[str, Callable] = {
    "torch.relu({h})": torch.relu,
    "F.relu({h})": F.relu,
    "({h}).relu()": lambda h: h.relu(),
}


def spelling_name(matmul: str, add: str, relu: str) -> str:
    """The source text of one spelling: ``spelling_name("x @ w", "b + {h}", "F.relu({h})") == "F.relu(b + x @ w)"``."""
    return relu.format(h=add.format(h=matmul))


@dataclass(frozen=True)
class Rule:
    """One rewrite rule: ``pattern(x, w, b)`` (a spelling of relu(x @ w + b)) becomes ``replacement(x, w, b)``."""

    name: str  # the spelling, as source text
    pattern: Callable
    replacement: Callable


def make_rule(matmul: Callable, add: Callable, relu: Callable) -> tuple[Callable, Callable]:
    """``(pattern, replacement)`` for one spelling: ``matmul(x, w)``, then ``add(h, b)``, then ``relu(h)``.

    Both are plain Python functions of ``(x, w, b)``: ``replace_pattern`` traces them into graphs. Every argument
    of the pattern must be used in it, and the replacement takes the same arguments in the same order.
    """

    # TODO(human): return (pattern, replacement), two functions of (x, w, b): pattern computes relu(add(matmul(x, w), b)), replacement one fused_matmul_add_relu call. Hint: the spelling functions you were given record the right nodes when traced. More: replace_pattern traces both functions through their signatures, so plain nested functions of (x, w, b) will do; the pattern is the chain of the three spellings, the replacement the one fused call
    # BEGIN SOLUTION
    def pattern(x, w, b):
        h = matmul(x, w)  # (..., N)
        h = add(h, b)
        return relu(h)

    def replacement(x, w, b):
        return fused_matmul_add_relu(x, w, b)

    return pattern, replacement
    # END SOLUTION


@functools.cache
def pattern_set() -> tuple[Rule, ...]:
    """Every spelling of relu(x @ w + b): the product MATMULS x ADDS x RELUS, 36 rules, in a fixed order."""
    rules = []
    for names in itertools.product(MATMULS, ADDS, RELUS):  # ("x @ w", "{h} + b", "torch.relu({h})"), ...
        spelled = [spellings[name] for spellings, name in zip((MATMULS, ADDS, RELUS), names, strict=True)]
        rules.append(Rule(spelling_name(*names), *make_rule(*spelled)))
    return tuple(rules)


@functools.cache
def _traced(rule: Rule) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Trace a rule once and keep it: tracing costs far more than matching (the lesson measures both)."""
    return fx.symbolic_trace(rule.pattern), fx.symbolic_trace(rule.replacement)


# ----------------------------------------------------------------------------------------------------------------------
# The pass


def fuse_matmul_add_relu(model: nn.Module, patterns: Sequence[Rule] | None = None) -> fx.GraphModule:
    """Replace every ``relu(x @ w + b)``, in any spelling of the pattern set, with one :func:`fused_matmul_add_relu`.

    Returns a new GraphModule (the caller's model is never touched) carrying two records:

    * ``report_of(gm)``: a :class:`~fusion.common.FusionReport` with one *fused* decision per match (the matmul,
      add and relu node names of the input graph, the fused node's name, the rule) and one *skipped* decision per
      near miss left in the graph (a matmul -> add -> relu chain that no rule took), with the reason.
    * ``pattern_counts(gm)``: ``{rule name: matches replaced}`` for every rule tried, in the order tried, zeros
      included; the values sum to ``fused_call_count(gm)``.

    ``patterns`` defaults to the full :func:`pattern_set`; pass a subset to see what a smaller set misses.
    """
    gm = copy_to_graph_module(model, what="fuse_matmul_add_relu")
    rules = pattern_set() if patterns is None else tuple(patterns)
    report = FusionReport("fuse_matmul_add_relu")
    counts: dict[str, int] = {}
    for rule in rules:
        pattern_gm, replacement_gm = _traced(rule)
        replaced = replace_pattern_with_filters(gm, pattern_gm, replacement_gm)
        counts[rule.name] = counts.get(rule.name, 0) + len(replaced)
        for r in replaced:
            inner = [r.nodes_map[pn].name for pn in pattern_gm.graph.nodes if pn.op not in ("placeholder", "output")]
            fused = [n.name for n in r.replacements if n.op == "call_function"]
            report.fuse(PATTERN, inner, replacement=", ".join(fused), reason=f"rule {rule.name}")
    for nodes, reason in near_misses(gm):
        report.skip(PATTERN, nodes, reason)
    finish_rewrite(gm)
    gm.meta[PATTERN_COUNTS_KEY] = counts
    return attach_report(gm, report)


def pattern_counts(gm: fx.GraphModule) -> dict[str, int]:
    """``{rule name: number of matches it replaced}`` recorded by :func:`fuse_matmul_add_relu`."""
    try:
        return gm.meta[PATTERN_COUNTS_KEY]
    except (AttributeError, KeyError):
        raise KeyError("no pattern counts on this GraphModule: was it returned by fuse_matmul_add_relu?") from None


def fused_call_count(gm: fx.GraphModule) -> int:
    """How many :func:`fused_matmul_add_relu` calls the graph holds."""
    return sum(n.op == "call_function" and n.target is fused_matmul_add_relu for n in gm.graph.nodes)


# ----------------------------------------------------------------------------------------------------------------------
# Near misses: matmul -> add -> relu chains left in the graph, and why (broader than the set: a miss is reported).

_MATMUL_FNS, _MATMUL_METHODS = {operator.matmul, torch.matmul, torch.mm}, {"matmul", "mm"}
_ADD_FNS, _ADD_METHODS = {operator.add, operator.iadd, torch.add}, {"add", "add_"}
_RELU_FNS, _RELU_METHODS = {torch.relu, torch.relu_, F.relu, F.relu_}, {"relu", "relu_"}


def _is(node: object, fns: set, methods: set) -> bool:
    if not isinstance(node, fx.Node):
        return False
    return (node.op == "call_function" and node.target in fns) or (node.op == "call_method" and node.target in methods)


def _is_relu(node: fx.Node) -> bool:
    if node.op == "call_module":
        return isinstance(node.graph.owning_module.get_submodule(node.target), nn.ReLU)
    return _is(node, _RELU_FNS, _RELU_METHODS)


def near_misses(gm: fx.GraphModule) -> list[tuple[tuple[str, str, str], str]]:
    """Every matmul -> add -> relu chain still in ``gm``: ((matmul, add, relu) node names, why it was not fused)."""
    misses = []
    for relu in gm.graph.nodes:
        if not (_is_relu(relu) and relu.args and _is(relu.args[0], _ADD_FNS, _ADD_METHODS)):
            continue
        add = relu.args[0]
        for mm in add.args[:2]:
            if not _is(mm, _MATMUL_FNS, _MATMUL_METHODS):
                continue
            outside = [u.name for u in mm.users if u is not add] + [u.name for u in add.users if u is not relu]
            if outside:
                reason = (
                    f"intermediate read outside the pattern (by {', '.join(outside)}): the fused call never "
                    "materializes the pre-ReLU value that reader needs"
                )
            elif any(n.kwargs for n in (mm, add)) or relu.kwargs.get("inplace"):
                kw = {k: v for n in (mm, add, relu) for k, v in n.kwargs.items() if not (k == "inplace" and not v)}
                reason = f"keyword arguments no rule has ({kw}): matching is syntactic"
            elif len({id(a) for a in (*mm.args, *add.args)}) < len((*mm.args, *add.args)):
                reason = "one value feeds two pattern inputs: the matcher maps pattern inputs one-to-one"
            else:
                spelled = f"{target_name(relu)} <- {target_name(add)} <- {target_name(mm)}"
                reason = f"spelled {spelled}, which no rule in the set spells: matching is syntactic"
            misses.append(((mm.name, add.name, relu.name), reason))
            break
    return misses


# ----------------------------------------------------------------------------------------------------------------------
# Demo models: one layer in a chosen spelling, and one whose intermediate escapes. (Not exercises.)


class SpelledLayer(nn.Module):
    """``relu(x @ w + b)`` written in one spelling from the tables, e.g. ``SpelledLayer(8, 4, "torch.mm(x, w)")``."""

    def __init__(self, d_in=32, d_out=64, matmul="x @ w", add="{h} + b", relu="torch.relu({h})", seed=models.SEED):
        super().__init__()
        self.spelling = (matmul, add, relu)
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(d_in, d_out, generator=g) / math.sqrt(d_in))  # (K, N)
        self.b = nn.Parameter(0.1 * torch.randn(d_out, generator=g) / math.sqrt(d_out))  # (N,)

    def layer(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # x: (..., K)
        matmul, add, relu = self.spelling
        return RELUS[relu](ADDS[add](MATMULS[matmul](x, self.w), b))  # (..., N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, self.b)


class MixedSpellings(nn.Module):
    """Three layers, three spellings: what a model written by three people looks like."""

    SPELLINGS = (
        ("x @ w", "{h} + b", "torch.relu({h})"),
        ("torch.matmul(x, w)", "b + {h}", "F.relu({h})"),
        ("torch.mm(x, w)", "torch.add({h}, b)", "({h}).relu()"),
    )

    def __init__(self, d: int = 32, seed: int = models.SEED):
        super().__init__()
        self.layers = nn.ModuleList(SpelledLayer(d, d, *s, seed=seed + 10 * i) for i, s in enumerate(self.SPELLINGS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, d); torch.mm needs 2-D
        for layer in self.layers:
            x = layer(x)
        return x


class LeakyIntermediate(SpelledLayer):
    """``h = x @ w + b; return relu(h) + h``: the add's output has a second reader, so fusing would lose it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.w + self.b  # (..., N), read twice
        return torch.relu(h) + h


# ----------------------------------------------------------------------------------------------------------------------
# The lesson


def run(quick: bool = False) -> None:
    torch.manual_seed(0)
    batch = 4 if quick else 16
    heading("Phase 3 — pattern rewriting with torch.fx.subgraph_rewriter")
    model = models.MatmulAddReLU(32, 64)
    (x,) = models.matmul_inputs(batch=batch)
    print("MatmulAddReLU.forward:  return torch.relu(x @ w + b)")
    print(node_table(copy_to_graph_module(model)))

    heading("One hand-written rule", "-")
    handwritten = [r for r in pattern_set() if r.name == "torch.relu(x @ w + b)"]
    gm = fuse_matmul_add_relu(model, patterns=handwritten)
    print(f"rule: torch.relu(x @ w + b)   fused calls in MatmulAddReLU: {fused_call_count(gm)}")
    print(gm.code.strip())
    torch.testing.assert_close(gm(x), model(x))
    print(f"max |fused - original| = {max_abs_diff(gm(x), model(x)):.2e}")

    heading("Matching is syntactic: the same rule on a model spelled three ways", "-")
    mixed = MixedSpellings()
    for s in MixedSpellings.SPELLINGS:
        print(f"  {spelling_name(*s)}")
    one = fuse_matmul_add_relu(mixed, patterns=handwritten)
    print(f"\nwith the one rule: {fused_call_count(one)} of 3 fused. What it missed, from the report:")
    print(report_of(one))
    full = fuse_matmul_add_relu(mixed)
    n_rules = len(pattern_set())
    print(
        f"\nwith the generated set ({len(MATMULS)} matmuls x {len(ADDS)} adds x {len(RELUS)} relus = {n_rules} "
        f"rules): {fused_call_count(full)} of 3 fused"
    )
    print(table([(name, n) for name, n in pattern_counts(full).items() if n], ["rule", "matches"]))
    (xm,) = models.matmul_inputs(batch=batch)
    torch.testing.assert_close(full(xm), mixed(xm))
    print(f"max |fused - original| = {max_abs_diff(full(xm), mixed(xm)):.2e}")

    heading("Legality: an intermediate with an outside reader stays unfused", "-")
    leaky = LeakyIntermediate()
    gm = fuse_matmul_add_relu(leaky)
    print("LeakyIntermediate.forward:  h = x @ w + b;  return torch.relu(h) + h")
    print(f"fused calls: {fused_call_count(gm)}")
    print(report_of(gm))
    torch.testing.assert_close(gm(xm), leaky(xm))
    print(f"still correct: max |rewritten - original| = {max_abs_diff(gm(xm), leaky(xm)):.2e}")

    heading("Back to back: relu(relu(x @ w0 + b0) @ w1 + b1)", "-")
    chain = models.MatmulAddReLU(32, 64, 16)
    gm = fuse_matmul_add_relu(chain)
    gm.graph.lint()
    print(f"fused calls: {fused_call_count(gm)}; graph.lint() passes. The second fused call reads the first:")
    print(gm.code.strip())
    print(report_of(gm))
    torch.testing.assert_close(gm(x), chain(x))
    print(f"max |fused - original| = {max_abs_diff(gm(x), chain(x)):.2e}")

    heading("The price of a generated set (measured with torch.utils.benchmark)", "-")
    rules, budget = pattern_set(), (0.1 if quick else 0.5)
    untraced = _traced.__wrapped__  # the rule tracer without its cache
    timers = {
        "fuse MatmulAddReLU(32, 64, 16) with 1 rule": lambda: fuse_matmul_add_relu(chain, patterns=handwritten),
        f"fuse MatmulAddReLU(32, 64, 16) with all {len(rules)} rules": lambda: fuse_matmul_add_relu(chain),
        f"trace the {2 * len(rules)} rule functions (done once, then cached)": lambda: [untraced(r) for r in rules],
    }
    ms = {k: benchmark.Timer("f()", globals={"f": f}).blocked_autorange(min_run_time=budget) for k, f in timers.items()}
    print(table([(what, f"{m.median * 1e3:.1f}") for what, m in ms.items()], ["work", "ms (median)"]))
    print("Every rule is one more walk of the matcher over the graph; every new spelling multiplies the rules.")

    heading("What one fused call runs (aten ops dispatched, recorded with a TorchDispatchMode)", "-")
    w, b = torch.randn(32, 64), torch.randn(64)
    x3 = torch.randn(2, batch, 32)
    cases = [
        ("original relu(x @ w + b), 2-D x", lambda: aten_ops(lambda: torch.relu(x @ w + b))),
        ("fused, 2-D x, bias (N,)", lambda: aten_ops(fused_matmul_add_relu, x, w, b)),
        ("fused, 3-D x (folded to 2-D)", lambda: aten_ops(fused_matmul_add_relu, x3, w, b)),
        ("fused, bias (M, 1): one per row", lambda: aten_ops(fused_matmul_add_relu, x, w, b[:batch, None])),
        ("fused, w requires grad (training)", lambda: aten_ops(fused_matmul_add_relu, x, w.requires_grad_(), b)),
    ]
    print(table([(what, ", ".join(ops())) for what, ops in cases], ["call", "aten ops"]))
    rows = max_abs_diff(torch._addmm_activation(b[:batch, None], x, w), torch.relu(x @ w + b[:batch, None]))
    print(
        f"A bias (M, 1) is one value per row; the epilogue adds one per column. addmm would still take it (copying\n"
        f"it into the output first) and agree to {rows:.1e} here: the rule is about the epilogue, not exactness.\n"
        "_addmm_activation has no autograd formula, so a call that needs gradients takes the unfused path:\n"
        "fusion for inference here; training needs a custom autograd.Function (or torch.compile)."
    )


def main(argv: list[str] | None = None) -> int:
    return lesson_cli(run, __doc__, argv)


registry.register(3, fuse_matmul_add_relu=fuse_matmul_add_relu)  # what Phase 4 measures (fusion/compiler/registry.py)
if __name__ == "__main__":
    raise SystemExit(main())
