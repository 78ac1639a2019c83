"""Phase 1: tracing, opcode counts, ShapeProp, and the untraceable-model error."""

import pytest
import torch
import torch.fx as fx
from hypothesis import given
from hypothesis import strategies as st

from fusion import models
from fusion.common import UntraceableModelError
from fusion.trace_basics import OPCODES, DataDependentNet, node_table, opcode_counts, shape_rows, trace

pytestmark = pytest.mark.phase1


def test_tinynet_has_all_six_opcodes_once():
    gm = trace(models.TinyNet())
    assert opcode_counts(gm) == {op: 1 for op in OPCODES}
    assert list(opcode_counts(gm)) == list(OPCODES)


def test_opcode_counts_of_mlp():
    counts = opcode_counts(trace(models.MLP()))
    # encoder: 2 Linear + 2 ReLU, skip, act, head = 7 modules; the residual `+` is the one call_function
    assert counts == {
        "placeholder": 1,
        "get_attr": 0,
        "call_function": 1,
        "call_module": 7,
        "call_method": 0,
        "output": 1,
    }


def test_opcode_counts_of_functional_mlp():
    counts = opcode_counts(trace(models.FunctionalMLP()))
    # F.relu x2 (one in-place) and torch.relu are functions; .relu() is a method; 5 Linear modules
    assert counts["call_function"] == 3
    assert counts["call_method"] == 1
    assert counts["call_module"] == 5


@given(batch=st.integers(1, 5), d=st.integers(1, 12))
def test_shape_prop_shapes(batch, d):
    model = models.TinyNet(d=d)
    (x,) = models.tiny_inputs(batch=batch, d=d)
    rows = {name: (op, shape, dtype) for name, op, shape, dtype in shape_rows(trace(model), x)}
    assert rows["x"] == ("placeholder", (batch, d), "float32")
    assert rows["scale"] == ("get_attr", (d,), "float32")
    assert rows["linear"][1] == (batch, d)
    assert rows["add"][1] == (batch, d)
    assert rows["relu"] == ("call_method", (batch, d), "float32")
    assert "output" not in rows


class ChunkAndSize(torch.nn.Module):
    """Nodes whose result is not one tensor: a tuple (chunk), a Python int (size), and the output."""

    def forward(self, x):
        a, b = x.chunk(2, 1)  # one call_method node holding a tuple, two getitem nodes holding tensors
        n = x.size(0)  # an int, not a tensor
        return (a * b).view(n, -1)


@given(batch=st.integers(1, 4), half=st.integers(1, 3))
def test_shape_rows_skips_tuple_and_non_tensor_results(batch, half):
    x = torch.randn(batch, 2 * half)
    rows = shape_rows(trace(ChunkAndSize()), x)
    assert [(name, op) for name, op, *_ in rows] == [
        ("x", "placeholder"),
        ("getitem", "call_function"),
        ("getitem_1", "call_function"),
        ("mul", "call_function"),
        ("view", "call_method"),
    ]  # every tensor node, in graph order; not chunk (a tuple), not size (an int), not output
    shapes = {name: shape for name, _, shape, _ in rows}
    assert shapes["getitem"] == shapes["getitem_1"] == shapes["view"] == (batch, half)
    assert all(isinstance(shape, tuple) and dtype == "float32" for *_, shape, dtype in rows)


def test_shape_prop_follows_dtype():
    model = models.TinyNet().double()
    (x,) = models.tiny_inputs()
    assert {dtype for *_, dtype in shape_rows(trace(model), x.double())} == {"float64"}


def test_trace_is_equivalent_and_does_not_copy():
    model = models.MLP()
    gm = trace(model)
    assert isinstance(gm, fx.GraphModule)
    (x,) = models.mlp_inputs()
    torch.testing.assert_close(gm(x), model(x))


def test_node_table_lists_every_node_and_users():
    gm = trace(models.TinyNet())
    text = node_table(gm)
    for node in gm.graph.nodes:
        assert node.name in text
    assert "users" in text.splitlines()[0]
    line = next(line for line in text.splitlines() if line.startswith("call_module"))
    assert line.rstrip().endswith("add")  # linear's only user is the add


def test_untraceable_model_error_names_model_line_and_fix():
    with pytest.raises(UntraceableModelError) as info:
        trace(DataDependentNet())
    msg = str(info.value)
    assert "DataDependentNet" in msg
    assert "if x.sum() > 0" in msg  # the offending line of forward()
    assert "Proxy" in msg and "torch.where" in msg  # why, and a fix
    assert isinstance(info.value.__cause__, Exception)  # torch's own error is kept as the cause


def test_non_module_gets_type_error():
    with pytest.raises(TypeError, match=r"got the class TinyNet; pass an instance: TinyNet\(\)"):
        trace(models.TinyNet)  # the class, not an instance
    with pytest.raises(TypeError, match="torch.nn.Module"):
        trace(torch.randn(2))


def test_phase_runs(capsys):
    from fusion import trace_basics

    trace_basics.run(quick=True)
    out = capsys.readouterr().out
    assert "placeholder" in out and "ShapeProp" in out and "trace() refused it" in out
