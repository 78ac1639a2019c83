"""Folded Conv+BatchNorm weights, computed from the live parameters: the rewrite behind Phase 9's pass ``fold_bn``.

Folding BatchNorm into a convolution needs the parameters' *values*, but in a Dynamo graph the parameters are graph
inputs, so the values can change between calls (an optimizer step, ``load_state_dict``, a forward in training mode
updating the running stats). Inductor folds only under ``torch._inductor.config.freezing``, where it promises the
user that they won't. We fold without that promise: :class:`FoldedWeights` computes the folded weight and bias from
the live inputs on the first call and keeps them while every source tensor is the same tensor at the same version
(``tensor._version`` counts in-place writes); any change refolds. The folded tensors enter the graph as extra
inputs, appended after the real ones (:func:`install_folds`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

from fusion.fxutils.finish import relint


@dataclass(frozen=True)
class FoldSpec:
    """Where one fold reads its sources: graph-input positions (None: absent), and BatchNorm's eps."""

    weight: int
    bias: int | None
    running_mean: int
    running_var: int
    bn_weight: int | None
    bn_bias: int | None
    eps: float
    transposed: bool
    groups: int

    def sources(self) -> tuple[int, ...]:
        idx = (self.weight, self.bias, self.running_mean, self.running_var, self.bn_weight, self.bn_bias)
        return tuple(i for i in idx if i is not None)


class FoldedWeights:
    """Computes every fold's (weight, bias) from the graph's runtime inputs; cached while the sources are unchanged.

    ``fold_fn`` is Phase 5's ``fold_conv_bn_weights(conv_w, conv_b, rm, rv, eps, bn_w, bn_b, transpose=, groups=)``.
    """

    def __init__(self, specs: Sequence[FoldSpec], fold_fn: Callable) -> None:
        self.specs = list(specs)
        self.fold_fn = fold_fn
        self.sources = sorted({i for s in self.specs for i in s.sources()})
        self.key: tuple | None = None
        self.folded: list[torch.Tensor] = []
        self.refolds = 0  # how many times the folded weights were computed (1 = once, never invalidated)

    def _key(self, args: Sequence[torch.Tensor]) -> tuple[list[int], list[int]] | None:
        """Every source's version counter (moved by in-place writes) and data pointer (moved by ``p.data = t``)."""
        sources = [args[i] for i in self.sources]
        try:  # ~0.3 µs per tensor: the whole cost of the guard on a call
            return [t._version for t in sources], [t.data_ptr() for t in sources]
        except RuntimeError:  # an inference tensor has no version counter: refold on every call
            return None

    def __call__(self, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        key = self._key(args)
        if key is not None and key == self.key:
            return self.folded
        get = lambda i: None if i is None else args[i]  # noqa: E731
        folded = []
        with torch.no_grad():
            for s in self.specs:
                w, b = self.fold_fn(
                    args[s.weight],
                    get(s.bias),
                    args[s.running_mean],
                    args[s.running_var],
                    s.eps,
                    get(s.bn_weight),
                    get(s.bn_bias),
                    transpose=s.transposed,
                    groups=s.groups if s.transposed else None,
                )
                folded += [w, b]
        self.key, self.folded, self.refolds = key, folded, self.refolds + 1
        return folded


def install_folds(
    gm: fx.GraphModule, matches: Sequence[tuple[fx.Node, fx.Node, fx.Node]], fold_fn: Callable
) -> FoldedWeights | None:
    """Rewrite every matched ``convolution → batch_norm(eval) → getitem 0`` into one convolution reading a folded
    weight and bias, two new graph inputs each. Returns the :class:`FoldedWeights` that computes them (None: none).

    Every source of a match must be a graph input (the matcher checks this).
    """
    if not matches:
        return None
    graph = gm.graph
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    position = {n: i for i, n in enumerate(inputs)}

    def pos(n: fx.Node | None) -> int | None:
        if n is None:
            return None
        if n not in position:
            raise ValueError(
                f"install_folds: {n.name} ({n.op} {n.target}) is computed in the graph, not a graph input: its value "
                "is not known before the call. Fix: find_conv_bn_folds must refuse a fold with such a source"
            )
        return position[n]

    last = inputs[-1]
    specs = []
    for k, (conv, bn, out) in enumerate(matches):
        x, w, b, _stride, _pad, _dil, transposed, _opad, groups = conv.args
        _, bn_w, bn_b, rm, rv, _momentum, eps = bn.args
        specs.append(FoldSpec(pos(w), pos(b), pos(rm), pos(rv), pos(bn_w), pos(bn_b), float(eps), transposed, groups))
        with graph.inserting_after(last):
            new_w = graph.placeholder(f"folded_weight_{k}")
        with graph.inserting_after(new_w):
            new_b = graph.placeholder(f"folded_bias_{k}")
        last = new_b
        w_val, c_out = w.meta["val"], out.meta["val"].shape[1]
        new_w.meta["val"] = w_val
        new_b.meta["val"] = w_val.new_empty((c_out,))
        new_w.meta["folded"], new_b.meta["folded"] = "weight", "bias"
        conv.args = (x, new_w, new_b, *conv.args[3:])
        out.replace_all_uses_with(conv)
        for dead in [*bn.users, bn]:
            graph.erase_node(dead)
    relint(gm)
    return FoldedWeights(specs, fold_fn)
