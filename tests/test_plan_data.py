"""The runtime holds data alone (issue 37): a compiled graph's launch plans reach no ``fx.Node`` and no torch object,
and every output comes back from a recipe of ``fusion.ir.views`` records (a stored tensor, a strided view of one, or
aten steps by name), equal to eager, strides included."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch
import torch.fx as fx
from support import Fn

from fusion.codegen import compile_regions
from fusion.compiler.launch_plans import recipe
from fusion.ir import views
from fusion.ir.plan import LaunchPlan
from fusion.kernels.triton_runtime import RegionKernel

pytestmark = pytest.mark.phase8


def _escaping(x):
    h = (x * 2.0 + 1.0).relu()
    v = h.view(torch.int32)  # another dtype: no strides say it, aten steps rebuild it
    return h, h.t(), h[1:, ::2], v, v.view(-1)[2:5], torch.var_mean(h, dim=1)[0].view(3, 2)


def _reachable(obj, seen=None):
    """Every object reachable from ``obj`` through dataclass fields, tuples, lists and dicts."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    yield obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, (tuple, list, set, frozenset)):
        children = list(obj)
    elif isinstance(obj, dict):
        children = [*obj.keys(), *obj.values()]
    else:
        children = []
    for child in children:
        yield from _reachable(child, seen)


def _plans(compiled) -> list[LaunchPlan]:
    return [m.plan for m in compiled.compiled.graph_module.modules() if isinstance(m, RegionKernel)]


def test_a_compiled_graphs_plans_hold_no_fx_node_and_no_torch_object():
    x = torch.randn(6, 4)
    compiled = compile_regions(Fn(_escaping), (x,))
    plans = _plans(compiled)
    assert plans and all(isinstance(p, LaunchPlan) for p in plans)
    for plan in plans:
        for obj in _reachable(plan):
            assert not isinstance(obj, (fx.Node, fx.Graph, torch.nn.Module)), (plan.name, obj)
            assert type(obj).__module__.split(".")[0] != "torch", (plan.name, type(obj), obj)
        assert pickle.loads(pickle.dumps(plan)) == plan  # data: it pickles and compares


def test_every_escaping_value_comes_back_from_its_recipe_as_eager_has_it():
    x = torch.randn(6, 4)
    compiled = compile_regions(Fn(_escaping), (x,))
    for got, want in zip(compiled(x), _escaping(x), strict=True):
        torch.testing.assert_close(got, want)
        assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
    (plan,) = _plans(compiled)
    kinds = [type(r) for r in plan.results]
    assert kinds.count(views.ViewOf) >= 2, plan.results  # h.t() and h's slice: views of h, which is returned too
    # the variance, stored as (6,) and returned only as (3, 2), is allocated as (3, 2) and returned as it is
    assert kinds.count(views.Take) >= 2 and (3, 2) in [s.shape for s in plan.stored], (plan.results, plan.stored)
    dtype_views = [r for r in plan.results if isinstance(r, views.Steps)]
    assert len(dtype_views) == 2, plan.results  # v and its slice: only these run aten steps
    assert dtype_views[0].steps[0] == views.Step("aten.view.dtype", (views.Ref(1), views.TorchName("int32")))


def test_a_recipe_refers_to_buffers_by_position_and_resolves_ops_by_name():
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.aten.relu.default, (x,))
    v = g.call_function(torch.ops.aten.view.dtype, (y, torch.int32))
    s = g.call_function(torch.ops.aten.slice.Tensor, (v, 0, 1, 3))
    r = recipe(s, {x: 0, y: 1})  # no meta: not strided, so steps
    assert r == views.Steps((
        views.Step("aten.view.dtype", (views.Ref(1), views.TorchName("int32"))),
        views.Step("aten.slice.Tensor", (views.Prev(0), 0, 1, 3)),
    ))  # fmt: skip
    assert recipe(y, {x: 0, y: 1}) == views.Take(1)
    t = torch.randn(4, 2)
    out = views.runner(r)([torch.empty(0), t])
    torch.testing.assert_close(out, t.view(torch.int32)[1:3])
    assert views.resolve("getitem")((5, 6), 1) == 6


def test_a_view_of_a_stored_buffer_with_its_own_layout_is_the_buffer():
    """A region's output that is a view of what the kernel stores with the stored tensor's own sizes, strides and
    offset (a reshape to the shape it has) is returned as the stored buffer (``Take``): no tensor made per call, and
    the launch's outputs are its stored tensors (``Launcher._plain``, what the CPU memory plan reuses). A view of an
    input, or one with another layout, stays a view."""
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.aten.relu.default, (x,))
    same = g.call_function(torch.ops.aten.view.default, (y, [4, 2]))
    flat = g.call_function(torch.ops.aten.view.default, (y, [8]))
    of_input = g.call_function(torch.ops.aten.view.default, (x, [4, 2]))
    t = torch.empty(4, 2)
    for n, val in ((x, t), (y, t), (same, t), (flat, t.view(8)), (of_input, t)):
        n.meta["val"] = val
    where = {x: 0, y: 1}
    assert recipe(same, where, 1) == views.Take(1)
    assert recipe(flat, where, 1) == views.ViewOf(1, (8,), (1,), 0)
    assert recipe(of_input, where, 1) == views.ViewOf(0, (4, 2), (2, 1), 0)
    assert recipe(same, where) == views.ViewOf(1, (4, 2), (2, 1), 0)  # without knowing which buffers are stored


def test_a_stored_tensor_returned_once_as_all_of_it_is_allocated_as_returned():
    """launch_plans.allocated_as_returned: the kernel writes through a pointer, so a stored tensor the launch returns
    only as a view over all its memory is allocated in the view's sizes and strides and returned as it is (Take). A
    view of part of it, a view at an offset, or a tensor another result also reads keeps its own layout."""
    from fusion.compiler.launch_plans import allocated_as_returned
    from fusion.ir.plan import TensorSpec

    spec = TensorSpec((2, 8, 8, 12), (768, 96, 12, 1), "float32")
    whole = views.ViewOf(1, (128, 12), (12, 1), 0)  # buffer 0 is the input, 1 the stored tensor
    permuted = views.ViewOf(1, (2, 12, 8, 8), (768, 1, 96, 12), 0)
    for view in (whole, permuted):
        stored, results = allocated_as_returned((spec,), (view,), first=1)
        assert results == (views.Take(1),) and stored == (TensorSpec(view.sizes, view.strides, "float32"),)
    part = views.ViewOf(1, (64, 12), (12, 1), 0)
    shifted = views.ViewOf(1, (127, 12), (12, 1), 12)
    of_input = views.ViewOf(0, (128, 12), (12, 1), 0)
    dtype_view = views.Steps((views.Step("aten.view.dtype", (views.Ref(1), views.TorchName("int32"))),))
    for results in ((part,), (shifted,), (of_input,), (whole, dtype_view), (whole, views.Take(1))):
        assert allocated_as_returned((spec,), results, first=1) == ((spec,), results), results
    row = TensorSpec((1, 3), (3, 1), "float32")  # x[..., ::2] of it: the same extent, but a hole (the fuzzer's find)
    holey = (views.ViewOf(1, (1, 2), (3, 2), 0),)
    assert allocated_as_returned((row,), holey, first=1) == ((row,), holey)
