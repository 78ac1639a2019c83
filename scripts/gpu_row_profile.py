"""Where a split long-row sum's GPU time goes: each kernel's own time, the gap between them, and one-kernel forms.

    PYTHONPATH=. python3 scripts/gpu_row_profile.py --out $OUT      (the lent GPU; JSON and Inductor's code to $OUT)
    python3 scripts/gpu_row_profile.py --dry-run                     (CPU: the hand-written kernels interpreted)

For ``x.sum(-1)`` of few long bf16 rows (the issue's 64 x 262,144, and 16 x 1M): ``fusion`` and Inductor compiled
as the suite does, timed as ``gpu_reductions.py`` times them (the GPU held by a sleep while 30 calls queue, inputs
rotated past L2), then profiled (torch.profiler's CUDA kernels of those calls: each kernel's mean duration, and the
per-call time not inside any kernel). Beside them, hand-written Triton forms of the same split, to learn what a
change of the generated code could buy before building it:

* ``two_pass``: stage 1 (S programs a row, a float32 partial each) and stage 2 (a row's S partials summed), two
  launches: what ``split_reductions`` generates.
* ``last_program``: one launch. Each program stores its partial, then counts itself done on the row's counter
  (an atomic add, acquire-release); the row's last program sums the row's S partials in their fixed order and resets
  the counter. Deterministic: every partial has one writer, the final sum one order.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if "--dry-run" in sys.argv:  # before Triton is imported (by the backend): the hand-written kernels interpreted
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import fusion.backend  # noqa: F401 - registers backend="fusion"

sys.path.insert(0, os.path.dirname(__file__))
from gpu_reductions import copies, gpu_us  # noqa: E402

CASES = {"64x262144": (64, 262144), "16x1M": (16, 1 << 20)}


@triton.jit
def chunk_sum(x, part, L: tl.constexpr, S: tl.constexpr, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    """Program ``pid`` sums its chunk of L / S elements of row pid // S into ``part[pid]``; returns the row."""
    pid = tl.program_id(0)
    row, split = pid // S, pid % S
    base = x + row.to(tl.int64) * L + split * (L // S)
    acc = tl.zeros([BLOCK], tl.float32)
    for off in range(0, L // S, BLOCK):
        acc += tl.load(base + off + tl.arange(0, BLOCK), eviction_policy=EVICT).to(tl.float32)
    tl.store(part + pid, tl.sum(acc, 0))
    return row


@triton.jit
def stage1(x, part, L: tl.constexpr, S: tl.constexpr, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    chunk_sum(x, part, L, S, BLOCK, EVICT)


@triton.jit
def stage2(part, out, S: tl.constexpr):
    row = tl.program_id(0)
    p = tl.load(part + row * S + tl.arange(0, S))
    tl.store(out + row, tl.sum(p, 0).to(out.dtype.element_ty))


@triton.jit
def last_program(x, part, count, out, L: tl.constexpr, S: tl.constexpr, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    row = chunk_sum(x, part, L, S, BLOCK, EVICT)
    tl.debug_barrier()  # every thread's store before the release
    done = tl.atomic_add(count + row, 1, sem="acq_rel")
    if done == S - 1:  # the row's last program: every partial is written
        p = tl.load(part + row * S + tl.arange(0, S), volatile=True)
        tl.store(out + row, tl.sum(p, 0).to(out.dtype.element_ty))
        tl.atomic_xchg(count + row, 0)


def hand_written(rows: int, length: int, s: int, block: int, warps: int, interpret: bool, evict: str = ""):
    """``f(x) -> x.sum(-1)`` for each hand-written form at split ``s``, ``block`` elements a step."""
    forms = {}
    part = {}
    counts = {}

    def two_pass(x):
        if x.device not in part:
            part[x.device] = torch.empty(rows * s, device=x.device, dtype=torch.float32)
        p = part[x.device]
        out = torch.empty(rows, device=x.device, dtype=x.dtype)
        stage1[(rows * s,)](x, p, L=length, S=s, BLOCK=block, EVICT=evict, num_warps=warps)
        stage2[(rows,)](p, out, S=s, num_warps=1)
        return out

    def one_pass(x):
        if x.device not in part:
            part[x.device] = torch.empty(rows * s, device=x.device, dtype=torch.float32)
        if x.device not in counts:
            counts[x.device] = torch.zeros(rows, device=x.device, dtype=torch.int32)
        p, c = part[x.device], counts[x.device]
        out = torch.empty(rows, device=x.device, dtype=x.dtype)
        last_program[(rows * s,)](x, p, c, out, L=length, S=s, BLOCK=block, EVICT=evict, num_warps=warps)
        return out

    forms["two_pass"], forms["last_program"] = two_pass, one_pass
    return forms


def graph_us(fn, sets, calls: int = 30, repeats: int = 5) -> float:
    """A call's time replayed from a CUDA graph of ``calls`` calls: the kernels back to back without any launch
    path (what is left of a difference here is the kernels and their dependencies, not how they were launched)."""
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn(*sets[0])
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(*sets[i % len(sets)])
    times = []
    for _ in range(repeats):
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def profiled(fn, sets, calls: int):
    """torch.profiler (CPU and CUDA) over ``calls`` calls queued behind a sleep, so the GPU runs them back to back."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn(*sets[0])
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            torch.cuda._sleep(20_000_000)
            for i in range(calls):
                fn(*sets[i % len(sets)])
            torch.cuda.synchronize()
    return prof


def trace_facts(fn, sets, path: str, calls: int = 10) -> dict:
    """From a chrome trace of ``calls`` queued calls: each kernel's grid, block, registers, shared memory, and the
    median gap before it (from the end of the kernel before)."""
    prof = profiled(fn, sets, calls)
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and "spin" not in e["name"]), key=lambda e: e["ts"])
    facts: dict = {}
    for before, e in zip(kernels, kernels[1:], strict=False):
        a = e.get("args", {})
        f = facts.setdefault(
            e["name"][:60],
            {
                k: a.get(k)
                for k in ("grid", "block", "registers per thread", "shared memory", "est. achieved occupancy %")
            },
        )
        f.setdefault("gaps", []).append(e["ts"] - (before["ts"] + before["dur"]))
        f.setdefault("durs", []).append(e["dur"])
    for f in facts.values():
        gaps, durs = sorted(f.pop("gaps")), sorted(f.pop("durs"))
        f["gap_us"], f["dur_us"] = gaps[len(gaps) // 2], durs[len(durs) // 2]
    return facts


def kernel_profile(fn, sets, calls: int = 30) -> dict:
    """Mean CUDA time per call of each kernel name, and the per-call span not covered by any kernel."""
    prof = profiled(fn, sets, calls)
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "sleep" not in e.name]
    names: dict[str, list[float]] = {}
    for e in evs:
        names.setdefault(e.name[:80], []).append(e.time_range.elapsed_us())
    spans = sorted((e.time_range.start, e.time_range.end) for e in evs)
    busy = sum(b - a for a, b in spans)
    total = spans[-1][1] - spans[0][0] if spans else 0
    return {
        "kernels": {k: {"calls": len(v) / calls, "mean_us": sum(v) / len(v)} for k, v in names.items()},
        "busy_us_per_call": busy / calls,
        "span_us_per_call": total / calls,
        "idle_us_per_call": (total - busy) / calls,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--configs", default="16:16384:8,32:8192:8,16:8192:16")
    args = ap.parse_args(argv)
    dry = args.dry_run
    dev = "cpu" if dry else "cuda"
    out = {"meta": {"torch": torch.__version__, "device": torch.cuda.get_device_name() if not dry else "cpu",
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, "rows": []}  # fmt: skip
    for name, (rows, length) in CASES.items():
        if dry:
            rows, length = 4, 8192
        torch.manual_seed(0)
        x = torch.randn(rows, length, device=dev, dtype=torch.bfloat16)
        nbytes = x.numel() * 2
        sets = [(x,)] + [(x.clone(),) for _ in range(min(8, -(-(200 << 20) // nbytes)) - 1)]
        want = x.double().sum(-1)
        row = {"case": name, "bytes": nbytes}
        if not dry:
            outs = [(torch.empty_like(s[0]),) for s in sets]
            row["limit_us"] = gpu_us(copies(1), [s + o for s, o in zip(sets, outs, strict=True)]) / 2
            compiled = {}
            torch._dynamo.reset()
            compiled["fusion"] = torch.compile(lambda x: x.sum(-1), backend="fusion")
            compiled["fusion"](x)
            torch._dynamo.reset()
            from torch._inductor.utils import run_and_get_code

            ind = torch.compile(lambda x: x.sum(-1))
            _, code = run_and_get_code(ind, x)
            compiled["inductor"] = ind
            if args.out:
                with open(os.path.join(args.out, f"inductor_{name}.py"), "w") as f:
                    f.write("\n\n".join(code))
            for label, fn in compiled.items():
                row[f"{label}_us"] = gpu_us(fn, sets)
                row[f"{label}_profile"] = kernel_profile(fn, sets)
                try:
                    row[f"{label}_graph_us"] = graph_us(fn, sets)
                except Exception as e:  # noqa: BLE001
                    row[f"{label}_graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                if args.out:
                    row[f"{label}_trace"] = trace_facts(fn, sets, os.path.join(args.out, f"trace_{name}_{label}.json"))
                    print(label, row.get(f"{label}_graph_us"), row[f"{label}_trace"], flush=True)
                print(f"{name} {label}: {row[f'{label}_us']:.2f} us, {row[f'{label}_profile']}", flush=True)
        for cfg in args.configs.split(","):
            s, block, warps, *evict = cfg.split(":")
            s, block, warps, evict = int(s), int(block), int(warps), (evict or [""])[0]
            if length % s or (length // s) % block:
                continue
            for label, fn in hand_written(rows, length, s, min(block, length // s), warps, dry, evict).items():
                key = f"{label}_S{s}_B{block}_W{warps}" + (f"_{evict}" if evict else "")
                try:
                    got = [fn(*sets[0]) for _ in range(3)]
                    torch.testing.assert_close(got[0].double(), want.to(got[0].dtype).double(), rtol=2e-2, atol=0.5)
                    assert all(torch.equal(g, got[0]) for g in got), "not deterministic"
                    if not dry:
                        row[f"{key}_us"] = gpu_us(fn, sets)
                        row[f"{key}_profile"] = kernel_profile(fn, sets)
                        print(f"{name} {key}: {row[f'{key}_us']:.2f} us", flush=True)
                    else:
                        print(f"{name} {key}: ok", flush=True)
                except Exception as e:  # noqa: BLE001 - a form that fails says why; the others still run
                    row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    print(f"{name} {key}: {row[f'{key}_error']}", flush=True)
        if "limit_us" in row:
            for k in [k for k in row if k.endswith("_us") and k != "limit_us"]:
                row[k.replace("_us", "_x_limit")] = round(row[k] / row["limit_us"], 3)
        out["rows"].append(row)
    if args.out:
        with open(os.path.join(args.out, "row_profile.json"), "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
