"""Beyond one host, on paper: the exposed communication of Phase 10's steps at 8 to 1,024 GPUs, *simulated*.

Nothing here is measured at those sizes. The figures are the fitted ones of one host (``fusion/comms/fit.py``:
latency and bus bandwidth per collective, measured at 2 and 4 GPUs) and the step's compute as the cost model
estimates it on one GPU (weak scaling: every rank keeps its own batch). What grows with the GPU count is stated,
after NCCL's own tuning model (``src/graph/tuning.cc``), for its "Simple" protocol (the one large messages use):

* **Ring** (all_reduce, all_gather, reduce_scatter): ``steps`` hops of one chunk each, 2(n−1) for all_reduce and
  n−1 for the other two. Latency = the host's fitted constant + each hop's latency: :data:`NVLINK_HOP_US` inside a
  node, :data:`NET_HOP_US` between nodes (one hop per node boundary, twice for all_reduce). Bandwidth: every byte
  crosses the slowest link of the ring, so the bus bandwidth is the fitted NVLink figure inside one node and
  ``min(fitted, NET_GBPS)`` across nodes.
* **Tree** (all_reduce only, NCCL's double binary tree): a reduce up the tree then a broadcast down, so latency
  grows with 2·(GPUs per node − 1) NVLink hops plus 2·log2(nodes) network hops, not with n; the same bus
  bandwidth as the ring (both trees send half the data each, in both directions).
* :data:`GPUS_PER_NODE` GPUs per node (an 8-GPU HGX H100), one 400 Gb/s NIC per GPU (:data:`NET_GBPS`).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

from fusion.comms.cost import Cost, CostModel

GPUS_PER_NODE = 8
NET_GBPS = 50.0  # one 400 Gb/s NIC per GPU (InfiniBand NDR, as in a DGX H100): bus bandwidth across nodes
NVLINK_HOP_US = 3.4  # NCCL tuning.cc, hwLat[NVLINK][Ring][Simple]
NET_HOP_US = 14.0  # NCCL tuning.cc, hwLat[NET][Ring][Simple]
TREE_NVLINK_HOP_US = 4.0  # hwLat[NVLINK][Tree][Simple]
TREE_NET_HOP_US = 14.0  # hwLat[NET][Tree][Simple]
SIZES = (8, 16, 64, 256, 1024)


def ring_hops(op: str, n: int) -> tuple[int, int]:
    """(NVLink hops, network hops) of one collective on a ring of ``n`` GPUs, :data:`GPUS_PER_NODE` per node."""
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    nodes = max(1, math.ceil(n / GPUS_PER_NODE))
    net = 0 if nodes == 1 else (2 * nodes if op == "all_reduce" else nodes - 1)
    return steps - net, net


def tree_hops(n: int) -> tuple[int, int]:
    """(NVLink hops, network hops) of a tree all_reduce: up and down, a chain inside each node, a tree across."""
    nodes = max(1, math.ceil(n / GPUS_PER_NODE))
    return 2 * (min(n, GPUS_PER_NODE) - 1), 2 * math.ceil(math.log2(nodes)) if nodes > 1 else 0


@dataclass(frozen=True)
class ScaledCostModel(CostModel):
    """A cost model whose collectives follow a stated algorithm at any GPU count (``world_size``).

    ``constant_us``: per op, the part of the fitted latency that is not hops (launch, set-up): the fitted latency
    minus its hops at the measured size. ``fitted_gbps``: per op, the fitted bus bandwidth (NVLink)."""

    algorithm: str = "ring"  # of all_reduce; all_gather and reduce_scatter always ring (NCCL has no tree for them)
    constant_us: tuple[tuple[str, float], ...] = ()
    fitted_gbps: tuple[tuple[str, float], ...] = ()

    def collective_of(self, name: str, size: int):  # noqa: D102 (CostModel's, with the algorithm's latency)

        n = self.world_size
        tree = self.algorithm == "tree" and name == "all_reduce"
        nv, net = tree_hops(n) if tree else ring_hops(name, n)
        hop_nv, hop_net = (TREE_NVLINK_HOP_US, TREE_NET_HOP_US) if tree else (NVLINK_HOP_US, NET_HOP_US)
        latency = dict(self.constant_us).get(name, self.latency_us) + nv * hop_nv + net * hop_net
        bus = dict(self.fitted_gbps).get(name, self.bus_gbps)
        if n > GPUS_PER_NODE:
            bus = min(bus, NET_GBPS)
        factor = 2 * (n - 1) / n if name == "all_reduce" else (n - 1) / n
        ms = latency / 1e3 + size * factor / (bus * 1e9) * 1e3
        return Cost(ms, f"{'tree' if tree else 'ring'}: {latency:.3g} µs + {size} B · {factor:.3f} / {bus:.4g} GB/s")


def scaled_model(fitted: dict, measured_world: int, n: int, algorithm: str, base: CostModel) -> ScaledCostModel:
    """``fitted``: per op ``{"latency_us", "busbw_gbps"}`` measured on ``measured_world`` GPUs of one node."""
    constant, bandwidth = [], []
    for op, f in fitted.items():
        if not f.get("busbw_gbps"):  # nothing fitted, or a flat band on top: the stated figures
            continue
        nv, _ = ring_hops(op, measured_world)
        constant.append((op, max(0.0, f["latency_us"] - nv * NVLINK_HOP_US)))
        bandwidth.append((op, f["busbw_gbps"]))
    return ScaledCostModel(world_size=n, matmul_tflops=base.matmul_tflops, bandwidth_gbps=base.bandwidth_gbps,
                           bus_gbps=base.bus_gbps, latency_us=base.latency_us, algorithm=algorithm,
                           constant_us=tuple(constant), fitted_gbps=tuple(bandwidth),
                           source=f"simulated: {algorithm}, {n} GPUs")  # fmt: skip


@contextmanager
def fake_world(n: int):
    """The fake process group with ``n`` ranks for the duration (shapes of a sharded step depend on it); the
    previous fake group's size is restored after. Refuses to replace a real process group."""
    import torch.distributed as dist

    from fusion.comms.capture import ensure_fake_group

    previous = None
    if dist.is_initialized():
        if dist.get_backend() != "fake":
            raise RuntimeError(
                f"a real process group ({dist.get_backend()}) is running: simulate other GPU counts in a process "
                "of its own (the fake group would replace it)"
            )
        previous = dist.get_world_size()
        dist.destroy_process_group()
    ensure_fake_group(n)
    try:
        yield
    finally:
        dist.destroy_process_group()
        if previous is not None:
            ensure_fake_group(previous)


def simulate(kinds, sizes, fitted: dict, measured_world: int, base: CostModel, step: dict, schedule, build,
             budget) -> list[dict]:  # fmt: skip
    """Per step kind, GPU count and all_reduce algorithm: the step's communication and its exposed part, unscheduled
    and in ``schedule``'s order (``build(gm, cost) -> (graph, _)``, ``budget(graph) -> bytes``: the lesson's)."""
    from fusion.comms.capture import capture_step

    out = []
    for n in sizes:
        with fake_world(n):
            graphs = {kind: capture_step(kind, **step, world_size=n) for kind in kinds}
        for algorithm in ("ring", "tree"):
            for kind, gm in graphs.items():
                if algorithm == "tree" and kind != "dp":
                    continue  # FSDP's all_gather / reduce_scatter: ring only
                graph, _ = build(gm, scaled_model(fitted, measured_world, n, algorithm, base))
                order = schedule(graph, budget(graph))
                before, after = graph.timeline(graph.original), graph.timeline(order)
                comm = sum(u.cost.ms for u in graph.units if u.kind == "start")
                out.append({"gpus": n, "algorithm": algorithm, "step": kind, "comm_ms": comm,
                            "exposed_before_ms": before.exposed_ms, "exposed_after_ms": after.exposed_ms,
                            "step_before_ms": before.step_ms, "step_after_ms": after.step_ms})  # fmt: skip
    return out
