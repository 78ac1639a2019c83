"""Phase 10 on GPUs (issues 22, 40): both steps at 2 and 4 GPUs, compiled with and without the overlap pass, beside
Inductor with and without its overlap scheduling; the collective cost model per size; a profiler trace per rank.

    PYTHONPATH=. python3 scripts/gpu_overlap.py --worlds 2,4          # NCCL; one world size after the other
    PYTHONPATH=. python3 scripts/gpu_overlap.py --single              # one GPU: calibrate matmul and copy only
    uv run python scripts/gpu_overlap.py --dry-run                     # here: gloo on CPU, 2 processes, toy sizes

Per world size ``w`` (``w`` processes, ``torch.multiprocessing`` spawn, GPUs 0..w-1), every rank:

* ``calibration``: matmul peak (an n³ bf16 matmul) and copy bandwidth: the compute figures of the cost model.
* ``collectives``: all_reduce, all_gather and reduce_scatter of 1 MiB to 1 GiB (the full buffer), back to back with
  CUDA events (``measured_ms``: 3 rounds after a barrier, the least kept) and one call at a time, host-synced
  (``synced_ms``). The file keeps the least over ranks (the last rank to launch waits for no one) and its fit in
  size bands (``fusion/comms/fit.py``); that fit is every rank's cost model, the backend's pass included.
* ``steps``: Phase 10's data-parallel and FSDP-style steps (bf16 aten graphs) compiled by ``backend="fusion"``
  without and with ``options={"overlap": True}`` and by Inductor, as shipped, with its overlap scheduling, and
  (where a torch overlaps by default) with every overlap switch off. Per variant: compile seconds, median step ms,
  peak memory, and from one profiled call (after a barrier: a late rank made a 0.5 ms all_reduce look 1.1 ms) the
  NCCL time, the part no compute (kernel, or copy or memset on a compute stream) overlaps, what overlapped each
  collective, the pass's notes. Every rank's Chrome traces (Perfetto) go into ONE ``-x<w>-traces.tar.gz`` per
  world size: the device tool returns a few files per call, not one per trace.

A time budget (``--budget-s``, default 500 s) is shared out between the world sizes; rank 0 decides before each
variant whether it still fits and every rank follows. Rows are appended to ``*-overlap-steps.jsonl`` as they are
measured, so a run cut short keeps what it did. NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, set before torch starts and inherited by every rank).
"""

from __future__ import annotations

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink SHARP / multicast off (the GPU host requires it)
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
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
VARIANTS = ("fusion", "fusion+overlap", "inductor_overlap", "inductor", "inductor_no_overlap")  # most wanted first


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


def meet(device: torch.device) -> None:
    """Every rank here, nothing queued: the next call starts together on every rank."""
    sync(device)
    dist.barrier()
    sync(device)


def back_to_back_ms(fn, device: torch.device, iters: int, warmup: int = 3, rounds: int = 3) -> float:
    """Mean time of ``iters`` calls issued back to back (CUDA events on a GPU), no host sync between them; the
    least of ``rounds`` rounds, each after a barrier."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(rounds):
        meet(device)
        if device.type != "cuda":
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            best = min(best, (time.perf_counter() - start) * 1e3 / iters)
            continue
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        best = min(best, begin.elapsed_time(end) / iters)
    return best


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


def bench_collectives(device: torch.device, world: int, args) -> list[dict]:
    """Each collective at each size: back to back (``measured_ms``) and synced one by one (``synced_ms``)."""
    from fusion.comms.cost import CostModel

    model = CostModel(world_size=world)
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    sizes = [2**p for p in range(20, 21 + args.max_log2_mib)]  # 1 MiB ... 2**max MiB of full buffer
    biggest = max(sizes) * 8 // torch.finfo(dtype).bits
    full_all = torch.ones(biggest, device=device, dtype=dtype)
    piece_all = torch.ones(biggest // world, device=device, dtype=dtype)
    rows = []
    for name in COLLECTIVES:
        for size in sizes:
            numel = size * 8 // torch.finfo(dtype).bits // world * world
            full, piece = full_all[:numel], piece_all[: numel // world]
            if name == "all_reduce":
                fn = lambda full=full: dist.all_reduce(full)  # noqa: E731
            elif name == "all_gather_into_tensor":
                fn = lambda full=full, piece=piece: dist.all_gather_into_tensor(full, piece)  # noqa: E731
            else:
                fn = lambda full=full, piece=piece: dist.reduce_scatter_tensor(piece, full)  # noqa: E731
            guess_ms = model.collective_of(name, size).ms * 3
            iters = 2 if args.dry_run else max(8, min(50, int(20 / guess_ms)))
            nbytes = full.numel() * full.element_size()
            ms = back_to_back_ms(fn, device, iters)
            rows.append({"op": name, "bytes": nbytes, "iters": iters, "measured_ms": ms,
                         "synced_ms": median_ms(fn, device, 2 if args.dry_run else 5),
                         "predicted_default_ms": model.collective_of(name, nbytes).ms,
                         "busbw_gbps": nbytes * model.bus_factor(name) / (ms * 1e-3) / 1e9})  # fmt: skip
    return rows


# ----------------------------------------------------------------------------------------------------------------------
# The steps


def inductor_flags() -> dict:
    """This torch's Inductor switches that overlap communication, with their values as shipped."""
    from torch._inductor import config

    opts = getattr(config, "aten_distributed_optimizations", None)
    flags = {"reorder_for_compute_comm_overlap": getattr(config, "reorder_for_compute_comm_overlap", None)}
    for name in ("enable_overlap_scheduling", "enable_simple_overlap"):
        if opts is not None and hasattr(opts, name):
            flags[f"aten_distributed_optimizations.{name}"] = getattr(opts, name)
    return flags


def make_variant(name: str, gm, device: torch.device):
    """(fn, patch, note): the compiled step, the Inductor config to compile it under, or (None, {}, why not)."""
    if name.startswith("fusion"):
        from fusion import backend  # registers "fusion"

        backend.reports.clear()  # this variant's pass notes only
        return torch.compile(gm, backend="fusion", options={"overlap": name == "fusion+overlap"}), {}, ""
    from torch._inductor import config

    flags = inductor_flags()
    sched = "aten_distributed_optimizations.enable_overlap_scheduling"
    if name == "inductor":
        patch = {}
    elif name == "inductor_overlap":
        if sched not in flags:
            return None, {}, f"this torch has no {sched}"
        patch = {sched: True}
        estimator = "aten_distributed_optimizations.compute_estimator"
        if device.type != "cuda" and hasattr(config.aten_distributed_optimizations, estimator.split(".")[1]):
            patch[estimator] = "analytical"  # its default benchmarks each op on a GPU; a dry run has none
    else:  # every overlap switch off: only where one is on by default, else it is the "inductor" row again
        if not any(flags.values()):
            return None, {}, f"no overlap switch is on by default in this torch ({flags}): same as 'inductor'"
        patch = {k: False for k, v in flags.items() if v}
    return torch.compile(gm, backend="inductor"), patch, ""


def pass_notes() -> list[str]:
    """The overlap pass's notes on the graphs compiled since the last reset: its order, said per collective."""
    from fusion import backend

    return [f"{n[1]} {n[2]}: {n[3]}"[:300] for r in backend.reports for p in r.parts for n in p.passes
            if n[0] == "overlap"]  # fmt: skip


def agree(value: object, src: int = 0) -> object:
    """Rank ``src``'s value on every rank (decisions every rank must take alike)."""
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def bench_steps(args, rank: int, world: int, device: torch.device, deadline: float, out: Path) -> list[dict]:
    from torch._inductor import config

    from fusion.comms.capture import capture_step, step_inputs
    from fusion.comms.profile import profile_call
    from fusion.overlap import build_graph, memory_budget, schedule_overlap

    dtype = torch.float32 if args.dry_run else torch.bfloat16
    rows, jsonl, setups = [], out / f"{args.stamp}-overlap-steps.jsonl", {}
    for kind in args.steps.split(","):  # each step once: its inputs, the eager aten graph's answer, the simulation
        shape = dict(layers=args.layers, dim=args.dim, batch=args.batch, world_size=world)
        capture = lambda k=kind, s=shape: capture_step(k, **s, dtype=dtype, device=str(device))  # noqa: E731
        graph, _ = build_graph(capture(), args.cost_model)
        order = schedule_overlap(graph, memory_budget(graph))
        before, after = graph.timeline(graph.original), graph.timeline(order)
        simulated = {k: {"step_ms": t.step_ms, "exposed_ms": t.exposed_ms} for k, t in
                     (("unscheduled", before), ("ours", after))}  # fmt: skip
        inputs = step_inputs(kind, rank=rank, dtype=dtype, device=device, **shape)
        setups[kind] = (shape, capture, simulated, inputs, capture()(*inputs))
    for name in args.variants.split(","):  # variant by variant, both steps each: the most wanted first
        for kind, (shape, capture, simulated, inputs, ref) in setups.items():
            row = {"world": world, "step": kind, "variant": name, **shape, "dtype": str(dtype), "rank": rank}
            left = deadline - time.time()
            go = agree(left > args.min_variant_s)  # rank 0's clock decides for everyone
            fn, patch, note = (
                make_variant(name, capture(), device) if go else (None, {}, f"time budget: {left:.0f} s left")
            )
            try:
                if fn is None:
                    row["skipped"] = note
                    continue
                row["inductor_patch"] = patch
                start = time.perf_counter()
                with config.patch(patch):  # Inductor reads its config while compiling: the first call
                    got = fn(*inputs)
                sync(device)
                row["first_call_s"] = time.perf_counter() - start
                row["max_abs_diff_vs_eager_graph"] = max(
                    float((a - b).abs().max()) for a, b in zip(got, ref, strict=True)
                )
                meet(device)
                row["step_ms"] = median_ms(lambda f=fn, x=inputs: f(*x), device, args.iters)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                    base = torch.cuda.memory_allocated(device)
                    fn(*inputs)
                    sync(device)
                    row["peak_mem_mib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
                trace = out / "traces" / f"{args.stamp}-x{world}-{kind}-{name.replace('+', '_')}-rank{rank}.json"
                keep = name in args.trace_variants.split(",")
                meet(device)
                lanes = profile_call(lambda f=fn, x=inputs: f(*x), trace if keep else None, device.type == "cuda",
                                     compress=False)  # fmt: skip
                row.update(lanes.summary())
                row["per_collective"] = lanes.detail()
                row["notes"] = lanes.notes
                if name.startswith("fusion"):
                    row["pass_notes"] = pass_notes()
                if keep:
                    row["trace"] = f"{args.stamp}-overlap-x{world}-traces.tar.gz:{trace.name}"
            except Exception as e:  # one variant failing must not cost the others
                row["error"] = f"{type(e).__name__}: {e}"[:600]
                traceback.print_exc()
            finally:
                torch._dynamo.reset()  # compiled code and caches of this variant: gone before the next
                rows.append(row)
                if rank == 0:
                    with open(jsonl, "a") as f:
                        f.write(json.dumps({**row, "simulated": simulated}) + "\n")
                    print(json.dumps({k: v for k, v in row.items() if k != "per_collective"}), flush=True)
    return rows


def worker(rank: int, args, store: str, world: int, deadline: float) -> None:
    from fusion.comms import passes
    from fusion.comms.cost import CostModel
    from fusion.comms.fit import fit_rows, model_from_fit, prediction_rows, rows_over_ranks

    if args.dry_run:
        backend, device = "gloo", torch.device("cpu")
    else:
        backend, device = "nccl", torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))  # fmt: skip
    out = Path(args.out)
    result = {"rank": rank, "world_size": world, "backend": backend, "torch": torch.__version__,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "date": datetime.date.today().isoformat(), "inductor_flags": inductor_flags(),
              "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")}}  # fmt: skip
    try:
        result["calibration"] = calibrate(device, args.dry_run)
        result["collectives"] = bench_collectives(device, world, args)
        everyone: list = [None] * world
        dist.all_gather_object(everyone, result["collectives"])
        result["fit"] = fit_rows(rows_over_ranks(everyone), world)  # the least over ranks, as the file keeps them
        fit, cal = agree([result["fit"], result["calibration"]])  # rank 0's: every rank schedules the same order
        base = CostModel(world_size=world, matmul_tflops=cal["matmul_tflops"], bandwidth_gbps=cal["copy_gbps"])
        args.cost_model = model_from_fit(world, fit, base, source=f"measured by scripts/gpu_overlap.py, x{world}")
        result["predicted_by_fit"] = prediction_rows(result["collectives"], args.cost_model)
        passes.set_cost_model(args.cost_model)  # the backend's overlap pass schedules with this host's figures
        result["cost_model"] = {k: getattr(args.cost_model, k) for k in args.cost_model.__dataclass_fields__}
        result["steps"] = bench_steps(args, rank, world, device, deadline, out)
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        Path(out, f"x{world}-rank{rank}.part").write_text(json.dumps(result, indent=1, default=str))
        Path(out, f"x{world}-rank{rank}.part").rename(Path(out, f"x{world}-rank{rank}.json"))  # whole, or absent
        dist.destroy_process_group()


def run_world(args, world: int, deadline: float) -> dict:
    """Spawn ``world`` ranks; wait until they finish or the deadline (+ grace) passes; gather their JSON."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(worker, args=(args, f"{tmp}/store", world, deadline), nprocs=world,
                                 start_method="spawn", join=False)  # fmt: skip
        cut, written = "", None
        try:
            while not ctx.join(timeout=1.0):
                if time.time() > deadline + args.grace_s:
                    cut = f"ranks still running {args.grace_s:.0f} s after this world's deadline: terminated"
                    break
                if all(Path(args.out, f"x{world}-rank{r}.json").exists() for r in range(world)):
                    written = written or time.time()  # every result is in: a hang in NCCL's teardown (2026-11-26:
                    if time.time() > written + 15:  # both worlds to their deadline) must not cost the next world
                        print(f"x{world}: every rank wrote its result; still running 15 s later: terminated")
                        break
        except Exception as e:  # a rank raised: the others are terminated by join
            cut = f"{type(e).__name__}: {str(e)[-400:]}"
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    ranks = []
    for r in range(world):
        path = Path(args.out, f"x{world}-rank{r}.json")
        ranks.append(json.loads(path.read_text()) if path.exists() else {"rank": r, "error": "wrote no result"})
        path.unlink(missing_ok=True)
    return {"world": world, "ranks": ranks, **({"cut": cut} if cut else {})}


def summary(steps: Path, collectives: dict) -> str:
    """The run in two short tables (what the integrator reads in the output's tail): steps, then the fits."""
    from fusion.common import table
    from fusion.comms.fit import fit_table

    rows = [json.loads(line) for line in steps.read_text().splitlines()] if steps.exists() else []
    f = lambda r, k, fmt=".2f": format(r[k], fmt) if isinstance(r.get(k), float) else "-"  # noqa: E731
    lines = [table([(r["world"], r["step"], r["variant"], f(r, "step_ms"), f(r, "comm_ms"), f(r, "exposed_ms"),
                     f(r, "peak_mem_mib", ".0f"), f(r, "first_call_s", ".0f"),
                     (r.get("error") or r.get("skipped") or "")[:50]) for r in rows],
                   ["GPUs", "step", "variant", "step ms", "NCCL ms", "exposed ms", "peak MiB", "1st s", "note"])]  # fmt: skip
    if collectives["worlds"]:  # the bands per collective, their worst error, one line's, the defaults'
        lines.append(table(*fit_table(collectives)))
    return "\n".join(lines)


def device_tag(dry: bool) -> str:
    """'h200', 'h100', ... for file names (as scripts/results/ names its files); 'cpu' for a dry run."""
    import re

    if dry or not torch.cuda.is_available():
        return "cpu"
    found = re.search(r"\b([A-Z]\d{2,3})\b", torch.cuda.get_device_name(0))
    return found.group(1).lower() if found else "gpu"


def main(argv: list[str] | None = None) -> int:
    from fusion.comms.fit import fit_rows, model_from_fit, prediction_rows, rows_over_ranks
    from fusion.comms.profile import pack_traces

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="gloo on CPU, 2 processes, toy sizes (every code path)")
    p.add_argument("--single", action="store_true", help="one GPU: calibrate matmul peak and copy bandwidth only")
    p.add_argument("--worlds", default="", help="world sizes, one after the other (default: 2,4 as GPUs allow)")
    p.add_argument("--steps", default="dp,fsdp", help="comma-separated: dp, fsdp, tp")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--trace-variants", default=",".join(VARIANTS), help="variants whose Chrome trace is kept")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1024, help="tokens per rank (smaller: communication matters more)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--max-log2-mib", type=int, default=10, help="collectives up to 2**N MiB (10: 1 GiB)")
    p.add_argument("--budget-s", type=float, default=500.0, help="wall seconds for everything, shared by worlds")
    p.add_argument("--min-variant-s", type=float, default=35.0, help="start a variant only with this much left")
    p.add_argument("--grace-s", type=float, default=40.0, help="after a world's deadline, before terminating it")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds for any collective (NCCL/gloo timeout)")
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder (default scripts/results; a dry run: tmp)")
    args = p.parse_args(argv)
    t0 = time.time()
    args.out = args.out or (tempfile.mkdtemp(prefix="gpu_overlap_") if args.dry_run else str(ROOT / "scripts/results"))
    Path(args.out, "traces").mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        args.layers, args.dim, args.batch, args.iters = min(args.layers, 2), min(args.dim, 64), min(args.batch, 32), 2
        args.max_log2_mib = min(args.max_log2_mib, 1)
    args.stamp = f"{device_tag(args.dry_run)}-{datetime.date.today().isoformat()}"
    if args.single:
        device = torch.device("cpu" if args.dry_run else "cuda")
        result = {"mode": "single", "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                  "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                  "calibration": calibrate(device, args.dry_run)}  # fmt: skip
        path = Path(args.out, f"{args.stamp}-overlap-single.json")
        path.write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1), f"\nwrote {path}")
        return 0
    asked = [int(w) for w in args.worlds.split(",") if w]
    gpus = max(asked or [2]) if args.dry_run else torch.cuda.device_count()  # a dry run: CPU processes, as asked
    worlds = asked or [w for w in (2, 4) if w <= gpus]
    kept = {k: v for k, v in vars(args).items() if k not in ("out", "cost_model")}
    collectives: dict = {"args": kept, "worlds": {}}
    errors = []
    for i, world in enumerate(worlds):
        if world > gpus or world < 2:
            print(f"world size {world}: this host has {gpus} GPUs (need 2 <= world <= GPUs): skipped", flush=True)
            errors.append(f"x{world}: skipped")
            continue
        deadline = t0 + args.budget_s * 0.9  # 10 % kept for writing up
        deadline = time.time() + (deadline - time.time()) / (len(worlds) - i)  # the time left, shared out equally
        print(f"--- world size {world}: until {deadline - t0:.0f} s into the run", flush=True)
        result = run_world(args, world, deadline)
        Path(args.out, f"{args.stamp}-overlap-x{world}.json").write_text(
            json.dumps({"args": kept, **result}, indent=1, default=str)
        )
        traces = sorted(Path(args.out, "traces").glob(f"{args.stamp}-x{world}-*.json"))
        if traces:  # one file per world size comes back from the device, however many traces
            archive = pack_traces(traces, Path(args.out, f"{args.stamp}-overlap-x{world}-traces.tar.gz"))
            print(f"packed {len(traces)} traces into {archive.name}", flush=True)
        r0 = result["ranks"][0]
        if "collectives" in r0:
            ranks = [r["collectives"] for r in result["ranks"] if r.get("collectives")]
            rows = rows_over_ranks(ranks)  # the least over ranks: the last rank to launch waits for no one
            fit = fit_rows(rows, world)
            collectives["worlds"][str(world)] = {
                "rows": rows, "fit": fit, "predicted_by_fit": prediction_rows(rows, model_from_fit(world, fit)),
                "fit_rank0_used_by_the_pass": r0.get("fit", {}), "calibration": r0.get("calibration", {})}  # fmt: skip
            collectives.update(device=r0["device"], torch=r0["torch"], date=r0["date"])
        errors += [f"x{world} rank {r['rank']}: {r['error']}" for r in result["ranks"] if "error" in r]
        errors += [f"x{world}: {result['cut']}"] if "cut" in result else []
        errors += [f"x{world} {s['step']} {s['variant']}: {s['error']}" for s in r0.get("steps", []) if "error" in s]
    path = Path(args.out, f"{args.stamp}-overlap-collectives.json")
    path.write_text(json.dumps(collectives, indent=1, default=str))
    left = list(Path(args.out, "traces").glob("*.json"))
    if left:  # a world cut short: its traces still go into one archive
        pack_traces(left, Path(args.out, f"{args.stamp}-overlap-traces-rest.tar.gz"))
    with contextlib.suppress(OSError):
        Path(args.out, "traces").rmdir()  # empty: nothing but the archives comes back
    print(summary(Path(args.out, f"{args.stamp}-overlap-steps.jsonl"), collectives))
    print(f"wrote {args.out} in {time.time() - t0:.0f} s" + (f"; errors: {errors}" if errors else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
