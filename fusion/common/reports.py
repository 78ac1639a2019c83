"""Fusion reports: every pass says what it fused and what it skipped, and why (:class:`FusionReport`, stored on the
module it returns and read back with :func:`report_of`); :func:`show_rewrite` prints a pass at work."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from fusion.common.text import heading, node_table, table
from fusion.common.tracing import copy_to_graph_module


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
