"""fusion.common: the clean-up every pass shares, the report, the clear errors."""

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

from fusion.common import FusionReport, attach_report, copy_to_graph_module, finish_rewrite, report_of

pytestmark = pytest.mark.tooling


class InplaceStatement(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        h = x * 2
        h.relu_()  # result unused, effect on h is not
        torch.relu_(h)
        self.act(h)
        h.add_(1)
        return h - 1


def test_finish_rewrite_keeps_inplace_statements_whose_result_is_unused():
    model = InplaceStatement()
    gm = finish_rewrite(fx.symbolic_trace(model))
    x = torch.randn(4, 3)
    torch.testing.assert_close(gm(x), model(x))
    assert sum(n.op != "placeholder" and n.op != "output" for n in gm.graph.nodes) == 6


def test_finish_rewrite_still_removes_dead_pure_nodes():
    class Dead(nn.Module):
        def forward(self, x):
            unused = torch.sin(x)  # noqa: F841
            return x + 1

    gm = finish_rewrite(fx.symbolic_trace(Dead()))
    assert not any(n.target is torch.sin for n in gm.graph.nodes)


def test_report_round_trip_and_missing_report():
    gm = copy_to_graph_module(nn.Linear(2, 2))
    report = FusionReport("p")
    report.fuse("A+B", ["a", "b"], "ab")
    report.skip("A+B", ["c", "d"], "c has two users")
    assert report_of(attach_report(gm, report)) is report
    assert [d.nodes for d in report.fused] == [("a", "b")] and report.skipped[0].reason == "c has two users"
    assert "two users" in report.table()
    with pytest.raises(KeyError, match="no fusion report"):
        report_of(copy_to_graph_module(nn.Linear(2, 2)))


def test_copy_to_graph_module_does_not_share_parameters():
    model = nn.Linear(3, 3)
    gm = copy_to_graph_module(model)
    with torch.no_grad():
        gm.weight.zero_()
    assert model.weight.abs().sum() > 0
