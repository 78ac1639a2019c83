"""The cost model of Phase 10: how long each unit of a distributed graph takes, with the formula that says so.

* Matmul-like compute (``mm``, ``addmm``, ``bmm``, ``convolution``): the roofline of Phase 4,
  ``max(FLOPs / peak FLOP/s, bytes / bandwidth)``, FLOPs from ``torch.utils.flop_counter``.
* A fusion region (Phase 6): memory-bound, ``region bytes / bandwidth``.
* Any other op: it reads its inputs and writes its output, ``bytes / bandwidth``; views and waits cost nothing.
* A collective, after NCCL's ``tuning.cc`` and its ``nccl-tests`` convention: ``latency + size · f / bus bandwidth``
  with ``size`` the full buffer (all_reduce's tensor, all_gather's output, reduce_scatter's input) and the ring's
  traffic factor ``f`` = 2(n−1)/n for all_reduce (a reduce-scatter then an all-gather) and (n−1)/n for
  all_gather / reduce_scatter (each rank sends and receives n−1 of n pieces).

Defaults are stated, not measured: an H100 SXM (989 TFLOP/s dense bf16, 3350 GB/s HBM3) and NVLink 4 within one
node (450 GB/s per direction of which NCCL reaches ~360 GB/s of bus bandwidth, ~10 µs ring latency at small sizes).
``scripts/gpu_overlap.py`` measures them; pass the measured values to :class:`CostModel`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.comms.capture import is_collective, is_wait, short


@dataclass(frozen=True)
class Cost:
    ms: float
    formula: str  # e.g. "2·M·N·K / peak = 2·64·64·64 / 989e12 FLOP/s"


def tensor_bytes(val: object) -> int:
    """Bytes of a value: a tensor's numel × element size (a tuple or list summed), anything else 0."""
    if isinstance(val, torch.Tensor):
        return val.numel() * val.element_size()
    if isinstance(val, (tuple, list)):
        return sum(tensor_bytes(v) for v in val)
    return 0


def node_bytes(node: fx.Node) -> int:
    return tensor_bytes(node.meta.get("val"))


@dataclass(frozen=True)
class CostModel:
    world_size: int = 2
    matmul_tflops: float = 989.0  # peak FLOP/s of the compute engine (Phase 4 measures it)
    bandwidth_gbps: float = 3350.0  # memory bandwidth (Phase 6's profiles)
    bus_gbps: float = 360.0  # NCCL bus bandwidth (nccl-tests' "busbw")
    latency_us: float = 10.0  # per collective
    source: str = "stated defaults: H100 SXM, NVLink 4"
    per_op: tuple[tuple[str, float, float], ...] = ()  # (op, latency µs, bus GB/s) fitted per collective, if measured
    # Size bands fitted per collective (fusion/comms/fit.py): (op, first bytes, last bytes, latency µs, bus GB/s or
    # 0 for a flat band), in size order. NCCL switches protocol (LL, LL128, Simple) and channel count with the size:
    # one line per band follows the switches; a size between two bands takes the nearer one (in log size).
    bands: tuple[tuple[str, int, int, float, float], ...] = ()

    def bus_factor(self, name: str) -> float:
        """nccl-tests' busbw = algbw × this: 2(n−1)/n for all_reduce, (n−1)/n for all_gather / reduce_scatter."""
        n = self.world_size
        return 2 * (n - 1) / n if name == "all_reduce" else (n - 1) / n

    def collective(self, node: fx.Node, size: int | None = None) -> Cost:
        """latency + size · factor / bus bandwidth; ``size`` overrides the node's own bytes (for buckets)."""
        name = "all_reduce" if short(node) == "all_reduce_" else short(node)
        if size is None:
            full = node if name == "all_gather_into_tensor" else node.args[0]  # the full buffer
            size = node_bytes(full) if isinstance(full, fx.Node) else 0
        return self.collective_of(name, size)

    def collective_of(self, name: str, size: int) -> Cost:
        """``name``: all_reduce, all_gather_into_tensor or reduce_scatter_tensor; ``size``: the full buffer's bytes."""
        n = self.world_size
        if name == "all_reduce":
            factor, fstr = 2 * (n - 1) / n, f"2·({n}−1)/{n}"
        else:
            factor, fstr = (n - 1) / n, f"({n}−1)/{n}"
        mine = [b for b in self.bands if b[0] == name]
        if mine:
            # the band holding size, else the nearer one: boundaries at the geometric mean of two bands' ends
            _, lo, hi, latency, bus = next((b for b, nxt in zip(mine, mine[1:], strict=False)
                                            if size * size <= b[2] * nxt[1]), mine[-1])  # fmt: skip
            if not bus:
                return Cost(latency / 1e3, f"{latency:.3g} µs (flat band {lo / 2**20:g}–{hi / 2**20:g} MiB)")
            ms = latency / 1e3 + size * factor / (bus * 1e9) * 1e3
            return Cost(ms, f"{latency:.3g} µs + {size} B · {fstr} / {bus:.4g} GB/s (band {lo / 2**20:g}–"
                        f"{hi / 2**20:g} MiB)")  # fmt: skip
        latency, bus = next(((lat, bw) for op, lat, bw in self.per_op if op == name), (self.latency_us, self.bus_gbps))
        ms = latency / 1e3 + size * factor / (bus * 1e9) * 1e3
        return Cost(ms, f"{latency:.3g} µs + {size} B · {fstr} / {bus:.4g} GB/s")

    def memory(self, nbytes: int, what: str = "bytes") -> Cost:
        return Cost(nbytes / (self.bandwidth_gbps * 1e9) * 1e3, f"{what} {nbytes} B / {self.bandwidth_gbps:g} GB/s")

    def compute(self, node: fx.Node) -> Cost | None:
        """The roofline of a matmul-like node, or None for an op without a FLOP formula."""
        flops = node_flops(node)
        if flops is None:
            return None
        moved = sum(node_bytes(i) for i in node.all_input_nodes) + node_bytes(node)
        compute_ms = flops / (self.matmul_tflops * 1e12) * 1e3
        memory = self.memory(moved)
        if memory.ms > compute_ms:
            return Cost(memory.ms, f"memory-bound: {memory.formula} (> {flops} FLOP / {self.matmul_tflops:g} TFLOP/s)")
        return Cost(compute_ms, f"{flops} FLOP / {self.matmul_tflops:g} TFLOP/s")

    def node(self, node: fx.Node) -> Cost:
        """The cost of one node outside any region."""
        if node.op != "call_function" or is_wait(node) or is_view_node(node):
            return Cost(0.0, "free (no kernel)")
        if is_collective(node):
            return self.collective(node)
        compute = self.compute(node)
        if compute is not None:
            return compute
        moved = sum(node_bytes(i) for i in node.all_input_nodes) + node_bytes(node)
        return self.memory(moved, f"{short(node)}:")

    def region(self, region: object) -> Cost:
        """A Phase 6 fusion region: one kernel reading its inputs and writing its outputs once."""
        return self.memory(int(region.total_bytes), f"region {len(region.nodes)} ops:")

    def rows(self) -> list[tuple[str, str]]:
        """The figures the model uses, each with where it comes from."""
        return [
            ("matmul peak", f"{self.matmul_tflops:g} TFLOP/s"),
            ("memory bandwidth", f"{self.bandwidth_gbps:g} GB/s"),
            ("bus bandwidth", f"{self.bus_gbps:g} GB/s"),
            ("collective latency", f"{self.latency_us:g} µs"),
            ("world size", str(self.world_size)),
            ("source", self.source),
        ]


def node_flops(node: fx.Node) -> int | None:
    """FLOPs of a node with a formula in ``torch.utils.flop_counter`` (mm, addmm, bmm, convolution, …), else None."""
    from torch.utils._pytree import tree_map
    from torch.utils.flop_counter import flop_registry

    target = node.target
    key = getattr(target, "overloadpacket", None)
    if key not in flop_registry:
        return None

    def val(a: object) -> object:
        return a.meta.get("val") if isinstance(a, fx.Node) else a

    args, kwargs, out = tree_map(val, node.args), tree_map(val, node.kwargs), node.meta.get("val")
    if out is None:
        return None
    try:
        return int(flop_registry[key](*args, **kwargs, out_val=out))
    except Exception:  # a formula that does not take these arguments: no FLOP count, costed by bytes instead
        return None
