"""Issue 39: the attention families' copies (Swin's zero pads and rolls, MaxViT's splits and average pools) become
ops the generated kernels take (``fusion/compiler/view_copies.py``, ``fusion/aten/roll.py``): each pass, switched
off, leaves the op as an aten call outside every kernel; switched on, the op is gone and the outputs (and gradients)
are eager's."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from fusion import backend
from fusion.aten.capture import capture_aten
from fusion.compiler import driver

pytestmark = pytest.mark.phase9


def _outside(options: dict, fn, *args, grad: bool = False) -> tuple[Counter, list]:
    """Compile ``fn`` with ``options``: the ops every part left outside its kernels (library calls and fallbacks by
    op name), checked against eager (the outputs and, with ``grad``, every input's gradient)."""
    driver.reset()
    args = [a.detach().clone().requires_grad_(grad) for a in args]
    ref_args = [a.detach().clone().requires_grad_(grad) for a in args]
    got, ref = torch.compile(fn, backend="fusion", options=options)(*args), fn(*ref_args)
    torch.testing.assert_close(got, ref)
    if grad:
        torch.testing.assert_close(
            torch.autograd.grad(got.square().sum(), args), torch.autograd.grad(ref.square().sum(), ref_args)
        )
    out = Counter()
    for rep in driver.reports:
        assert not rep.error, rep.error
        for part in rep.parts:
            out += part.library_calls
    fallbacks = [f for rep in driver.reports for f in rep.fallbacks]
    backend.reset()
    return out, fallbacks


def _windows(x):  # Swin: a LayerNorm-like row op, a pad of 0 (the windows divide the map), the window partition
    y = F.layer_norm(x, x.shape[-1:]) * 2.0
    y = F.pad(y, (0, 0, 0, 0, 0, 0))
    return y.view(2, 2, 4, 2, 4, 8).permute(0, 1, 3, 2, 4, 5).reshape(-1, 16, 8) + 1.0


def _shifted(x):  # Swin's shifted windows: torch.roll on two dims, between pointwise ops
    y = torch.relu(x * 2.0)
    return torch.roll(y, shifts=(-2, -2), dims=(1, 2)).sigmoid() + y


def _split(x):  # MaxViT: q/k/v split along the channels
    a, b = (x * 2.0).split([4, 4], dim=-1)
    return a.sigmoid() * b + 1.0


def _unbind(x):
    a, b, c = (x * 2.0).unbind(1)
    return a * b + c.sin()


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("grad", [False, True])
def test_zero_pad_is_its_input(grad):
    x = _x(2, 8, 8, 8)
    off, _ = _outside({"zero_pads": False}, _windows, x, grad=grad)
    on, _ = _outside({}, _windows, x, grad=grad)
    assert off["constant_pad_nd"] >= 1, off
    assert on["constant_pad_nd"] == 0 and sum(on.values()) < sum(off.values()), (on, off)


@pytest.mark.parametrize("grad", [False, True])
def test_roll_is_a_cat_of_two_slices(grad):
    """torch.roll decomposes into two slices and a cat (fusion/aten/roll.py), forward and backward (the opposite
    roll): no index, fmod or iota outside the kernels (torch's reference decomposition gathers at a computed index)."""
    x = _x(2, 8, 8, 4)
    on, fallbacks = _outside({}, _shifted, x, grad=grad)
    assert not on and not fallbacks, (on, fallbacks)
    gm = capture_aten(Fn(_shifted), (x,))
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.cat.default in ops and not ops & {torch.ops.aten.index.Tensor, torch.ops.aten.roll.default}


@pytest.mark.parametrize("fn", [_split, _unbind])
def test_split_pieces_are_views(fn):
    x = _x(2, 3, 8) if fn is _unbind else _x(2, 4, 8)
    off, off_fb = _outside({"splits": False}, fn, x)
    on, on_fb = _outside({}, fn, x)
    assert any("getitem" in what for what, _ in off_fb), off_fb
    assert not on_fb and not on, (on, on_fb)


def test_a_pad_of_a_returned_value_is_kept():
    def fn(x):  # the pad's input is returned: the pad must stay a copy (two outputs never share memory)
        y = x * 2.0
        return y, F.pad(y, (0, 0)) + 1.0

    driver.reset()
    x = _x(4, 4)
    got = torch.compile(fn, backend="fusion")(x)
    torch.testing.assert_close(got, fn(x))
    assert got[0].data_ptr() != got[1].data_ptr()


def test_avg_pool_is_a_window_sum():
    def fn(x):  # MaxViT's downsampling branch: a 3x3 average, stride 2, padding 1 (counted), between pointwise ops
        return (F.avg_pool2d(torch.relu(x * 2.0), 3, 2, 1) + 1.0).sigmoid()

    x = _x(2, 4, 9, 9)  # the Triton renderer takes a window sum (C refuses one, with its reason: pass depthwise's rule)
    off, off_fb = _outside({"avg_pools": False, "renderer": "triton"}, fn, x)
    on, on_fb = _outside({"renderer": "triton"}, fn, x)
    assert off["avg_pool2d"] == 1 and off_fb, (off, off_fb)
    assert not on and not on_fb, (on, on_fb)
