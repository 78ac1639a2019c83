"""Phase 10 on GPUs: step time and exposed communication, unscheduled vs our schedule vs Inductor's (issue 22).

    PYTHONPATH=. python3 scripts/gpu_overlap.py                  # all GPUs of the host, NCCL (world size = GPU count)
    PYTHONPATH=. python3 scripts/gpu_overlap.py --single         # one GPU: calibrate the cost model (matmul, copy)
    uv run python scripts/gpu_overlap.py --dry-run               # here: gloo on CPU, 2 processes, toy sizes

What it measures, per rank, written as one JSON file to ``$OUT`` (or ``scripts/results/``):

* ``calibration``: matmul peak (TFLOP/s, an n³ bf16 matmul) and copy bandwidth (GB/s) of this GPU: the compute
  figures of :class:`fusion.comms.cost.CostModel`.
* ``collectives``: all_reduce, all_gather and reduce_scatter over sizes from 1 MiB up: measured time, the cost
  model's prediction (with the stated default bus bandwidth and latency), and the bus bandwidth measured
  (nccl-tests' busbw = size · factor / time; factor 2(n−1)/n or (n−1)/n). A fit of latency and bus bandwidth follows.
* ``steps``: the data-parallel and FSDP-style steps of Phase 10 (bf16), each run as its captured aten graph
  (unscheduled, and reordered by our scheduler) and through Inductor (``torch.compile`` of the same graph, with and
  without ``aten_distributed_optimizations.enable_overlap_scheduling`` where this torch has it): median step time,
  and from torch.profiler the NCCL kernels' time and the part of it no compute kernel overlaps (exposed).

The host requires NVLink multicast off: this script sets NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1
before torch starts. Every rank has a deadline; a failing variant records its error and the others go on.
"""

from __future__ import annotations

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink SHARP / multicast off (the GPU host requires it)
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn, device: torch.device, iters: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def calibrate(device: torch.device, dry: bool) -> dict:
    """Matmul peak and copy bandwidth: the compute side of the cost model."""
    n = 256 if dry else 8192
    dtype = torch.float32 if dry else torch.bfloat16
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    mm = median_ms(lambda: a @ b, device, 3 if dry else 20)
    src = torch.empty((16 if dry else 1024) * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    copy = median_ms(lambda: dst.copy_(src), device, 3 if dry else 20)
    return {"matmul_n": n, "matmul_dtype": str(dtype), "matmul_tflops": 2 * n**3 / (mm * 1e-3) / 1e12,
            "copy_gbps": 2 * src.nbytes / (copy * 1e-3) / 1e9}  # fmt: skip


def bench_collectives(device: torch.device, world: int, dry: bool, iters: int) -> list[dict]:
    from fusion.comms.cost import CostModel

    model = CostModel(world_size=world)
    sizes = [2**20, 2**22] if dry else [2**p for p in range(20, 31, 2)]  # 1 MiB … 1 GiB (the full buffer)
    rows = []
    for name in COLLECTIVES:
        for size in sizes:
            numel = size // 2  # bf16 (fp32 on gloo: then size is 2× the label; the row says which)
            dtype = torch.float32 if dry else torch.bfloat16
            full = torch.ones(numel, device=device, dtype=dtype)
            piece = torch.ones(numel // world, device=device, dtype=dtype)
            if name == "all_reduce":
                fn = lambda full=full: dist.all_reduce(full)  # noqa: E731
            elif name == "all_gather_into_tensor":
                fn = lambda full=full, piece=piece: dist.all_gather_into_tensor(full, piece)  # noqa: E731
            else:
                fn = lambda full=full, piece=piece: dist.reduce_scatter_tensor(piece, full)  # noqa: E731
            ms = median_ms(fn, device, iters)
            nbytes = full.numel() * full.element_size()
            rows.append({"op": name, "bytes": nbytes, "measured_ms": ms,
                         "predicted_ms": model.collective_of(name, nbytes).ms,
                         "busbw_gbps": nbytes * model.bus_factor(name) / (ms * 1e-3) / 1e9})  # fmt: skip
    return rows


def measured_cost_model(world: int, fit: dict, calibration: dict):
    """The cost model with this host's figures: the all-reduce fit (latency, bus bandwidth), the matmul peak and copy
    bandwidth just measured. Falls back to the stated defaults where a figure is missing."""
    from fusion.comms.cost import CostModel

    ar, default = fit.get("all_reduce") or {}, CostModel(world_size=world)
    return CostModel(
        world_size=world,
        matmul_tflops=calibration.get("matmul_tflops") or default.matmul_tflops,
        bandwidth_gbps=calibration.get("copy_gbps") or default.bandwidth_gbps,
        bus_gbps=ar.get("busbw_gbps") or default.bus_gbps,
        latency_us=max(ar.get("latency_us") or 0.0, 0.0) or default.latency_us,
        source="measured by scripts/gpu_overlap.py on this host (rank 0's all-reduce fit and calibration)",
    )


def fit_latency_bandwidth(rows: list[dict], world: int) -> dict:
    """Least squares of time = latency + bytes · factor / busbw, per op: the measured cost-model figures."""
    from fusion.comms.cost import CostModel

    model, out = CostModel(world_size=world), {}
    for name in COLLECTIVES:
        pts = [(r["bytes"] * model.bus_factor(name), r["measured_ms"] * 1e-3) for r in rows if r["op"] == name]
        if len(pts) < 2:
            continue
        mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
        slope = sum((x - mx) * (y - my) for x, y in pts) / max(sum((x - mx) ** 2 for x, _ in pts), 1e-30)
        out[name] = {"latency_us": (my - slope * mx) * 1e6, "busbw_gbps": 1 / slope / 1e9 if slope > 0 else None}
    return out


def comm_exposure(fn, device: torch.device) -> dict:
    """torch.profiler over one call: NCCL kernels' total time and the part no compute kernel overlaps."""
    if device.type != "cuda":
        return {"skipped": "exposure is measured from CUDA kernels (NCCL vs compute streams); none on CPU"}
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync(device)
    comm, compute = [], []
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        span = (e.time_range.start, e.time_range.end)
        (comm if "nccl" in e.name.lower() else compute).append(span)
    compute.sort()
    merged: list[list[float]] = []
    for s, t in compute:  # the union of compute intervals
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], t)
        else:
            merged.append([s, t])
    total = exposed = 0.0
    for s, t in comm:
        covered = sum(max(0.0, min(t, b) - max(s, a)) for a, b in merged)
        total += t - s
        exposed += (t - s) - covered
    return {"comm_ms": total / 1e3, "exposed_ms": exposed / 1e3, "nccl_kernels": len(comm)}


def inductor_variant(gm, overlap: bool):
    """torch.compile of the captured graph; with Inductor's overlap scheduling on or off. (fn, note)."""
    from torch._inductor import config

    opts = getattr(config, "aten_distributed_optimizations", None)
    if overlap and (opts is None or not hasattr(opts, "enable_overlap_scheduling")):
        return None, "this torch has no aten_distributed_optimizations.enable_overlap_scheduling"
    patch = {"aten_distributed_optimizations.enable_overlap_scheduling": overlap} if opts is not None else {}
    compiled = torch.compile(gm, backend="inductor")

    def run(*args):
        with config.patch(patch):
            return compiled(*args)

    return run, ""


def fusion_variant(gm, overlap: bool):
    """backend="fusion" of the captured graph: compute in generated kernels and library calls, as Inductor's is;
    with ``overlap`` Phase 10's scheduler runs as the backend's pass. (fn, note)."""
    import fusion.backend  # noqa: F401  (registers "fusion")

    return torch.compile(gm, backend="fusion", options={"overlap": overlap}), ""


def bench_steps(args, rank: int, world: int, device: torch.device) -> list[dict]:
    from fusion.comms.capture import capture_step, step_inputs
    from fusion.comms.cost import CostModel
    from fusion.comms.units import OverlapGraph, apply_order, check_schedule
    from fusion.overlap import memory_budget, schedule_overlap
    from fusion.regions import build_fusion_regions

    dtype = torch.float32 if args.dry_run else torch.bfloat16
    rows = []
    for kind in args.steps.split(","):
        shape = dict(layers=args.layers, dim=args.dim, batch=args.batch, world_size=world)
        plain = capture_step(kind, **shape, dtype=dtype, device=str(device))
        ours = capture_step(kind, **shape, dtype=dtype, device=str(device))
        model = getattr(args, "cost_model", None) or CostModel(world_size=world)
        graph = OverlapGraph(ours, model, build_fusion_regions(ours))
        order = schedule_overlap(graph, memory_budget(graph))
        check_schedule(graph, order, memory_budget(graph))
        apply_order(ours, graph, order)
        inputs = step_inputs(kind, rank=rank, dtype=dtype, device=device, **shape)
        predicted = {"unscheduled": graph.timeline(graph.original).__dict__, "ours": graph.timeline(order).__dict__}
        predicted = {k: {"step_ms": v["step_ms"], "exposed_ms": v["exposed_ms"]} for k, v in predicted.items()}
        variants = {"unscheduled": (plain, ""), "ours": (ours, "")}
        if args.fusion:  # the same two, compiled: the comparison with Inductor's compiled steps is on equal terms
            variants["fusion"] = fusion_variant(capture_step(kind, **shape, dtype=dtype, device=str(device)), False)
            variants["fusion+overlap"] = fusion_variant(
                capture_step(kind, **shape, dtype=dtype, device=str(device)), True
            )
        if args.inductor:
            variants["inductor"] = inductor_variant(capture_step(kind, **shape, dtype=dtype, device=str(device)), False)
            variants["inductor_overlap"] = inductor_variant(
                capture_step(kind, **shape, dtype=dtype, device=str(device)), True
            )
        else:
            variants["inductor"] = (None, "left out (--no-inductor, or --dry-run without --inductor)")
        ref = plain(*inputs)
        for name, (fn, note) in variants.items():
            row = {"step": kind, "variant": name, **shape, "dtype": str(dtype), "predicted": predicted.get(name)}
            if fn is None:
                rows.append({**row, "skipped": note})
                continue
            try:
                out = fn(*inputs)
                row["max_abs_diff_vs_unscheduled"] = max(
                    float((a - b).abs().max()) for a, b in zip(out, ref, strict=True)
                )
                row["step_ms"] = median_ms(lambda f=fn, x=inputs: f(*x), device, args.iters)
                row.update(comm_exposure(lambda f=fn, x=inputs: f(*x), device))
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:500]
                traceback.print_exc()
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
    return rows


def worker(rank: int, args, store: str) -> None:
    world = args.world
    if args.dry_run:
        backend, device = "gloo", torch.device("cpu")
    else:
        backend, device = "nccl", torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))  # fmt: skip
    result = {"rank": rank, "world_size": world, "backend": backend, "torch": torch.__version__,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "date": datetime.date.today().isoformat(),
              "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")}}  # fmt: skip
    try:
        result["calibration"] = calibrate(device, args.dry_run)
        result["collectives"] = bench_collectives(device, world, args.dry_run, 3 if args.dry_run else args.iters)
        result["fit"] = fit_latency_bandwidth(result["collectives"], world)
        shared = [result["fit"], result["calibration"]]  # rank 0's: every rank must schedule the same order
        dist.broadcast_object_list(shared, src=0)
        args.cost_model = measured_cost_model(world, *shared)
        result["cost_model"] = dataclasses.asdict(args.cost_model)
        result["steps"] = bench_steps(args, rank, world, device)
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        Path(args.out, f"rank{rank}.json").write_text(json.dumps(result, indent=1, default=str))
        dist.destroy_process_group()


def single(args) -> dict:
    device = torch.device("cpu" if args.dry_run else "cuda")
    return {"mode": "single", "torch": torch.__version__, "date": datetime.date.today().isoformat(),
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "calibration": calibrate(device, args.dry_run)}  # fmt: skip


def device_tag(dry: bool) -> str:
    """'h200', 'h100', … for file names (as scripts/results/ names its files); 'cpu' for a dry run."""
    import re

    if dry or not torch.cuda.is_available():
        return "cpu"
    found = re.search(r"\b([A-Z]\d{2,3})\b", torch.cuda.get_device_name(0))
    return found.group(1).lower() if found else "gpu"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="gloo on CPU, 2 processes, toy sizes (checks the steps)")
    p.add_argument("--single", action="store_true", help="one GPU: calibrate matmul peak and copy bandwidth only")
    p.add_argument("--world", type=int, default=0, help="ranks (default: every GPU; 2 with --dry-run)")
    p.add_argument("--steps", default="dp,fsdp", help="comma-separated: dp, fsdp, tp")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1024, help="tokens per rank (smaller: communication matters more)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for any collective (NCCL/gloo timeout)")
    p.add_argument("--inductor", action=argparse.BooleanOptionalAction, default=None,
                   help="also torch.compile with Inductor (default: on GPUs yes, dry run no)")  # fmt: skip
    p.add_argument("--fusion", action=argparse.BooleanOptionalAction, default=True,
                   help="also torch.compile(backend='fusion'), without and with options={'overlap': True}")  # fmt: skip
    p.add_argument("--out", default=os.environ.get("OUT"), help="JSON folder (default scripts/results; a dry run: tmp)")
    args = p.parse_args(argv)
    args.out = args.out or (
        tempfile.mkdtemp(prefix="gpu_overlap_") if args.dry_run else str(ROOT / "scripts" / "results")
    )
    if args.dry_run:
        args.layers, args.dim, args.batch, args.iters = min(args.layers, 2), min(args.dim, 64), min(args.batch, 32), 2
    if args.inductor is None:
        args.inductor = not args.dry_run
    Path(args.out).mkdir(parents=True, exist_ok=True)
    stamp = f"{device_tag(args.dry_run)}-{datetime.date.today().isoformat()}"
    if args.single:
        result = single(args)
        path = Path(args.out, f"{stamp}-overlap-single.json")
        path.write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1), f"\nwrote {path}")
        return 0
    args.world = args.world or (2 if args.dry_run else torch.cuda.device_count())
    if args.world < 2:
        print(f"world size {args.world}: the overlap measurement needs >= 2 ranks (use --single on one GPU)")
        return 2
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:  # each rank writes rank<r>.json into args.out as soon as it is done
        mp.start_processes(worker, args=(args, f"{tmp}/store"), nprocs=args.world, start_method="spawn")
    ranks = [json.loads(Path(args.out, f"rank{r}.json").read_text()) for r in range(args.world)]
    path = Path(args.out, f"{stamp}-overlap-x{args.world}.json")
    kept = {k: v for k, v in vars(args).items() if k not in ("out", "cost_model")}
    path.write_text(json.dumps({"args": kept, "ranks": ranks}, indent=1, default=str))
    for r in range(args.world):
        Path(args.out, f"rank{r}.json").unlink()
    errors = [r["error"] for r in ranks if "error" in r]
    print(f"wrote {path}" + (f"; errors: {errors}" if errors else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
