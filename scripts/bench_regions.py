"""Time our region builder (grouping + byte costing) against Inductor's on the same ~100k-node aten graph.

Run it:  uv run python scripts/bench_regions.py [--nodes 100000] [--min-run-time 2]

The graph: a chain of blocks of fusible aten ops — a broadcast bias add, a scalar mul, relu, a row reduction
broadcast back, a residual sub, a view — with a matmul every few blocks, so the graph has many spans and many
regions. Every node carries ``meta["val"]`` as a *meta* tensor (shape, dtype, strides, no memory), which is all the
costing reads. Ours is timed *including* the costing (total_bytes and cost_ms of every region, the estimate a
scheduler needs; a second line adds the lesson's unfused_bytes, for information); Inductor's
``build_fusion_regions`` only groups. Timings: torch.utils.benchmark, median of several runs, one
process, after a warm-up (Inductor's first call imports its lowering table). The last line is the ratio
ours / Inductor's: below 1.0 means ours is faster.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.fx as fx

from fusion.regions import BANDWIDTH_PROFILES_GBPS, build_fusion_regions, inductor_fusion_regions, unique_regions

aten = torch.ops.aten


def build_graph(n_nodes: int, d: int = 256, blocks_per_matmul: int = 4) -> fx.GraphModule:
    """An aten graph of about ``n_nodes`` nodes: blocks of fusible ops, a matmul every ``blocks_per_matmul`` blocks."""
    g = fx.Graph()
    square = torch.empty(d, d, device="meta")  # (d, d)
    row = torch.empty(d, 1, device="meta")  # (d, 1): a reduction's result, broadcast back
    vec = torch.empty(d, device="meta")  # (d,): a broadcast bias

    def op(target, *args, val=square):
        node = g.call_function(target, args)
        node.meta["val"] = val
        return node

    x = g.placeholder("x")
    x.meta["val"] = square
    w = g.placeholder("w")
    w.meta["val"] = square
    bias = g.placeholder("bias")
    bias.meta["val"] = vec
    h = x
    block = 0
    count = 4  # three placeholders + output
    while count < n_nodes:
        a = op(aten.add.Tensor, h, bias)  # (d, d) + (d,)
        m = op(aten.mul.Tensor, a, 0.5)
        r = op(aten.relu.default, m)
        s = op(aten.sum.dim_IntList, r, [1], True, val=row)  # (d, 1)
        n = op(aten.sub.Tensor, r, s)  # broadcast back
        res = op(aten.add.Tensor, n, h)  # residual
        h = op(aten.view.default, res, [d, d])
        count += 7
        block += 1
        if block % blocks_per_matmul == 0:
            h = op(aten.mm.default, h, w)
            count += 1
    g.output(h)
    return fx.GraphModule(torch.nn.Module(), g)


def ours_with_costing(gm: fx.GraphModule, bandwidth: float = BANDWIDTH_PROFILES_GBPS["H100"]) -> float:
    """Group, then cost every region: its external bytes (total_bytes) / bandwidth."""
    total = 0.0
    for region in unique_regions(build_fusion_regions(gm)):
        total += region.cost_ms(bandwidth)
    return total


def ours_with_unfused_too(gm: fx.GraphModule, bandwidth: float = BANDWIDTH_PROFILES_GBPS["H100"]) -> float:
    """As above, plus the lesson's extra: the unfused bytes of every region (every member's own inputs/outputs)."""
    total = 0.0
    for region in unique_regions(build_fusion_regions(gm)):
        total += region.cost_ms(bandwidth) + region.unfused_cost_ms(bandwidth)
    return total


def median_seconds(fn, gm: fx.GraphModule, min_run_time: float) -> float:
    from torch.utils.benchmark import Timer  # imported after fusion, which silences its CUDA_HOME warning

    return Timer("fn(gm)", globals={"fn": fn, "gm": gm}).blocked_autorange(min_run_time=min_run_time).median


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000, help="graph size (default 100000)")
    parser.add_argument("--min-run-time", type=float, default=2.0, help="seconds per timing (default 2)")
    args = parser.parse_args(argv)

    theirs = inductor_fusion_regions()
    if theirs is None:
        print(f"torch {torch.__version__} has no torch._inductor.fx_passes.fusion_regions: nothing to compare")
        return 1

    start = time.perf_counter()
    gm = build_graph(args.nodes)
    n = len(gm.graph.nodes)
    print(f"torch {torch.__version__}; graph: {n} nodes, built in {time.perf_counter() - start:.1f} s")

    theirs(build_graph(200))  # warm-up: the first call imports Inductor's lowerings
    ours_regions = unique_regions(build_fusion_regions(gm))
    their_regions = {id(s): s for s in theirs(gm).values()}
    same = {frozenset(r.nodes) for r in ours_regions} == {frozenset(s) for s in their_regions.values()}
    print(f"regions: ours {len(ours_regions)}, Inductor {len(their_regions)}; identical node sets: {same}")

    t_extra = median_seconds(ours_with_unfused_too, gm, args.min_run_time)
    t_ours = median_seconds(ours_with_costing, gm, args.min_run_time)
    t_theirs = median_seconds(theirs, gm, args.min_run_time)
    print(f"ours, grouping + cost_ms of every region:   {t_ours:.3f} s  ({t_ours / n * 1e6:.2f} µs/node)")
    print(f"ours, the same + unfused_bytes (for info):  {t_extra:.3f} s  ({t_extra / n * 1e6:.2f} µs/node)")
    print(f"Inductor's build_fusion_regions (grouping): {t_theirs:.3f} s  ({t_theirs / n * 1e6:.2f} µs/node)")
    print(f"ratio ours / Inductor: {t_ours / t_theirs:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
