"""Phase 7 — horizontal fusion: sibling Linears (or Convs) that read one input become one wide op.

Run it:   uv run python -m fusion.horizontal_fusion          (``--quick`` for the small version CI runs)
Test it:  uv run pytest -m phase7

What you learn
--------------
* Two kinds of fusion. *Vertical* (Phases 2–6): a producer and its consumer share a kernel, so the value between
  them never goes to memory. *Horizontal*: **siblings**, ops that read the same value, run as one op, so that value
  is read once and one kernel is launched instead of several. The classic case is attention's Q, K and V
  projections: three GEMMs on the same ``x`` become one GEMM against the three weights stacked on the output dim,
  ``x @ cat([Wq, Wk, Wv]).T``, followed by a split. Inception branches do the same with 1x1 convs (split on the
  channel dim). A sibling without a bias gets a zero slice of the merged bias: exact.
* **Legality.** (1) Siblings never depend on each other: both read ``x``, so a path from one to the other would run
  through ``x`` back into itself, a cycle, which a graph cannot have. So merging them cannot create a cycle (XLA's
  rule for horizontal fusion, "no path between the candidates", holds for free). (2) Placement: the merged node
  needs ``x`` (defined before every sibling) and its weights (module attributes, no nodes), and must come before
  the first user of any sibling; the position of the *earliest* sibling satisfies both. (3) The same node is not
  always the same value: an in-place op between two siblings (``x.add_(1)``) changes what the later one reads, so
  the pass cuts the group there. (4) Modules it cannot see through stay alone, with the reason in the report: hooks,
  a subclass that overrides ``forward``, an uninitialised lazy module, a parametrized weight, a bias frozen apart
  from its weight, and siblings whose kind, hyper-parameters, dtype, device or ``requires_grad`` differ (each
  compatible subset still merges). One module called twice on the same value is common-subexpression elimination,
  not a horizontal group; inside a group its call sites share one slice of weights.
* **What you get back are views.** Each sibling's output is ``merged.narrow(dim, start, width)``: no copy. Three
  consequences: a slice that is returned to the caller, modified in place (``F.relu(h, inplace=True)``; autograd
  shares one version counter among views of one tensor) or looked at as memory (``stride()``) gets its own
  ``clone()``; ``h.view(...)`` on a slice becomes ``h.reshape(...)`` (same values; a view of a non-contiguous
  slice could fail); and ``torch.split`` is not used, because autograd forbids in-place ops on its outputs.
* **What it costs and when it pays.** Same FLOPs, one launch instead of N, ``x`` read once instead of N times, one
  bigger GEMM that fills the GPU better. It pays when the GEMMs are small (decode: 32 tokens), where launches and
  reading ``x`` dominate. It hardly pays when each GEMM is already compute-bound (prefill: 8192 tokens), and it
  costs when consumers need contiguous copies (the clones above eat the bytes saved).
* **Gradients.** The merged module owns *new* parameters (the concatenation); the caller's are untouched. Input
  gradients are exact; train the fused model only if you mean to train the merged parameters.
* **Elementwise siblings** are horizontal fusion too: on the aten graph two pointwise consumers of one tensor end up
  in one Phase 6 region with two outputs, which reads the tensor once (see the end of the run).

Inductor's ``fx_passes/group_batch_fusion.py`` does this at scale (match → group key → independent subset →
concatenate → one op → split). It also batches ops with *different* inputs (stacking them), so it must search for
subsets with no path between members; grouping only siblings of one value, as here, makes every subset independent.
Its scheduler's ``can_fuse_horizontal`` merges kernels that merely share reads.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.fx as fx
import torch.nn as nn

from fusion import models
from fusion.common import (
    FusionReport,
    attach_report,
    copy_to_graph_module,
    finish_rewrite,
    heading,
    lesson_cli,
    max_abs_diff,
    mutates_an_input,
    show_rewrite,
    table,
)
from fusion.compiler import registry
from fusion.fxutils.names import hashable_key, merged_module_name
from fusion.regions import build_fusion_regions, capture_aten, unique_regions

MERGEABLE = (nn.Linear, nn.Conv2d)

# Ops whose result may share memory with an input: views, "returns self if nothing to do" (contiguous, to, float),
# dropout (the input itself in eval mode). Unknown functions count as aliasing too: the safe side.
ALIAS_NAMES = frozenset(
    "view view_as reshape reshape_as flatten unflatten squeeze unsqueeze transpose permute t adjoint expand expand_as "
    "narrow select getitem __getitem__ getattr chunk split split_with_sizes tensor_split unbind hsplit vsplit dsplit "
    "movedim moveaxis swapaxes swapdims diagonal as_strided unfold detach contiguous to type type_as float double "
    "half bfloat16 cpu cuda alias real imag view_as_real view_as_complex dropout alpha_dropout feature_alpha_dropout "
    "dropout1d dropout2d dropout3d".split()
)
ALIAS_MODULES = (nn.Identity, nn.Flatten, nn.Unflatten, nn.modules.dropout._DropoutNd)
MEMORY_INTROSPECTION = frozenset({"stride", "is_contiguous", "data_ptr", "storage_offset", "untyped_storage"})


# ----------------------------------------------------------------------------------------------------------------------
# Legality: which modules may merge, and with whom


def sibling_refusal(module: nn.Module) -> str | None:
    """Why ``module`` must stay a module of its own, or None if it may merge with its siblings."""
    kind = type(module).__name__
    if isinstance(module.weight, nn.parameter.UninitializedParameter):
        return f"{kind} is not initialised yet: run one forward pass first"
    base = next(b for b in MERGEABLE if isinstance(module, b))
    overridden = [
        m for m in ("forward", "_conv_forward") if getattr(type(module), m, None) is not getattr(base, m, None)
    ]
    if overridden:
        return f"{kind} overrides {base.__name__}.{overridden[0]}: the merged module would not compute what it does"
    if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks:
        return "it has hooks, which the merged module would not run"
    if not all(isinstance(p, nn.Parameter) for p in (module.weight, module.bias) if p is not None):
        return "its weight is computed on access (a parametrization?), not a Parameter that can be concatenated"
    if module.bias is not None and module.bias.requires_grad != module.weight.requires_grad:
        return "its bias and weight differ in requires_grad: the merged module's parameters carry one flag"
    if isinstance(module, nn.Conv2d) and module.groups != 1:
        return f"groups={module.groups}: a grouped conv's channels cannot be stacked into one conv"
    return None


def merge_key(module: nn.Module) -> tuple[tuple[str, object], ...]:
    """What must be equal for two siblings to merge, as (field, value) pairs: kind, weight shape past the output
    dim, hyper-parameters, dtype, device and ``requires_grad``. Output widths and bias may differ."""
    w, kind = module.weight, next(b for b in MERGEABLE if isinstance(module, b)).__name__  # a plain subclass merges
    key = [("kind", kind), ("weight shape", tuple(w.shape[1:]))]
    if isinstance(module, nn.Conv2d):
        key += [(f, getattr(module, f)) for f in ("stride", "padding", "dilation", "padding_mode")]
    return (*key, ("dtype", w.dtype), ("device", w.device), ("requires_grad", w.requires_grad))


def lone_reason(members: list[fx.Node], run: list[fx.Node], readers: list[fx.Node], buckets: dict) -> str:
    """Why ``members`` (calls of one module, one merge_key bucket of ``run``) form no group, for the report."""
    key = next(k for k, m in buckets.items() if m is members)
    for other, nodes in buckets.items():
        if other != key:
            diff = ", ".join(f"{f} {v} vs {v2}" for (f, v), (_, v2) in zip(key, other, strict=False) if v != v2)
            return f"no sibling it can merge with: {diff} ({nodes[0].name})"
    if len(members) > 1:
        return "one module called twice on one value: that is common-subexpression elimination, not a group"
    if len(run) > 1:
        return "its siblings are refused (see their rows)"
    if len(readers) > 1:
        return "an in-place op between it and its siblings may change the value they read"
    return "no other Linear or Conv2d reads this value"


@dataclass
class GraphFacts:
    """What the legality checks read: each node's position, what memory it may alias, and every in-place write."""

    modules: dict[str, nn.Module]
    order: dict[fx.Node, int]
    roots: dict[fx.Node, frozenset]  # node -> the nodes whose memory its value may share (itself included)
    writes: list[tuple[fx.Node, frozenset]]  # (in-place node, the roots of everything it may write)


def may_alias_input(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Could ``node``'s result share memory with one of its inputs? When unsure: yes."""
    if node.op == "call_module":
        m = modules[node.target]
        return (
            isinstance(m, ALIAS_MODULES)
            or getattr(m, "inplace", False) is True
            or not type(m).__module__.startswith("torch.nn")
        )
    if node.op not in ("call_function", "call_method"):
        return False
    if mutates_an_input(node, modules):
        return True  # x.relu_() returns x
    if isinstance(node.target, torch._ops.OpOverload):
        return any(r.alias_info is not None for r in node.target._schema.returns)
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if name in ALIAS_NAMES or node.op == "call_method":  # a Tensor method not in the list returns a new tensor
        return name in ALIAS_NAMES
    module = getattr(node.target, "__module__", None) or ""
    return not (module.startswith("torch") or module in ("_operator", "operator", "math", "builtins"))


def graph_facts(gm: fx.GraphModule) -> GraphFacts:
    modules = dict(gm.named_modules())
    order, roots, writes = {}, {}, []
    for i, node in enumerate(gm.graph.nodes):
        order[node] = i
        if node.op == "placeholder":
            roots[node] = frozenset({"inputs"})  # the caller may pass one tensor as two arguments
        elif may_alias_input(node, modules):
            roots[node] = frozenset({node}).union(*(roots[a] for a in node.all_input_nodes))
        else:
            roots[node] = frozenset({node})
        if mutates_an_input(node, modules):
            writes.append((node, frozenset().union(*(roots[a] for a in node.all_input_nodes))))
    return GraphFacts(modules, order, roots, writes)


def same_value_runs(nodes: list[fx.Node], facts: GraphFacts) -> list[list[fx.Node]]:
    """Cut ``nodes`` (calls with the same arguments, in graph order) wherever an in-place op between two of them may
    change what they read: each run really reads one value."""
    reads = frozenset().union(*(facts.roots[a] for a in nodes[0].all_input_nodes))
    runs = [[nodes[0]]]
    for prev, node in pairwise(nodes):
        a, b = facts.order[prev], facts.order[node]
        if any(a < facts.order[w] < b and touched & reads for w, touched in facts.writes):
            runs.append([node])
        else:
            runs[-1].append(node)
    return runs


def slice_plan(node: fx.Node, facts: GraphFacts, clone_outputs: bool = True) -> tuple[str | None, list[fx.Node]]:
    """How a sibling's output may be handed out as a view of the merged output: (why it needs its own copy, or
    None; the ``.view`` calls on it, which become ``.reshape``)."""
    aliases = [n for n, r in facts.roots.items() if node in r]  # node itself and everything that may share its memory
    for n in aliases:
        if clone_outputs and any(u.op == "output" for u in n.users):
            return "it is returned: the caller gets a tensor of its own, as before", []
    for w, touched in facts.writes:
        if node in touched:
            return f"{w.name} modifies it in place: a view would share a version counter with its siblings", []
    views = []
    for n in {u for a in aliases for u in a.users}:  # everything that reads it or one of its aliases
        if n.op == "call_method" and n.target in MEMORY_INTROSPECTION:
            return f"{n.name} looks at its memory layout", []
        if n.op == "call_method" and n.target in ("view", "view_as"):
            if any(isinstance(a, torch.dtype) for a in (*n.args, *n.kwargs.values())):
                return f"{n.name} reinterprets its bytes as another dtype", []
            views.append(n)
    return None, views


# ----------------------------------------------------------------------------------------------------------------------
# The three steps: group, merge, rewire


def group_siblings(gm: fx.GraphModule, facts: GraphFacts, report: FusionReport) -> list[list[fx.Node]]:
    """Every group of sibling calls to merge (graph order), each with >= 2 distinct modules; the rest is reported."""
    readers: dict[object, list[fx.Node]] = defaultdict(list)  # what a call reads -> the calls, in graph order
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(facts.modules[node.target], MERGEABLE):
            readers[hashable_key((node.args, node.kwargs))].append(node)
    groups: list[list[fx.Node]] = []

    # TODO(human): split each reader list into same-value runs, bucket each run's mergeable calls by merge_key, keep every bucket with >= 2 distinct modules as a group, and report every other call as skipped (tests check which calls merge together, and that each refused or lone call is in report.skipped). Hint: sibling_refusal(module) first, then merge_key(module); a module called twice counts once. More: same_value_runs(nodes, facts) splits one reader list into runs; a dict of lists keyed by merge_key collects a run's buckets (collections.defaultdict); count a bucket's distinct modules by node.target; lone_reason words the skip of a call that merges with nothing
    # BEGIN SOLUTION
    for nodes in readers.values():
        for run in same_value_runs(nodes, facts):
            buckets: dict[tuple, list[fx.Node]] = defaultdict(list)
            for node in run:
                module = facts.modules[node.target]
                why = sibling_refusal(module)
                if why:
                    report.skip(type(module).__name__, [node.name], why)
                else:
                    buckets[merge_key(module)].append(node)
            for key, members in buckets.items():
                if len({n.target for n in members}) >= 2:
                    groups.append(members)  # graph order: members[0] is the earliest sibling
                else:
                    why = lone_reason(members, run, nodes, buckets)
                    report.skip(dict(key)["kind"], [n.name for n in members], why)
    # END SOLUTION
    return groups


def merge_modules(mods: list[nn.Module]) -> nn.Module:
    """One wide nn.Linear / nn.Conv2d computing every module of ``mods`` at once: their weights concatenated on the
    output dim (dim 0), their biases too (a zero slice for a module without bias; no bias if none has one).

    The result owns *new* parameters; ``mods`` are not touched.
    """
    first, total = mods[0], sum(m.weight.shape[0] for m in mods)
    w = first.weight
    # TODO(human): build one module whose weight is cat of the weights on dim 0 and whose bias is cat of the biases (zeros where a module has none; None if no module has one), with first's hyper-parameters, dtype, device and requires_grad (tests check the merged module's outputs equal each module's, for Linear and Conv2d, mixed bias). Hint: build it on device='meta' (no initialisation cost), then assign nn.Parameter(...). More: a constructor on device='meta' allocates nothing, so its initialisation costs nothing; then replace its weight and bias by new nn.Parameter objects made from torch.cat of the modules' tensors (detached: the merged module owns new leaves), on first's device and dtype; a module without bias contributes zeros of its width (Tensor.new_zeros); a Conv2d also needs first's kernel_size, stride, padding, dilation and padding_mode
    # BEGIN SOLUTION
    has_bias = any(m.bias is not None for m in mods)
    if isinstance(first, nn.Linear):
        merged = nn.Linear(first.in_features, total, bias=has_bias, device="meta")
    else:
        hyper = {f: getattr(first, f) for f in ("stride", "padding", "dilation", "padding_mode")}
        merged = nn.Conv2d(first.in_channels, total, first.kernel_size, bias=has_bias, device="meta", **hyper)
    with torch.no_grad():
        weight = torch.cat([m.weight for m in mods], dim=0)  # (sum N_i, K) or (sum C_i, C_in, kh, kw)
        merged.weight = nn.Parameter(weight, requires_grad=w.requires_grad)
        if has_bias:
            biases = [m.bias if m.bias is not None else w.new_zeros(m.weight.shape[0]) for m in mods]
            merged.bias = nn.Parameter(torch.cat(biases), requires_grad=w.requires_grad)  # (sum N_i,)
    return merged
    # END SOLUTION


def rewire_group(
    graph: fx.Graph, nodes: list[fx.Node], target: str, slices: dict[str, tuple[int, int]], dim: int, copies: set
) -> None:
    """Replace the sibling calls ``nodes`` by one call of the merged module ``target`` and one slice each.

    ``slices[node.target] = (start, width)`` along ``dim``; a node in ``copies`` gets ``.clone()`` of its slice.
    """
    first = nodes[0]
    # TODO(human): insert the merged call where the earliest sibling is, give each sibling its slice as torch.narrow(merged, dim, start, width) (cloned if the node is in copies), point the sibling's users at it and erase the sibling (tests check outputs and input gradients against the unfused model). Hint: graph.inserting_before(first) keeps every new node above all users. More: graph.call_module, graph.call_function and graph.call_method build nodes at the insertion point; copy each sibling's node.meta onto its slice, so that later passes still see its shape; each sibling then hands its users over (Node.replace_all_uses_with) and leaves the graph (Graph.erase_node)
    # BEGIN SOLUTION
    with graph.inserting_before(first):
        merged = graph.call_module(target, first.args, first.kwargs)
        for node in nodes:
            start, width = slices[node.target]
            piece = graph.call_function(torch.narrow, (merged, dim, start, width))
            if node in copies:
                piece = graph.call_method("clone", (piece,))
            piece.meta.update(node.meta)
            node.replace_all_uses_with(piece)
    for node in nodes:
        graph.erase_node(node)
    # END SOLUTION


# ----------------------------------------------------------------------------------------------------------------------
# The pass


def fuse_horizontal(model: nn.Module, *, clone_outputs: bool = True) -> fx.GraphModule:
    """Merge every group of >= 2 sibling ``nn.Linear`` (or ``nn.Conv2d``) calls that read the same value into one wide
    module followed by a slice per sibling. Never mutates ``model``; ``report_of(gm)`` lists every Linear/Conv2d
    call: merged (with its group) or skipped (with why).

    ``clone_outputs=False`` returns siblings that are graph outputs as views of the merged output (no copy, e.g.
    for a benchmark of Q/K/V projections): same values, but the caller must not modify them in place under autograd.
    """
    gm = copy_to_graph_module(model, what="fuse_horizontal")
    facts = graph_facts(gm)
    report = FusionReport("fuse_horizontal")
    groups = group_siblings(gm, facts, report)
    plans = [{n: slice_plan(n, facts, clone_outputs) for n in nodes} for nodes in groups]  # on the untouched graph
    for nodes, plan in zip(groups, plans, strict=True):
        targets = list(dict.fromkeys(n.target for n in nodes))  # distinct modules, in order of first call
        mods = [facts.modules[t] for t in targets]
        name = merged_module_name(gm, targets)
        gm.add_submodule(name, merge_modules(mods))
        slices, start = {}, 0
        for t, m in zip(targets, mods, strict=True):
            slices[t] = (start, m.weight.shape[0])
            start += m.weight.shape[0]
        copies = {n for n, (why, _) in plan.items() if why}
        rewire_group(gm.graph, nodes, name, slices, -1 if isinstance(mods[0], nn.Linear) else -3, copies)
        for why, views in plan.values():
            for view in [] if why else views:
                view.target = {"view": "reshape", "view_as": "reshape_as"}[view.target]
        widths = "+".join(str(slices[t][1]) for t in targets)
        notes = "; ".join(f"{n.name} cloned: {why}" for n, (why, _) in plan.items() if why)
        reshaped = [v.name for _, views in plan.values() for v in views if v.target.startswith("reshape")]
        reason = f"widths {widths} = {start}" + (f"; {notes}" if notes else "")
        reason += f"; {', '.join(reshaped)}: view -> reshape" if reshaped else ""
        report.fuse(type(mods[0]).__name__, [n.name for n in nodes], replacement=name, reason=reason)
    position = {n.name: i for n, i in facts.order.items()}
    report.decisions.sort(key=lambda d: min(position[name] for name in d.nodes))  # the report in graph order
    finish_rewrite(gm)
    return attach_report(gm, report)


# ----------------------------------------------------------------------------------------------------------------------
# The lesson


def _show(title: str, model: nn.Module, inputs: tuple[torch.Tensor, ...], grad: bool = True) -> fx.GraphModule:
    gm = show_rewrite(title, model, fuse_horizontal)
    xs = [x.double().requires_grad_(grad) for x in inputs]
    ys = [x.double().requires_grad_(grad) for x in inputs]
    with torch.set_grad_enabled(grad):  # (an in-place op on a Linear's input leaves no gradient to compare)
        ref, out = model.double()(*xs), gm.double()(*ys)
    line = f"\nfloat64, max |fused - unfused|: output {max_abs_diff(out, ref):.3g}"
    if grad:
        ref.square().sum().backward()
        out.square().sum().backward()
        line += f", input gradient {max(max_abs_diff(a.grad, b.grad) for a, b in zip(xs, ys, strict=True)):.3g}"
    print(line)
    model.float(), gm.float()
    return gm


def qkv_cost_rows(tokens: int, d: int, elem: int = 2) -> list[tuple]:
    """Bytes, FLOPs and launches of three (tokens, d) x (d, d) projections vs one (tokens, d) x (d, 3d) GEMM."""
    x, w, y = tokens * d * elem, d * d * elem, tokens * d * elem
    flops = 2 * tokens * d * d
    rows = []
    for name, n, reads_x in (("3 GEMMs", 3, 3), ("1 merged GEMM", 1, 1)):
        moved = reads_x * x + 3 * w + 3 * y
        rows.append((f"x ({tokens}, {d})", name, n, f"{moved / 1e6:.2f}", f"{3 * flops / moved:.0f}"))
    return rows


def run(quick: bool = False) -> None:
    torch.manual_seed(0)
    heading("Phase 7 — horizontal fusion: siblings that read one input become one wide op")
    print("group (same input, same merge_key) -> merge (cat weights on the output dim) -> rewire (narrow per sibling)")

    gm = _show("Attention: q, k, v read x (v has no bias)", models.QKVAttention(), models.attention_inputs())
    print("\ngm.code:")
    print(gm.code.strip())
    print("\nThe merged Linear owns new parameters (cat of q, k, v); the caller's q, k, v are untouched.")

    inception = "Inception block: three 1x1 convs merge; the 3x3 and the pooled branch cannot"
    _show(inception, models.InceptionBlock(), models.inception_inputs())
    inplace = "An in-place op between two siblings: same node, two values"
    _show(inplace, models.InPlaceBetweenSiblings(), (torch.randn(2, 4),), grad=False)

    heading("What the merged GEMM saves (bf16, computed from the shapes; Phase 4 times it on a GPU)", "-")
    rows = qkv_cost_rows(32, 1024) + qkv_cost_rows(8192 if not quick else 2048, 1024)
    print(table(rows, ["input", "variant", "launches", "MB moved", "FLOP/byte"]))
    print(f"Decode (32 tokens): the weights dominate the bytes and each GEMM is tiny ({rows[0][-1]} FLOP/byte, below")
    print("the ridge point Phase 4 measures, ~240 on an H100), so one launch instead of three is the win. Prefill:")
    print("each GEMM is already compute-bound; reading x once saves bytes, but the time is set by the FLOPs, which do")
    print("not change. And a sibling that needs a contiguous copy (report: 'cloned') pays back part of the saving.")

    heading("Elementwise siblings on the aten graph (Phase 6 regions)", "-")
    x = torch.randn(64 if quick else 256, 64)
    aten_gm = capture_aten(models.PointwiseSiblings(), (x,))
    regions = unique_regions(build_fusion_regions(aten_gm))
    for r in regions:
        outs = [n.name for n in r.external_outputs]
        print(f"region {r.index}: {r.summary()}  outputs: {', '.join(outs)}")
        saved = 1 - r.total_bytes / r.unfused_bytes
        print(f"  fused {r.total_bytes} bytes vs unfused {r.unfused_bytes} bytes ({saved:.0%} less traffic)")
    print("relu(h) and sigmoid(h) read one h: they join h's producer (x * s) in one kernel with two outputs, so h")
    print("is never written to memory nor read back twice. Phase 6 joins siblings only through a producer in the")
    print("same span: two pointwise consumers of a matmul output or of a graph input stay two kernels there;")
    print("Inductor's scheduler also merges kernels that merely share reads (can_fuse_horizontal).")


def main(argv: list[str] | None = None) -> int:
    return lesson_cli(run, __doc__, argv)


registry.register(7, fuse_horizontal=fuse_horizontal)  # what Phase 4 measures (fusion/compiler/registry.py)
if __name__ == "__main__":
    raise SystemExit(main())
