"""The block of a looped column walk, swept on a GPU: the first stage of a split column sum (``x.sum(0)`` of (8192,
4096) bf16 and its neighbours) at several splits S, XBLOCK columns a program, RBLOCK rows a step and warps; each
config's GPU time against the limit (bytes read / a measured copy's bandwidth), Inductor's beside. The best configs
of the first case are then timed on the others, so a table entry is chosen for every column walk, not one shape.

    PYTHONPATH=. python3 scripts/gpu_column_sweep.py --out $OUT     (the lent GPU; JSON to $OUT/column_sweep.json)
    python3 scripts/gpu_column_sweep.py --dry-run                   (CPU, tiny shapes: rehearse it)

How a config is forced: the split's S through ``split_reductions.TARGET_COLUMN_PROGRAMS``; XBLOCK through
``fusion.ir.plan.ELEMENTS_PER_PROGRAM`` (XBLOCK = elements / RBLOCK for a looped column walk; the second stage's short
walk halves its XBLOCK to fill the GPU either way); RBLOCK and warps by rewriting the column walk's launch facts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from gpu_reductions import Reduce, copies, gpu_us  # noqa: E402

CASES = {  # name: (shape, dtype, form, dims)
    "sum0_8192x4096_bf16": ((8192, 4096), torch.bfloat16, "lone", [0]),
    "sum0_65536x1024_bf16": ((65536, 1024), torch.bfloat16, "lone", [0]),
    "sum0_65536x1024_float": ((65536, 1024), torch.bfloat16, "float", [0]),
    "sum0_8192x4096_fp32": ((8192, 4096), torch.float32, "lone", [0]),
    "bias_grad_bert": ((4096, 768), torch.bfloat16, "float", [0]),
    "sum0_65536x1024_fp32": ((65536, 1024), torch.float32, "lone", [0]),
    "amax0_65536x1024_bf16": ((65536, 1024), torch.bfloat16, "lone", [0], "amax"),
    "amax0_65536x1024_fp32": ((65536, 1024), torch.float32, "lone", [0], "amax"),
}
ROW_CASES = {  # the long-row walks (a looped row a program): --rows
    "sum_last_64x262144_bf16": ((64, 262144), torch.bfloat16, "lone", [-1]),
    "sum_last_16x1M_bf16": ((16, 1 << 20), torch.bfloat16, "lone", [-1]),
    "sum_last_64x262144_fp32": ((64, 262144), torch.float32, "lone", [-1]),
    "sum_last_16x1M_fp32": ((16, 1 << 20), torch.float32, "lone", [-1]),
    "sum_last_64x262144_float": ((64, 262144), torch.bfloat16, "float", [-1]),
}


@contextlib.contextmanager
def config(target: int | None, xblock: int | None, step: int | None, warps: int | None, rows: bool = False):
    """Compile under one config (None: the module's own value); ``rows``: of a looped row walk (XBLOCK is 1)."""
    from fusion.compiler import split_reductions as sr
    from fusion.ir import plan
    from fusion.kernels import triton_render as tr

    saved = (sr.TARGET_COLUMN_PROGRAMS, sr.TARGET_PROGRAMS, plan.ELEMENTS_PER_PROGRAM, tr.launch_facts)
    facts = tr.launch_facts

    def forced(kernel):
        launch = facts(kernel)
        if launch.kind == "reduction" and launch.column != rows and launch.looped:
            rblock = step or launch.rblock
            elements = xblock * rblock if xblock else launch.elements
            n = (
                plan.row_warps(launch.numel, rblock, launch.min_xblock, elements) if warps == -1 else warps
            ) or launch.num_warps
            launch = dataclasses.replace(launch, rblock=rblock, num_warps=n, elements=elements)
        return launch

    if target and rows:
        sr.TARGET_PROGRAMS = target
    elif target:
        sr.TARGET_COLUMN_PROGRAMS = target
    if xblock and step and rows:  # a row walk's budget (a column loop's is its launch's elements, above)
        plan.ELEMENTS_PER_PROGRAM = xblock * step
    tr.launch_facts = forced
    try:
        yield
    finally:
        sr.TARGET_COLUMN_PROGRAMS, sr.TARGET_PROGRAMS, plan.ELEMENTS_PER_PROGRAM, tr.launch_facts = saved


def compiled(model, args, cfg, rows):
    import fusion.backend as backend

    backend.reset()
    torch._dynamo.reset()
    with config(*cfg, rows=rows):
        fn = torch.compile(model, backend="fusion")
        with torch.no_grad():
            fn(*args)  # compiled and launched once (the launch config is read at the first call)
    kernels = [k for r in backend.reports for part in r.parts for k in part.kernels]
    return fn, len(kernels)


def time_case(name, dev, dry, cfgs, inductor=True):
    rows = name in ROW_CASES
    shape, dtype, form, dims, *op = ROW_CASES[name] if rows else CASES[name]
    if dry:
        shape = (shape[0] // 16, shape[1] // 256) if rows else (shape[0] // 64, shape[1] // 16)
    torch.manual_seed(0)
    x = torch.randn(shape, device=dev, dtype=dtype)
    nbytes = x.numel() * x.element_size()
    sets = [(x,)] + [(x.clone(),) for _ in range(min(8, -(-(200 << 20) // nbytes)) - 1)]
    model = Reduce(op[0] if op else "sum", dims, form)
    with torch.no_grad():
        want = model(x)
    outs = [(torch.empty_like(s[0]),) for s in sets]
    row = {"case": name, "shape": list(shape), "dtype": str(dtype), "form": form}
    row["limit_us"] = gpu_us(copies(1), [s + o for s, o in zip(sets, outs, strict=True)]) / 2
    row["eager_us"] = gpu_us(model, sets)
    if inductor and not dry:
        torch._dynamo.reset()
        ind = torch.compile(model)
        with torch.no_grad():
            ind(x)
        row["inductor_us"] = gpu_us(ind, sets)
    row["configs"] = []
    for cfg in cfgs:
        entry = {"target": cfg[0], "xblock": cfg[1], "step": cfg[2], "warps": cfg[3]}
        try:
            fn, kernels = compiled(model, (x,), cfg, rows)
            extent = shape[dims[0]]
            torch.testing.assert_close(fn(x).float(), want.float(), rtol=2e-2, atol=2e-2 * extent**0.5)
            entry["us"], entry["kernels"] = gpu_us(fn, sets), kernels
            entry["x_limit"] = round(entry["us"] / row["limit_us"], 3)
        except Exception as e:  # noqa: BLE001 - a config that fails says so; the others still run
            entry["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        row["configs"].append(entry)
        print(f"  {name} {entry}", flush=True)
    return row


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--top", type=int, default=4, help="configs of the first case timed on the others")
    ap.add_argument("--rows", action="store_true", help="the long-row walks instead (split S, step, warps)")
    ap.add_argument("--targets", default="2048,4096,8192", help="TARGET_(COLUMN_)PROGRAMS values swept")
    ap.add_argument("--xblocks", default="64,128,256", help="XBLOCK values swept (columns)")
    ap.add_argument("--steps", default="16,32,64", help="RBLOCK steps swept")
    ap.add_argument("--warps", default="4,8", help="warps swept (-1: the row_warps rule)")
    ap.add_argument("--configs", default="", help="target:xblock:step:warps,... timed on every case of --cases")
    ap.add_argument("--cases", default="", help="the cases --configs runs (default: every column case)")
    args = ap.parse_args(argv)
    dev = "cpu" if args.dry_run else "cuda"
    from fusion.compiler import split_reductions as sr

    if args.dry_run:
        sr.ON_CPU, sr.MIN_COLUMN_CHUNK, sr.LONG_COLUMN_EXTENT = True, 8, 64
    t0 = time.time()
    default = [(None, None, None, None)]
    if args.dry_run:
        sweep = default + [(4096, 64, 32, 4), (8192, 128, 16, 8)]
    else:
        ints = [[int(v) for v in a.split(",")] for a in (args.targets, args.xblocks, args.steps, args.warps)]
        sweep = default + list(itertools.product(*ints))
    if args.rows:  # a row walk takes one row a program: no XBLOCK to force
        sweep = [(t, None, st, w) for t, _, st, w in dict.fromkeys(sweep)]
        sweep = list(dict.fromkeys(sweep))
        if args.dry_run:
            sr.LONG_EXTENT, sr.MIN_CHUNK = 256, 8
    meta = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "defaults": {"TARGET_COLUMN_PROGRAMS": sr.TARGET_COLUMN_PROGRAMS, "TARGET_PROGRAMS": sr.TARGET_PROGRAMS},
            "argv": argv}  # fmt: skip

    def save(rows):  # after every case: a call cut short keeps what it timed
        if args.out:
            with open(os.path.join(args.out, f"{'row' if args.rows else 'column'}_sweep.json"), "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)

    if args.configs:  # explicit configs on every case named: no search
        cfgs = default + [tuple(int(v) or None if i < 3 else int(v) for i, v in enumerate(c.split(":")))
                          for c in args.configs.split(",")]  # fmt: skip
        rows = []
        for name in args.cases.split(",") if args.cases else list(CASES):
            rows.append(time_case(name, dev, args.dry_run, cfgs))
            save(rows)
            print(f"[{time.time() - t0:.0f} s]", flush=True)
        return 0
    first, *rest = ROW_CASES if args.rows else CASES
    rows = [time_case(first, dev, args.dry_run, sweep)]
    save(rows)
    done = [c for c in rows[0]["configs"] if "us" in c]
    best = sorted(done[1:], key=lambda c: c["us"])[: args.top]
    chosen = default + [(c["target"], c["xblock"], c["step"], c["warps"]) for c in best]
    print(f"best of {first}: {best}  [{time.time() - t0:.0f} s]", flush=True)
    for name in rest:
        rows.append(time_case(name, dev, args.dry_run, chosen))
        save(rows)
        print(f"[{time.time() - t0:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
