"""``overlap_pass``: the backend option ``torch.compile(step, backend="fusion", options={"overlap": True})``.

The backend hands the pass its aten graph and a ``note(pass_name, node_names, verdict, why)`` callback for its
report. The pass builds the units (regions from the ``regions`` builder it is given), schedules them with the
``schedule`` it is given (the Phase 10 lesson passes its own), checks the order, and rewrites ``gm.graph`` in
place. A graph without collectives, or one the pass cannot take, is left as it is with a note saying why: never a
crash, never a wrong answer (the order is checked before anything moves).

Last, :func:`all_reduce_in_place`: funcol's ``all_reduce`` copies its input before reducing (``input.clone()``,
then ``all_reduce_`` of the copy), a full read and write of every gradient on the compute stream that eager runs
as a ``cudaMemcpyAsync`` (128 MiB: 63 µs on an H200, more beside a running collective). Where the input is a
buffer of this graph that nothing else reads, the copy buys nothing: the pass calls ``all_reduce_`` on it directly
(issue 40's data-parallel step: 8 copies of 128 MiB gone from the backward).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.comms.bucket import apply_buckets, plan_buckets
from fusion.comms.capture import is_collective, is_wait
from fusion.comms.cost import CostModel
from fusion.comms.units import OverlapGraph, ScheduleError, apply_order, check_regions, check_schedule
from fusion.fxutils.finish import relint

PASS = "overlap"
measured: CostModel | None = None  # set_cost_model(): a host's measured figures, for every rank's pass alike


def set_cost_model(model: CostModel | None) -> None:
    """The cost model the backend's pass uses from now on in this process (None: the stated defaults). Every rank
    must set the same one (e.g. rank 0's fit, broadcast), or ranks may choose different orders."""
    global measured
    measured = model


def overlap_pass(gm: fx.GraphModule, note: Callable[[str, list[str], str, str], None], *,
                 schedule: Callable, regions: Callable[[fx.GraphModule], dict] | None = None,
                 cost: CostModel | None = None, slack: float = 0.10) -> None:  # fmt: skip
    """Reorder ``gm.graph`` in place so that compute hides communication; one ``note`` per collective."""
    starts = [n for n in gm.graph.nodes if is_collective(n)]
    if not starts:
        note(PASS, [], "skipped", "no collectives in this graph: nothing to overlap")
        return
    try:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 2
        region_of = regions(gm) if regions is not None else {}
        if cost is None:
            cost = measured if measured is not None and measured.world_size == world else CostModel(world_size=world)
        graph = OverlapGraph(gm, cost, region_of)
        budget = int(graph.peak_memory(graph.original) * (1 + slack))
        order = schedule(graph, budget)
        check_schedule(graph, order, budget)
    except (ScheduleError, ValueError, KeyError, TypeError) as e:  # leave the graph as it is, say why
        note(PASS, [n.name for n in starts], "skipped", f"graph left unscheduled: {type(e).__name__}: {e}")
        return
    before, after = graph.timeline(graph.original), graph.timeline(order)
    apply_order(gm, graph, order)
    check_regions(gm, region_of)
    plan = plan_buckets(graph, order)
    apply_buckets(gm, plan)
    inplace = all_reduce_in_place(gm)
    if inplace:
        note(PASS, inplace, "in place", "each input is this graph's own buffer, read by nothing else: all_reduce_ "
             "reduces it where it is, without funcol's copy")  # fmt: skip
    for group in plan.groups:
        note(PASS, [u.name for u in group], "bucketed", "started back to back: one latency instead of "
             f"{len(group)}, exposed time not increased")  # fmt: skip
    for b, a in zip(before.collectives, after.collectives, strict=True):
        hiders = ", ".join(name for name, _ in sorted(a.hidden_by, key=lambda h: -h[1])[:3]) or "nothing"
        why = (f"exposed {b.exposed_ms * 1e3:.1f} -> {a.exposed_ms * 1e3:.1f} µs (cost {a.start.cost.ms * 1e3:.1f} µs);"
               f" hidden by {hiders}")  # fmt: skip
        note(PASS, [a.start.nodes[0].name, a.wait.nodes[0].name], "hidden" if a.exposed_ms == 0 else "partly", why)


def all_reduce_in_place(gm: fx.GraphModule) -> list[str]:
    """Rewrite ``all_reduce(x)`` as ``all_reduce_(x)`` where ``x`` is a contiguous buffer computed in this graph
    (not an input, a view or a collective's result) whose only reader is the all_reduce; return the rewritten names.

    The result is the same tensor, reduced in place, and still goes through its ``wait_tensor``: the numbers are
    those of the functional form bit for bit, without its copy. Run it last: the scheduler and the bucketing see
    funcol's functional form."""
    c10d = torch.ops._c10d_functional
    done = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not c10d.all_reduce.default:
            continue
        x = n.args[0]
        val = x.meta.get("val") if isinstance(x, fx.Node) else None
        private = (isinstance(x, fx.Node) and x.op == "call_function" and len(x.users) == 1 and not is_view_node(x)
                   and not is_wait(x) and not is_collective(x) and not _may_alias(x))  # fmt: skip
        if private and isinstance(val, torch.Tensor) and val.is_contiguous() and val.storage_offset() == 0:
            n.target = c10d.all_reduce_.default
            done.append(n.name)
    if done:
        relint(gm)
    return done


def _may_alias(node: fx.Node) -> bool:
    """Whether ``node``'s result may share storage with an input (a view, an in-place op, an unknown target)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return True
    return any(r.alias_info is not None for r in schema.returns) or schema.is_mutable
