"""Shared plumbing for every phase: tracing with a clear error, node tables, fusion reports, lesson runners.

Nothing in here is an exercise: the learner regions live in the phase modules. Every pass in the package
uses these helpers so that errors, reports and printed tables look the same from phase to phase.

    >>> import torch
    >>> from fusion.common import trace_module, node_table
    >>> gm = trace_module(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    >>> [n.op for n in gm.graph.nodes]
    ['placeholder', 'call_module', 'call_module', 'output']
"""

from __future__ import annotations

import argparse
import copy
import inspect
import linecache
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from tabulate import tabulate

# ----------------------------------------------------------------------------------------------------------------------
# Tracing: one clear error instead of a deep torch traceback


class UntraceableModelError(RuntimeError):
    """``torch.fx.symbolic_trace`` could not turn the model into a graph. The message says why and how to fix it."""


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep  # with the separator: torchvision/, torchaudio/ are not torch/


def _user_frame(exc: BaseException) -> str:
    """The last traceback line outside torch itself: the line of the user's forward() that broke tracing."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_TORCH_DIR)]
    frames = [f for f in frames if not f.filename.endswith(os.path.join("fusion", "common.py"))]
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {os.path.basename(f.filename)}:{f.lineno} `{(f.line or '').strip()}`)"


def _plain_reason(exc: BaseException) -> str:
    """Why symbolic tracing failed, in words that name the Python construct and the fix."""
    msg = str(exc)
    proxy = "Symbolic tracing runs forward() once with Proxy objects instead of tensors; a Proxy records operations "
    if "interpreted as an integer" in msg or ("Proxy" in msg and ("int()" in msg or "float()" in msg)):
        return (
            "its forward() uses a tensor's size or value as a Python number, e.g. `for i in range(x.shape[0])` or "
            f"`int(x.size(0))`. {proxy}and x.shape[0] is one too: range() and int() need a real int. Fix: loop over "
            "a count the model knows when it is built (a constructor argument), pass the size as a plain forward() "
            "argument fixed with symbolic_trace(model, concrete_args={'n': 4}), or move the loop into a function "
            "decorated with @torch.fx.wrap (recorded as one call, not traced into)"
        )
    if "iterated" in msg or "iteration" in msg or "__iter__" in msg or "__len__" in msg:
        return (
            "its forward() iterates over a traced value (`for row in x`, `a, b = x`, `*x`, len(x)); every forward() "
            f"argument is one, an optional list too. {proxy}but has no length to loop over. Fix: index a fixed "
            "number of times (x[0], x[1]), move the loop into a function decorated with @torch.fx.wrap, or fix an "
            "argument that is not a tensor with concrete_args, e.g. symbolic_trace(model, concrete_args={'targets': "
            "None})"
        )
    if "control flow" in msg or "__bool__" in msg:
        return (
            f"its forward() branches or loops on the *value* of a tensor. {proxy}but holds no values, so Python "
            "cannot decide `if`/`while` on it. Fix: make the branch independent of data (e.g. torch.where), move it "
            "into a leaf function with torch.fx.wrap, or pass concrete_args for the input it depends on"
        )
    return (
        f"{type(exc).__name__}: {msg}. Tracing stopped at the line named above, with a Proxy where that call needs a "
        "real value. Fix: move that call into a function decorated with @torch.fx.wrap (recorded as one node, not "
        "traced into), or pass the argument it depends on as concrete_args"
    )


def ensure_module(model: object, what: str = "this pass") -> torch.nn.Module:
    """Refuse a non-Module with one clear TypeError; a Module *class* gets the call to make instead."""
    if isinstance(model, type) and issubclass(model, torch.nn.Module):
        name = model.__name__
        raise TypeError(
            f"{what} needs a torch.nn.Module instance, got the class {name}; pass an instance: {name}() "
            f"(e.g. {what}({name}(...)) with its constructor arguments)"
        )
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"{what} needs a torch.nn.Module (or a torch.fx.GraphModule), got {type(model).__name__}. "
            "Fix: pass the model object itself, e.g. fuse(MyNet()) rather than fuse(output)"
        )
    return model


def trace_module(model: torch.nn.Module, *, what: str = "symbolic_trace") -> fx.GraphModule:
    """``torch.fx.symbolic_trace(model)``, with one clear error naming the model and the fix when it fails.

    The model is traced as it is (not copied): the GraphModule shares its submodules and parameters.
    Passes that rewrite use :func:`copy_to_graph_module` instead, which never touches the caller's model.
    """
    ensure_module(model, what)
    try:
        return fx.symbolic_trace(model)
    except Exception as e:  # TraceError, TypeError from Proxy.__bool__/__iter__, ...
        raise UntraceableModelError(f"cannot trace {type(model).__name__}{_user_frame(e)}: {_plain_reason(e)}") from e


def copy_to_graph_module(model: torch.nn.Module, *, what: str = "this pass") -> fx.GraphModule:
    """A traced *deep copy* of ``model``: rewrite it freely, the caller's parameters, modules and graph stay as they are."""
    ensure_module(model, what)
    return trace_module(copy.deepcopy(model), what=what)


# ----------------------------------------------------------------------------------------------------------------------
# Printing


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


# ----------------------------------------------------------------------------------------------------------------------
# Fusion reports: every pass says what it fused and what it skipped, and why


@dataclass
class FusionDecision:
    """One candidate a pass looked at: ``fused`` or ``skipped``, the nodes involved, and the reason."""

    pattern: str  # e.g. "Linear+ReLU"
    nodes: tuple[str, ...]  # node names in the *input* graph, e.g. ("fc1", "relu")
    fused: bool
    reason: str = ""  # why it was skipped (or a note on how it was fused)
    replacement: str = ""  # the new node/module name when fused


@dataclass
class FusionReport:
    """What a pass did. Every pass stores its report on the returned module: ``gm.meta["fusion_report"]``.

    Read it back with :func:`report_of`. ``report.fused`` / ``report.skipped`` list the decisions.
    """

    pass_name: str
    decisions: list[FusionDecision] = field(default_factory=list)

    def fuse(self, pattern: str, nodes: Iterable[str], replacement: str = "", reason: str = "") -> None:
        self.decisions.append(FusionDecision(pattern, tuple(nodes), True, reason, replacement))

    def skip(self, pattern: str, nodes: Iterable[str], reason: str) -> None:
        self.decisions.append(FusionDecision(pattern, tuple(nodes), False, reason))

    @property
    def fused(self) -> list[FusionDecision]:
        return [d for d in self.decisions if d.fused]

    @property
    def skipped(self) -> list[FusionDecision]:
        return [d for d in self.decisions if not d.fused]

    def table(self) -> str:
        if not self.decisions:
            return f"{self.pass_name}: no candidates found"
        rows = [
            (d.pattern, " → ".join(d.nodes), "fused" if d.fused else "skipped", d.replacement or "-", d.reason or "-")
            for d in self.decisions
        ]
        return table(rows, ["pattern", "nodes", "action", "replacement", "reason"])

    def __str__(self) -> str:
        return self.table()


REPORT_KEY = "fusion_report"


def attach_report(gm: fx.GraphModule, report: FusionReport) -> fx.GraphModule:
    gm.meta[REPORT_KEY] = report
    return gm


def report_of(gm: fx.GraphModule) -> FusionReport:
    """The :class:`FusionReport` a pass attached to the GraphModule it returned."""
    try:
        return gm.meta[REPORT_KEY]
    except (AttributeError, KeyError):
        raise KeyError(
            "this GraphModule carries no fusion report: was it returned by one of fusion's passes?"
        ) from None


def show_rewrite(
    title: str, model: torch.nn.Module, rewrite: Callable, table_of: Callable | None = None, after: str = ""
) -> fx.GraphModule:
    """Print a pass at work: the model's graph before, ``rewrite(model)``'s graph after, and its report. Returns the
    rewritten GraphModule. ``table_of`` renders a graph (default :func:`node_table`); ``after`` names the pass."""
    table_of = table_of or node_table
    heading(title, "-")
    print("Before:")
    print(table_of(copy_to_graph_module(model)))
    gm = rewrite(model)
    print(f"\nAfter {after or rewrite.__name__}:")
    print(table_of(gm))
    print("\nReport (report_of(gm)):")
    print(report_of(gm).table())
    return gm


def mutates_an_input(node: fx.Node, modules: dict[str, torch.nn.Module]) -> bool:
    """Does ``node`` write into one of its inputs (``h.relu_()``, ``torch.relu_(h)``, ``F.relu(h, inplace=True)``,
    ``nn.ReLU(inplace=True)``, a mutable aten op)? Then it has an effect even when nobody reads its result."""
    target = node.target
    if node.op == "call_method":
        return target.endswith("_") and not target.startswith("_")
    if node.op == "call_module":
        return getattr(modules.get(target), "inplace", False) is True
    if node.op != "call_function":
        return False
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    name = getattr(target, "__name__", "")
    if name.endswith("_") and not name.startswith("_"):
        return True
    try:
        bound = inspect.signature(target).bind(*node.args, **node.kwargs)
    except (TypeError, ValueError):  # a builtin without a signature, or arguments that do not bind
        return False
    return bound.arguments.get("inplace", False) is True


def has_effect(node: fx.Node, modules: dict[str, torch.nn.Module]) -> bool:
    """Must ``node`` stay although nobody reads its result? fx's impure nodes (placeholders, the output, random
    ops, ...) and every node that writes into one of its inputs (:func:`mutates_an_input`)."""
    return node.is_impure() or mutates_an_input(node, modules)


def finish_rewrite(gm: fx.GraphModule) -> fx.GraphModule:
    """The clean-up every rewrite ends with: lint, dead-code elimination, drop unused submodules, recompile.

    Dead-code elimination keeps in-place statements: fx's default would delete ``h.relu_()`` whose result nobody
    reads, although it changes ``h`` for everyone who reads ``h`` later.
    """
    gm.graph.lint()
    modules = dict(gm.named_modules())
    gm.graph.eliminate_dead_code(is_impure_node=lambda n: has_effect(n, modules))
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm


# ----------------------------------------------------------------------------------------------------------------------
# Running a lesson: `python -m fusion.<phase>` and fusion.main share this, and both turn an unsolved exercise
# (a NotImplementedError whose message starts with "TODO(human)") into a short message instead of a traceback.


def is_todo(exc: BaseException) -> bool:
    return isinstance(exc, NotImplementedError) and str(exc).startswith("TODO(human)")


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout (or workspace) holding fusion/


def todo_site(exc: BaseException) -> tuple[str, int] | None:
    """Where an unsolved TODO(human) stopped the run: (path, line) of its ``# TODO(human):`` comment (of the stub
    itself when the comment is gone), the path relative to the project root. ``practice check`` names the same
    place as "Next", so the lesson and the checker point at one TODO."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    if not frames:
        return None
    frame, line = frames[-1]  # the stub's `raise` is the innermost frame
    path = frame.f_code.co_filename
    if linecache.getline(path, line - 1).strip().startswith("# TODO(human):"):
        line -= 1
    rel = os.path.relpath(path, _ROOT)
    return (path if rel.startswith("..") else rel.replace(os.sep, "/")), line


class CompilerStageError(RuntimeError):
    """An exception inside a compiler stage (often a learner's solution), shown instead of a silent fallback."""


def strict_compiler() -> bool:
    """Should a compiler stage raise an unexpected exception rather than run the graph uncompiled?

    ``FUSION_STRICT=1`` forces it and ``FUSION_STRICT=0`` turns it off; unset, it is on under pytest and in a
    practice workspace (``.practice.json`` beside ``fusion/``), where a bug in a solution must be seen, and off
    for everyone else, whose compile never crashes: the aten graph is always a correct answer.
    """
    flag = os.environ.get("FUSION_STRICT")
    if flag in ("0", "1"):
        return flag == "1"
    return "PYTEST_CURRENT_TEST" in os.environ or os.path.isfile(os.path.join(_ROOT, ".practice.json"))


def _lesson_frame(exc: BaseException) -> str:
    """'fusion/backend.py:97 in find_conv_bn_folds': the innermost frame in a lesson file (fusion/<phase>.py)."""
    lessons = os.path.join(_ROOT, "fusion")
    for frame, line in reversed(list(traceback.walk_tb(exc.__traceback__))):
        path = frame.f_code.co_filename
        if os.path.dirname(os.path.abspath(path)) == lessons:
            return f"fusion/{os.path.basename(path)}:{line} in {frame.f_code.co_name}"
    return ""


def _is_dynamo_restart(exc: BaseException) -> bool:
    """Dynamo's own control flow (RestartAnalysis and its kin, e.g. TensorifyScalarRestartAnalysis): it traces again."""
    return any(cls.__name__.endswith("RestartAnalysis") for cls in type(exc).__mro__)


def fallback_reason(exc: BaseException, stage: str, expected: tuple[type[BaseException], ...] = ()) -> str:
    """The one rule for a compiler stage's ``except``: the reason to report when the stage falls back to aten, or
    a raise. An unsolved TODO(human) is raised as it is; in :func:`strict_compiler` mode any exception other than
    ``expected`` (e.g. ``Unsupported``: a reason, not a bug) is raised as :class:`CompilerStageError`, naming the
    lesson function it came from."""
    if is_todo(exc) or _is_dynamo_restart(exc):  # a TODO, or Dynamo asking to trace again: never a fallback
        raise exc
    text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if strict_compiler() and not isinstance(exc, expected):
        where = _lesson_frame(exc)
        at = f" (raised at {where}: check your solution of the TODO there)" if where else ""
        raise CompilerStageError(
            f"{stage} failed: {text}{at}. Outside tests and practice workspaces the graph would run uncompiled; "
            "FUSION_STRICT=0 does that here too"
        ) from exc
    return text


def todo_message(exc: BaseException) -> str:
    """The unsolved TODO's message and, on the next line, where it is."""
    site = todo_site(exc)
    return f"{exc}" + (f"\n  at {site[0]}:{site[1]}" if site else "")


def plain(text: str) -> str:
    """Docstring text for a terminal: reStructuredText's ``double backticks`` and `single backticks` dropped."""
    return text.replace("``", "").replace("`", "")


def lesson_name(module: str | None) -> str | None:
    """``fusion.regions`` for a lesson's ``__name__``, also when it runs as ``python -m`` (``__main__``)."""
    if module == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        return spec.name if spec is not None else None
    return module


def cli_prog(module: str | None) -> str | None:
    """``python -m <module>`` for argparse's usage line; run as ``-m``, a module's ``__name__`` is "__main__"."""
    return f"python -m {name}" if (name := lesson_name(module)) else None


def lesson_cli(run: Callable[..., object], doc: str | None, argv: Sequence[str] | None = None) -> int:
    """The command line every phase module shares: ``python -m fusion.<phase> [--quick] [--plot FILE.png]``.
    ``--plot`` where the lesson has a picture (``fusion.viz.PICTURES``), drawn after the lesson from its module."""
    from fusion import viz

    first, module = plain(doc or "").strip().splitlines(), getattr(run, "__module__", None)
    parser = argparse.ArgumentParser(prog=cli_prog(module), description=first[0] if first else None)
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer examples (what CI runs)")
    if draw := viz.picture_of(name := lesson_name(module)):
        parser.add_argument("--plot", metavar="FILE.png", help=f"then save its picture ({viz.extra(name)})")
    args = parser.parse_args(argv)
    if (path := getattr(args, "plot", None)) and not viz.have_matplotlib():
        parser.error(viz.plot_hint(name, path))  # before the lesson runs, not after

    def lesson() -> None:
        run(quick=args.quick)
        if path:  # the lesson's own module: under `python -m` it is __main__, whose backend Dynamo calls
            draw(sys.modules[module], path, args.quick)
            print(f"\npicture: {path}")

    return run_lesson(lesson)


def run_lesson(fn: Callable[[], object]) -> int:
    """Run one lesson; an unsolved TODO(human) prints its message and file:line, and returns 1 (no traceback)."""
    try:
        fn()
    except NotImplementedError as e:
        if not is_todo(e):
            raise
        print(f"\n{todo_message(e)}", file=sys.stderr)
        return 1
    return 0
