"""Pass ``inline_gathers`` (``fusion.compiler.lower_gathers``): where a relative-position bias is gathered.

Swin's and MaxViT's attention add ``table[index]`` (a few thousand values) to the scores of every window, so a softmax
kernel reads each gathered value many times. The lowering stores such a gather once, by a kernel of its own, where a
kernel reads each value ``REREAD`` times or more (one load an element is cheaper than two dependent ones; a C kernel's
call and a replayed CUDA graph's launch cost little). On a GPU without CUDA graphs the pass keeps it a load inside
the softmax's kernel (one launch fewer, as Inductor does). The pass is CUDA-gated; ``ON_CPU`` lets it mark CPU graphs
here. Tests: the kernel counts each way and the threshold, eager's values either way for drawn batch sizes (an empty
batch, NaN and inf in the scores), what turns the pass off (CUDA graphs, a CPU, the option).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support import library_calls

from fusion import backend
from fusion.compiler import driver, lower_gathers

pytestmark = pytest.mark.phase9


class BiasedSoftmax(torch.nn.Module):
    """Scores of ``heads`` heads over windows of w*w positions, plus a relative-position bias gathered from its table
    (Swin's ``relative_position_bias_table[relative_position_index]``), then softmax."""

    def __init__(self, heads: int, w: int = 3) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(heads)
        self.table = torch.nn.Parameter(torch.randn((2 * w - 1) ** 2, heads, generator=g, dtype=torch.float64))
        self.register_buffer("index", torch.randint(0, (2 * w - 1) ** 2, (w**4,), generator=g))
        self.heads, self.n = heads, w * w

    def forward(self, scores):
        bias = self.table[self.index].view(self.n, self.n, self.heads).permute(2, 0, 1).contiguous().unsqueeze(0)
        return (scores + bias).softmax(-1)


def _compile(model, x, options):
    backend.reset()
    out = torch.compile(model, backend="fusion", options=options)(x)
    kernels = [k for r in driver.reports for p in r.parts for k in p.kernels]
    gathers = [k for k in kernels if any("aten.index.Tensor" in op for op in k.ops)]
    return out, kernels, gathers


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(lower_gathers, "ON_CPU", True)


@pytest.mark.parametrize(
    "on_cpu_flag, options, stored",
    [
        (True, {}, False),
        (True, {"cudagraphs": True}, True),
        (True, {"inline_gathers": False}, True),
        (True, {"cudagraphs": True, "inline_gathers": True}, False),
        (False, {}, True),
        (False, {"inline_gathers": True}, False),
    ],  # fmt: skip
)
def test_a_broadcast_bias_is_gathered_in_the_softmax_unless_a_launch_is_cheap(
    renderer, monkeypatch, on_cpu_flag, options, stored
):
    """8 windows: each gathered value is read 8 times. Stored: a first kernel holds the gather (and its copy) alone,
    the softmax's kernel reads it as a plain input; else one kernel gathers inside the softmax. No aten index.
    ``on_cpu_flag`` False: a CPU graph as it is (the pass marks nothing there unless asked)."""
    monkeypatch.setattr(lower_gathers, "ON_CPU", on_cpu_flag)
    model = BiasedSoftmax(heads=2)
    x = torch.randn(8, 2, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out, kernels, gathers = _compile(model, x, options)
    torch.testing.assert_close(out, model(x))
    assert "index" not in library_calls(), library_calls()
    assert len(gathers) == 1, [k.ops for k in kernels]
    assert len(kernels) == (2 if stored else 1), [k.ops for k in kernels]
    assert not any("softmax" in op or "exp" in op for op in gathers[0].ops) == stored, gathers[0].ops


def test_a_gather_read_fewer_than_reread_times_stays_in_the_kernel_without_the_pass(renderer):
    """Two windows (each value read twice, below REREAD): one kernel with the pass off too."""
    assert lower_gathers.REREAD > 2
    model = BiasedSoftmax(heads=3)
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    out, kernels, gathers = _compile(model, x, {"inline_gathers": False})
    torch.testing.assert_close(out, model(x))
    assert len(kernels) == 1 and len(gathers) == 1, [k.ops for k in kernels]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    b=st.integers(0, 9),
    heads=st.integers(1, 3),
    inline=st.booleans(),
    special=st.sampled_from([None, float("nan"), float("inf"), float("-inf")]),
)
@example(b=0, heads=1, inline=True, special=None)
@example(b=5, heads=2, inline=False, special=float("nan"))
def test_either_way_the_values_are_eagers(renderer, b, heads, inline, special):
    model = BiasedSoftmax(heads)
    x = torch.randn(b, heads, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(b + heads))
    if special is not None and b:
        x[b - 1, 0, 4, 2] = special
    out, _, _ = _compile(model, x, {"inline_gathers": inline})  # explicit: marks on a CPU too
    torch.testing.assert_close(out, model(x), equal_nan=True)


def test_the_pass_says_why_it_marks_nothing(on_cpu):
    """Under CUDA graphs the report names the reason the gathers are stored."""
    model = BiasedSoftmax(heads=1)
    backend.reset()
    torch.compile(model, backend="fusion", options={"cudagraphs": True})(torch.randn(4, 1, 9, 9, dtype=torch.float64))
    notes = [p for r in driver.reports for part in r.parts for p in part.passes if p[0] == "inline gathers"]
    assert notes and notes[0][2] == "skipped" and "CUDA graphs" in notes[0][3], notes
