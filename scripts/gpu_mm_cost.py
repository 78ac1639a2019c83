"""CPU time a GEMM call costs as a compiled graph makes it: ``torch.mm(a, b)`` (aten allocates the output through
the dispatcher) against ``torch.mm(a, b, out=empty_strided(...))`` (Inductor's wrapper: the output from the guards'
C++ allocator, then the ``out=`` overload), for mm, addmm and bmm, on CUDA and CPU.

    PYTHONPATH=. python3 scripts/gpu_mm_cost.py        (on the lent GPU; CPU rows too)

Small operands so that the device keeps up and the time is the CPU's: µs per call, median of interleaved rounds of
2,000 calls each (synchronised at the end of each round).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

from fusion.aten.nodes import reinterpret


def variants(device: str) -> dict[str, tuple]:
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(64, 96, device=device, dtype=dt)
    w = torch.randn(128, 96, device=device, dtype=dt)  # a Linear's weight: read transposed
    bias = torch.randn(128, device=device, dtype=dt)
    xb, yb = torch.randn(8, 16, 32, device=device, dtype=dt), torch.randn(8, 32, 16, device=device, dtype=dt)
    alloc = (
        torch._C._dynamo.guards._empty_strided_cuda if device == "cuda" else torch._C._dynamo.guards._empty_strided_cpu
    )
    wt = reinterpret(w, (96, 128), (1, 96), 0)
    return {
        "mm": (lambda: torch.mm(x, wt), lambda: torch.mm(x, wt, out=alloc((64, 128), (128, 1), dt))),
        "addmm": (
            lambda: torch.addmm(bias, x, wt),
            lambda: torch.addmm(bias, x, wt, out=alloc((64, 128), (128, 1), dt)),
        ),
        "bmm": (lambda: torch.bmm(xb, yb), lambda: torch.bmm(xb, yb, out=alloc((8, 16, 16), (256, 16, 1), dt))),
    }


def per_call_us(fn, n: int, sync) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    out = {"torch": torch.__version__, "rows": []}
    devices = ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]
    for device in devices:
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        n = 2000 if device == "cuda" else 500
        for op, (plain, into) in variants(device).items():
            for f in (plain, into):
                per_call_us(f, 200, sync)  # warm-up
            times = {"plain": [], "out=": []}
            for _ in range(15):
                times["plain"].append(per_call_us(plain, n, sync))
                times["out="].append(per_call_us(into, n, sync))
            row = {"device": device, "op": op, **{k: statistics.median(v) for k, v in times.items()}}
            out["rows"].append(row)
            print(f"{device:5} {op:6} plain {row['plain']:6.2f} us   out= {row['out=']:6.2f} us   "
                  f"saved {row['plain'] - row['out=']:5.2f} us", flush=True)  # fmt: skip
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "mm_cost.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
