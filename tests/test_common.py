"""fusion.common: the clean-up every pass shares, the report, the clear errors."""

import re

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

from fusion.common import (
    FusionReport,
    UntraceableModelError,
    attach_report,
    copy_to_graph_module,
    finish_rewrite,
    report_of,
    run_lesson,
    trace_module,
)

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


# ----------------------------------------------------------------------------------------------------------------------
# Errors that name the construct and the fix


class LoopOverBatch(nn.Module):
    def forward(self, x):
        out = x[0]
        for i in range(x.shape[0]):
            out = out + x[i]
        return out


class SizeAsInt(nn.Module):
    def forward(self, x):
        return x.new_zeros(int(x.size(0)))


@pytest.mark.parametrize("model", [LoopOverBatch(), SizeAsInt()], ids=lambda m: type(m).__name__)
def test_a_loop_over_a_size_names_the_construct_and_the_fix(model):
    with pytest.raises(UntraceableModelError) as info:
        trace_module(model)
    msg = str(info.value)
    assert type(model).__name__ in msg
    assert "range(x.shape[0])" in msg  # the construct, by name
    assert "concrete_args" in msg and "torch.fx.wrap" in msg  # the fixes
    assert "make forward() traceable" not in msg  # not the circular advice
    line = "for i in range(x.shape[0]):" if isinstance(model, LoopOverBatch) else "return x.new_zeros(int(x.size(0)))"
    assert line in msg  # the line of forward() that broke tracing


def test_a_class_instead_of_an_instance_shows_the_call_to_make():
    from torchvision.models import ResNet

    with pytest.raises(TypeError) as info:
        trace_module(ResNet)
    msg = str(info.value)
    assert "got the class ResNet" in msg and "pass an instance: ResNet()" in msg
    with pytest.raises(TypeError, match="got list"):
        copy_to_graph_module([nn.Linear(2, 2)])


def test_untraceable_torchvision_model_error_names_its_line():
    """The frame filter drops torch's own frames, `.../site-packages/torch/`, not every path that starts with
    `.../site-packages/torch`: torchvision's line used to be dropped with them."""
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    with pytest.raises(UntraceableModelError) as info:
        trace_module(model)
    assert re.search(r"cannot trace SSD \(at ssd\.py:\d+ `.+`\)", str(info.value)), str(info.value)


def test_a_lesson_stopped_by_a_todo_prints_where_that_todo_is(tmp_path, capsys):
    lesson = tmp_path / "lesson_x.py"
    lesson.write_text(
        "def solved():\n    return 1\n\n\ndef run(quick=False):\n    solved()\n"
        "    # TODO(human): do it. Hint: h\n"
        '    raise NotImplementedError("TODO(human) Phase 2: do it. Hint: uv run python -m fusion.practice hint 2")\n'
    )
    ns: dict = {}
    exec(compile(lesson.read_text(), str(lesson), "exec"), ns)
    assert run_lesson(ns["run"]) == 1
    err = capsys.readouterr().err
    assert "TODO(human) Phase 2: do it." in err and "Traceback" not in err
    assert f"  at {lesson}:7" in err.splitlines()  # the TODO(human) line above the stub that stopped the run
