"""Reductions with few outputs over a long extent (issue 39's column sums and long-row sums) on the GPU: eager,
``backend="fusion"`` with and without pass ``split_reductions`` (fusion.compiler.split_reductions), Inductor, and
the limit (bytes read / the bandwidth of a measured copy of the same bytes), all in one process: GPU time from CUDA
events around calls queued behind a sleep (the kernels, not the CPU's launch overhead; inputs rotated past L2), the
wall time per call too (torch.utils.benchmark), ratios to the limit. Also the sums over leading dims of a bias / LayerNorm weight gradient
(the cases of the former gpu_outer_sums.py).

    PYTHONPATH=. python3 scripts/gpu_reductions.py --out $OUT            (on the lent GPU; JSON to $OUT/reductions.json)
    PYTHONPATH=. python3 scripts/gpu_reductions.py --targets 256,1024,4096 (the pass at several TARGET_PROGRAMS)
    python3 scripts/gpu_reductions.py --dry-run                          (CPU, tiny shapes: rehearse it)

Forms: ``lone`` is ``r(x)`` (a bfloat16 sum accumulates in float32 inside the op), ``float`` is ``r(x.float())``
(bf16 read, summed in float32: the issue's measurement), ``grad`` is ``(g * x).float().sum(dims)`` (two inputs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch
from torch.utils.benchmark import Timer

CASES = {  # name: (shape, reduction, dims, forms, what)
    "sum0_65536x1024": ((65536, 1024), "sum", [0], ("lone", "float"), "the issue's column sum x.sum(0)"),
    "sum0_8192x4096": ((8192, 4096), "sum", [0], ("lone", "float"), "a column sum of 4096 columns"),
    "sum_last_64x262144": ((64, 262144), "sum", [-1], ("lone", "float"), "the issue's 64 long rows"),
    "sum_last_16x1M": ((16, 1 << 20), "sum", [-1], ("lone", "float"), "16 rows of 1M"),
    "sum_last_512x32768": ((512, 32768), "sum", [-1], ("float",), "512 rows of 32768: split below FEW_PROGRAMS"),
    "amax0_65536x1024": ((65536, 1024), "amax", [0], ("lone",), "a column max"),
    "mean_last_64x262144": ((64, 262144), "mean", [-1], ("lone",), "a mean of 64 long rows"),
    "bias_grad_bert": ((8 * 512, 768), "sum", [0], ("float",), "a Linear bias gradient, BERT-base 8x512"),
    "ln_weight_grad_bert": ((8, 512, 768), "sum", [0, 1], ("grad",), "a LayerNorm weight gradient"),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class Reduce(torch.nn.Module):
    def __init__(self, op: str, dims: list[int], form: str) -> None:
        super().__init__()
        self.op, self.dims, self.form = op, dims, form

    def forward(self, x, g=None):
        if self.form == "grad":
            x = (g * x).float()
        elif self.form == "float":
            x = x.float()
        return getattr(torch, self.op)(x, self.dims) if self.op != "sum" else x.sum(self.dims)


def wall_us(fn, *args, min_run_time: float = 0.2) -> float:
    """A call's wall time (CPU overhead included): torch.utils.benchmark's median."""
    with torch.no_grad():
        return (
            Timer("fn(*args)", globals={"fn": fn, "args": args}).blocked_autorange(min_run_time=min_run_time).median
            * 1e6
        )


def gpu_us(fn, sets: list[tuple], calls: int = 30, repeats: int = 5) -> float:
    """A call's GPU time: the GPU is held by a sleep while the CPU queues ``calls`` calls, so CUDA events time the
    kernels back to back, not the CPU's launch overhead; inputs rotate over ``sets`` (more bytes than L2 holds, so
    every call reads memory, as the limit's copy does). The median of ``repeats``; on a CPU, the wall time."""
    if not torch.cuda.is_available() or sets[0][0].device.type != "cuda":
        return wall_us(fn, *sets[0])
    times = []
    with torch.no_grad():
        for _ in range(2):
            fn(*sets[0])
        for _ in range(repeats):
            torch.cuda.synchronize()
            torch.cuda._sleep(20_000_000)  # ~10 ms: longer than queueing the calls takes
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(calls):
                fn(*sets[i % len(sets)])
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def copies(n: int):
    """``f(*inputs, *outputs)`` copying each of ``n`` inputs into its output: the limit's bytes, read and written."""

    def copy(*io):
        for i, o in zip(io[:n], io[n:], strict=True):
            o.copy_(i)

    return copy


@contextlib.contextmanager
def split_pass(on: bool, target: int | None):
    """The backend with pass split_reductions on or off: its option once wired into PASSES; until then the pass
    appended to (or absent from) a patched list. ``target``: its TARGET_PROGRAMS for this compile."""
    from fusion import backend
    from fusion.compiler import split_reductions as sr

    saved_passes, saved_target = backend.PASSES, (sr.TARGET_PROGRAMS, sr.TARGET_COLUMN_PROGRAMS)
    wired = any(p.name == "split_reductions" for p in backend.PASSES)
    if not wired and on:
        backend.PASSES = [*backend.PASSES, sr.SPLIT_REDUCTIONS]
    if target is not None:  # rows: t stage-1 rows; columns: 4t groups of 16 columns (the module's ratio)
        sr.TARGET_PROGRAMS, sr.TARGET_COLUMN_PROGRAMS = target, 4 * target
    try:
        yield {"split_reductions": on} if wired else {}
    finally:
        backend.PASSES, (sr.TARGET_PROGRAMS, sr.TARGET_COLUMN_PROGRAMS) = saved_passes, saved_target


def compiled_fusion(model, args, on: bool, target: int | None):
    import fusion.backend as backend

    backend.reset()
    torch._dynamo.reset()
    with split_pass(on, target) as options:
        fn = torch.compile(model, backend="fusion", options=options or None)
        with torch.no_grad():
            fn(*args)  # compiled here, under the patch
    notes = [p for r in backend.reports for part in r.parts for p in part.passes if p[0] == "split reductions"]
    kernels = sum(len(part.kernels) for r in backend.reports for part in r.parts)
    calls = sum(sum(part.library_calls.values()) for r in backend.reports for part in r.parts)
    return fn, notes, (kernels, calls)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes (the pass forced on: ON_CPU)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for reductions.json")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument(
        "--targets",
        default="",
        help="TARGET_PROGRAMS values to time the pass at (default: the module's; TARGET_COLUMN_PROGRAMS is 4x)",
    )
    ap.add_argument("--no-inductor", action="store_true")
    args = ap.parse_args(argv)
    dry = args.dry_run
    dev = "cpu" if dry else "cuda"
    from fusion.compiler import split_reductions as sr

    if dry:  # tiny shapes: thresholds scaled down so the rewrite happens, on CPU
        sr.ON_CPU, sr.LONG_EXTENT, sr.MIN_CHUNK, sr.MIN_COLUMN_CHUNK = True, 256, 8, 8
        sr.LONG_COLUMN_EXTENT = 256
    targets = [int(t) for t in args.targets.split(",") if t] or [None]
    rows, t0 = [], time.time()
    for name in args.cases.split(","):
        shape, op, dims, forms, what = CASES[name]
        shape = tuple(max(1, s // 256) if i == 0 or len(shape) > 2 else max(1, s // 64) for i, s in enumerate(shape)) \
            if dry else shape  # fmt: skip
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            for form in forms:
                torch.manual_seed(0)
                x = torch.randn(shape, device=dev, dtype=dtype)
                ins = (x, torch.randn_like(x)) if form == "grad" else (x,)
                nbytes = sum(t.numel() * t.element_size() for t in ins)
                # inputs rotated over >= 200 MB (an H100's L2 is 50 MB, an H200's 60): each call reads memory
                sets = [ins] + [tuple(t.clone() for t in ins) for _ in range(min(8, -(-(200 << 20) // nbytes)) - 1)]
                model = Reduce(op, dims, form)
                with torch.no_grad():
                    want = model(*ins)
                row = {"case": name, "what": what, "shape": list(shape), "op": op, "dims": dims, "dtype": dname,
                       "form": form, "eager_us": gpu_us(model, sets), "eager_wall_us": wall_us(model, *ins)}  # fmt: skip
                outs = [tuple(torch.empty_like(t) for t in s) for s in sets]  # the copy: read and write each input once
                copy = gpu_us(copies(len(ins)), [s + o for s, o in zip(sets, outs, strict=True)])
                row["limit_us"] = copy / 2  # read once at the copy's bandwidth
                variants = [("fusion_off", False, None)] + [
                    (f"fusion_on{'' if t is None else f'_t{t}'}", True, t) for t in targets
                ]
                for label, on, target in variants:
                    try:
                        fn, notes, kernels = compiled_fusion(model, ins, on, target)
                        got = fn(*ins)
                        tol = 2e-2 if dtype == torch.bfloat16 else 1e-3
                        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * shape[-1] ** 0.5)
                        row[f"{label}_us"], row[f"{label}_wall_us"] = gpu_us(fn, sets), wall_us(fn, *ins)
                        row[f"{label}_notes"] = [n[3] for n in notes]
                        row[f"{label}_kernels"], row[f"{label}_library_calls"] = kernels
                    except Exception as e:  # noqa: BLE001 - a row says what failed, the others still run
                        row[f"{label}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                if not args.no_inductor and not dry:
                    torch._dynamo.reset()
                    ind = torch.compile(model)
                    with torch.no_grad():
                        ind(*ins)
                    row["inductor_us"], row["inductor_wall_us"] = gpu_us(ind, sets), wall_us(ind, *ins)
                row["bytes"] = nbytes
                for k in [k for k in row if k.endswith("_us") and k != "limit_us" and not k.endswith("wall_us")]:
                    row[k.replace("_us", "_x_limit")] = round(row[k] / row["limit_us"], 2)
                rows.append(row)
                times = "  ".join(f"{k[:-3]} {v:7.1f}" for k, v in row.items() if k.endswith("_us") and "wall" not in k)
                print(f"{name:22} {dname} {form:6} {times}  [{time.time() - t0:.0f} s]", flush=True)
                for k, v in row.items():
                    if k.endswith("_error") or (k.endswith("_notes") and v):
                        print(f"    {k}: {v}", flush=True)
    if args.out:
        meta = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "targets": targets,
                "thresholds": {k: getattr(sr, k) for k in ("FEW_PROGRAMS", "FEW_COLUMN_PROGRAMS", "LONG_EXTENT",
                                                              "TARGET_PROGRAMS", "MIN_CHUNK", "MAX_ROW_SPLITS")}}  # fmt: skip
        with open(os.path.join(args.out, "reductions.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
