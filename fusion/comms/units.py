"""The graph an overlap scheduler orders: atomic units, their simulated timeline and memory, and the rules.

A *unit* is what the scheduler may move as a whole: one fusion region (never split: it is one kernel), one
collective start, one wait, or one other node. :class:`OverlapGraph` builds them from an fx graph, a cost model and
Phase 6's ``region_of`` (node → region, anything with ``.nodes`` and ``.total_bytes``), and answers the questions a
schedule is judged by:

* :meth:`OverlapGraph.timeline` — two engines, as on a GPU: compute runs units one after another; the network runs
  collectives one after another (NCCL's one stream), each starting when the compute engine reaches its start and the
  previous collective is done. A wait blocks compute until its collective ends: ``exposed = max(0, end − now)``.
* :meth:`OverlapGraph.peak_memory` — bytes of live tensors over the order: a unit allocates its outputs (a region
  only those leaving it; a view or wait nothing), a value dies after its last user, and an all_gather or
  reduce_scatter holds its input until its wait (NCCL reads it meanwhile). An all_reduce does not: funcol's
  ``all_reduce`` copies its input into the output buffer when it starts (``input.clone()``, then an in-place
  all-reduce of the copy), so the input may die at the start. Graph inputs are resident and not counted.
* :func:`check_schedule` — a permutation of the units, every unit after its inputs (so every wait after its
  collective and before its users), peak memory within the budget; :func:`check_regions` on the rewritten fx graph.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.comms.capture import is_collective, is_wait, short
from fusion.comms.cost import Cost, CostModel, node_bytes
from fusion.fxutils.finish import relint


def holds_input(start: fx.Node) -> bool:
    """Whether a collective start keeps reading its input until its wait. Not an all_reduce: funcol's copies the
    input into its output at the start (``input.clone()`` then ``all_reduce_`` of the copy). Counting the input alive
    until the wait made every early gradient all_reduce look like a second copy of the gradient, and the memory
    budget then kept data parallelism's all_reduces at the end of backward (issue 40)."""
    return short(start) != "all_reduce"


class ScheduleError(ValueError):
    """A schedule breaks a rule: not a topological order, a unit missing or twice, or over the memory budget."""


@dataclass(eq=False)
class Unit:
    index: int  # position in the original (unscheduled) order
    kind: str  # "input" | "compute" | "start" | "wait"
    nodes: list[fx.Node]
    cost: Cost
    name: str
    preds: tuple[int, ...] = ()
    succs: tuple[int, ...] = ()
    partner: int | None = None  # a start's wait, a wait's start
    region: bool = False

    def __repr__(self) -> str:
        return f"Unit({self.index} {self.kind} {self.name})"


@dataclass
class CollectiveTime:
    """One collective on the timeline: when it ran, how much of it compute did not hide, and what hid it."""

    start: Unit
    wait: Unit
    began_ms: float
    ended_ms: float
    exposed_ms: float
    hidden_by: list[tuple[str, float]] = field(default_factory=list)  # (unit name, ms of overlap)


@dataclass
class Timeline:
    step_ms: float
    exposed_ms: float
    collectives: list[CollectiveTime]
    spans: list[tuple[str, float, float]] = field(default_factory=list)  # compute units: (name, start, end) ms


class OverlapGraph:
    def __init__(self, gm: fx.GraphModule | fx.Graph, cost: CostModel, region_of: dict | None = None) -> None:
        graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
        self.graph, self.cost_model = graph, cost
        nodes = [n for n in graph.nodes if n.op != "output"]
        position = {n: i for i, n in enumerate(nodes)}
        groups: dict[int, list[fx.Node]] = {}  # id(region) -> members in graph order
        region_obj: dict[int, object] = {}
        for n, r in (region_of or {}).items():
            if n not in position:
                raise ScheduleError(
                    f"region_of names node {getattr(n, 'name', n)!r}, which is not in this graph. Fix: pass the "
                    "region_of that Phase 6's build_fusion_regions returned for this same graph"
                )
            groups.setdefault(id(r), []).append(n)
            region_obj[id(r)] = r
        unit_nodes: list[tuple[list[fx.Node], object]] = []
        seen: set[int] = set()
        for n in nodes:
            r = (region_of or {}).get(n)
            if r is None:
                unit_nodes.append(([n], None))
            elif id(r) not in seen:
                seen.add(id(r))
                unit_nodes.append((sorted(groups[id(r)], key=position.__getitem__), region_obj[id(r)]))
        owner = {n: i for i, (ns, _) in enumerate(unit_nodes) for n in ns}
        preds = [sorted({owner[i] for n in ns for i in n.all_input_nodes if owner.get(i, k) != k}) for k, (ns, _)
                 in enumerate(unit_nodes)]  # fmt: skip
        order = _topological(unit_nodes, preds)  # original order: topological, ties by first node
        renumber = {old: new for new, old in enumerate(order)}
        self.units: list[Unit] = []
        for old in order:
            ns, region = unit_nodes[old]
            self.units.append(
                self._make_unit(renumber[old], ns, region, tuple(sorted(renumber[p] for p in preds[old])))
            )
        succs: list[list[int]] = [[] for _ in self.units]
        for u in self.units:
            for p in u.preds:
                succs[p].append(u.index)
        self.unit_of: dict[fx.Node, Unit] = {}
        for u in self.units:
            u.succs = tuple(succs[u.index])
            for n in u.nodes:
                self.unit_of[n] = u
        for u in self.units:
            if u.kind == "wait":
                start = self.unit_of[u.nodes[0].args[0]]
                u.partner, start.partner = start.index, u.index
        self._memory_plan(graph)
        # Units some collective (transitively) waits for: running them early lets communication start early.
        self.feeds_collective: set[int] = set()
        stack = [p for u in self.units if u.kind == "start" for p in u.preds]
        while stack:
            i = stack.pop()
            if i not in self.feeds_collective:
                self.feeds_collective.add(i)
                stack.extend(self.units[i].preds)

    def _make_unit(self, index: int, ns: list[fx.Node], region: object, preds: tuple[int, ...]) -> Unit:
        n = ns[0]
        if region is not None:
            return Unit(index, "compute", ns, self.cost_model.region(region), f"region {ns[0].name}…{ns[-1].name}",
                        preds, region=True)  # fmt: skip
        if n.op != "call_function":
            kind = "input"
        elif is_collective(n):
            kind = "start"
        elif is_wait(n):
            if not (isinstance(n.args[0], fx.Node) and is_collective(n.args[0])):
                raise ScheduleError(f"wait {n.name!r} waits on {n.args[0]!r}, not on a collective of this graph")
            kind = "wait"
        else:
            kind = "compute"
        cost = Cost(0.0, "graph input") if kind == "input" else self.cost_model.node(n)
        return Unit(index, kind, ns, cost, n.name, preds)

    # ------------------------------------------------------------------------------------------------------------------
    # Memory

    def _memory_plan(self, graph: fx.Graph) -> None:
        """For each unit: bytes it allocates, and the storages whose use count it lowers."""

        def base(n: fx.Node) -> fx.Node:  # the node owning n's storage (views, waits, all_reduce_ alias their input)
            while n.op == "call_function" and (is_wait(n) or is_view_node(n) or short(n) == "all_reduce_") and \
                    isinstance(n.args[0], fx.Node):  # fmt: skip
                n = n.args[0]
            return n

        self.alloc = [0] * len(self.units)
        self.size: dict[fx.Node, int] = {}
        users: dict[fx.Node, set[int]] = {}
        pinned: set[fx.Node] = set()  # graph outputs: alive to the end
        for u in self.units:
            for n in u.nodes:
                b = base(n)
                for user in n.users:
                    if user.op == "output":
                        pinned.add(b)
                        continue
                    uu = self.unit_of[user]
                    if uu is not self.unit_of[b]:
                        users.setdefault(b, set()).add(uu.index)
                    if uu.kind == "start" and holds_input(user):  # NCCL reads the input until the wait
                        users.setdefault(b, set()).add(uu.partner)
        for u in self.units:
            if u.kind == "input":
                continue
            for n in u.nodes:
                if base(n) is not n or (u.region and n not in users and n not in pinned):
                    continue  # a view or wait (aliases), or a value that never leaves its fused region
                self.size[n] = node_bytes(n)
                self.alloc[u.index] += self.size[n]
        self.uses: dict[fx.Node, int] = {}
        self.frees_at: list[list[fx.Node]] = [[] for _ in self.units]  # unit -> storages it is a user of
        self.dead_at_birth: list[list[fx.Node]] = [[] for _ in self.units]
        for n in self.size:
            if n in pinned:
                continue
            us = users.get(n, set())
            self.uses[n] = len(us)
            for i in us:
                self.frees_at[i].append(n)
            if not us:
                self.dead_at_birth[self.unit_of[n].index].append(n)

    def memory_state(self) -> MemoryState:
        return MemoryState(self)

    def peak_memory(self, order: list[Unit]) -> int:
        state = MemoryState(self)
        for u in order:
            state.run(u)
        return state.peak

    def projected_peak(self, state: MemoryState, candidate: Unit, done: set[int]) -> int:
        """Peak memory if ``candidate`` runs next and then every unit not in ``done`` in the original order."""
        s = state.copy()
        s.run(candidate)
        for u in self.units:
            if u.index not in done and u is not candidate:
                s.run(u)
        return s.peak

    # ------------------------------------------------------------------------------------------------------------------
    # Time

    def timeline(self, order: list[Unit], buckets: list[list[Unit]] = ()) -> Timeline:
        """Simulate ``order`` on a compute engine and a network engine (one collective at a time).

        ``buckets``: groups of starts sent as one collective (:mod:`fusion.comms.bucket`); the first of a group
        to start carries the whole group's cost, and every member ends when the group does.
        """
        lead = {u.index: group for group in buckets for u in group}
        now = network_free = 0.0
        running: dict[int, CollectiveTime] = {}  # start unit index -> its record
        sent: dict[int, float] = {}  # bucket (id of its group) -> when it ends
        done: list[CollectiveTime] = []
        spans: list[tuple[str, float, float]] = []
        for u in order:
            if u.kind == "start":
                group = lead.get(u.index)
                if group is not None and id(group) in sent:
                    began, ended = now, sent[id(group)]
                else:
                    began = max(now, network_free)
                    ms = u.cost.ms if group is None else self.bucket_cost(group)
                    network_free = ended = began + ms
                    if group is not None:
                        sent[id(group)] = ended
                running[u.index] = CollectiveTime(u, self.units[u.partner], began, ended, 0.0)
            elif u.kind == "wait":
                c = running.pop(u.partner)
                c.exposed_ms = max(0.0, c.ended_ms - now)
                now = max(now, c.ended_ms)
                done.append(c)
            elif u.cost.ms > 0:
                for c in running.values():  # what this unit hides: its overlap with each collective in flight
                    overlap = min(now + u.cost.ms, c.ended_ms) - max(now, c.began_ms)
                    if overlap > 0:
                        c.hidden_by.append((u.name, overlap))
                spans.append((u.name, now, now + u.cost.ms))
                now += u.cost.ms
        if running:
            names = [self.units[i].name for i in running]
            raise ScheduleError(f"collectives {names} are never waited on in this order")
        return Timeline(now, sum(c.exposed_ms for c in done), sorted(done, key=lambda c: c.start.index), spans)

    def bucket_cost(self, group: list[Unit]) -> float:
        """One collective moving the bytes of every member: one latency instead of len(group)."""
        size = sum(node_bytes(u.nodes[0].args[0]) for u in group)
        return self.cost_model.collective(group[0].nodes[0], size).ms

    # ------------------------------------------------------------------------------------------------------------------

    @property
    def original(self) -> list[Unit]:
        return list(self.units)

    def by_name(self, name: str) -> Unit:
        return next(u for u in self.units if u.name == name)


class MemoryState:
    """Live bytes while running units one by one; ``peak`` is the most seen (an op's inputs and outputs coexist)."""

    def __init__(self, graph: OverlapGraph) -> None:
        self.g, self.live, self.peak, self.left = graph, 0, 0, dict(graph.uses)

    def copy(self) -> MemoryState:
        other = MemoryState.__new__(MemoryState)
        other.g, other.live, other.peak, other.left = self.g, self.live, self.peak, dict(self.left)
        return other

    def run(self, u: Unit) -> None:
        g = self.g
        self.live += g.alloc[u.index]
        self.peak = max(self.peak, self.live)
        for n in g.frees_at[u.index]:
            self.left[n] -= 1
            if self.left[n] == 0:
                self.live -= g.size[n]
        for n in g.dead_at_birth[u.index]:
            self.live -= g.size[n]


def _topological(unit_nodes: list[tuple[list[fx.Node], object]], preds: list[list[int]]) -> list[int]:
    """Kahn's algorithm, ties broken by position: the original order of units (regions collapsed)."""
    indegree = [len(p) for p in preds]
    succs: list[list[int]] = [[] for _ in preds]
    for k, ps in enumerate(preds):
        for p in ps:
            succs[p].append(k)
    ready = [k for k, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for s in succs[k]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, s)
    if len(order) != len(preds):
        stuck = [unit_nodes[k][0][0].name for k, d in enumerate(indegree) if d > 0][:4]
        raise ScheduleError(
            f"collapsing the regions creates a cycle around {stuck}: a region reaches past a node it depends on. "
            "Fix: pass the region_of that Phase 6's build_fusion_regions returned for this same graph"
        )
    return order


def check_schedule(graph: OverlapGraph, order: list[Unit], budget: int | None = None) -> None:
    """Raise :class:`ScheduleError` naming the first rule ``order`` breaks; return None if it keeps them all."""
    where: dict[int, int] = {}
    for pos, u in enumerate(order):
        if not isinstance(u, Unit) or u.index >= len(graph.units) or graph.units[u.index] is not u:
            raise ScheduleError(f"position {pos}: {u!r} is not a unit of this graph (return graph.units' objects)")
        if u.index in where:
            raise ScheduleError(f"unit {u.name!r} is scheduled twice (positions {where[u.index]} and {pos})")
        where[u.index] = pos
    missing = [u.name for u in graph.units if u.index not in where]
    if missing:
        raise ScheduleError(f"{len(missing)} unit(s) never scheduled, e.g. {missing[:3]}")
    for u in order:
        for p in u.preds:
            if where[p] > where[u.index]:
                pu = graph.units[p]
                if u.kind == "wait":
                    why = "a wait before its collective starts"
                elif pu.kind == "wait":
                    why = f"a wait sunk past its first user ({u.name} reads the result of {pu.name})"
                elif u.kind == "start":
                    why = f"a collective started before its input {pu.name} exists"
                else:
                    why = f"{u.name} runs before its input {pu.name}"
                raise ScheduleError(f"not a topological order: {why}")
    if budget is not None:
        peak = graph.peak_memory(order)
        if peak > budget:
            raise ScheduleError(f"peak memory {peak} B exceeds the budget of {budget} B")


def check_regions(gm: fx.GraphModule | fx.Graph, region_of: dict) -> None:
    """Every region's nodes sit next to each other in the graph: no other node between its first and last."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    nodes = list(graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    for r in {id(r): r for r in region_of.values()}.values():
        where = sorted(position[n] for n in r.nodes)
        if where[-1] - where[0] + 1 != len(where):
            inside = next(nodes[i].name for i in range(where[0], where[-1]) if nodes[i] not in r.nodes)
            raise ScheduleError(f"region {r.nodes[0].name}…{r.nodes[-1].name} is split: {inside} runs inside it")


def apply_order(gm: fx.GraphModule, graph: OverlapGraph, order: list[Unit]) -> fx.GraphModule:
    """Rewrite ``gm``'s node order in place to ``order`` (inputs first, each unit's nodes together); recompile."""
    check_schedule(graph, order)
    fx_graph = gm.graph
    first_inputs = [n for n in fx_graph.nodes if n.op in ("placeholder", "get_attr")]
    prev = first_inputs[-1] if first_inputs else None
    for u in order:
        if u.kind == "input":
            continue
        for n in u.nodes:
            if prev is None:
                next(iter(fx_graph.nodes)).prepend(n)
            else:
                prev.append(n)
            prev = n
    relint(gm)
    return gm
