"""CPU cost of a generated-kernel launch, and what CUDA graphs buy, on a launch-bound model (issue 23).

    PYTHONPATH=. python3 scripts/gpu_launch_cost.py      (on the lent GPU; part of scripts/archive/gpu_session.sh a)

An 8-block MLP (Linear, GELU, LayerNorm) at a small batch: eager vs backend="fusion" vs options={"cudagraphs": True}
vs Inductor's default and reduce-overhead, median wall time per call (torch.utils.benchmark, interleaved); then
fusion.kernels.timing.launch_us: µs of CPU per launch through our direct launcher and through Triton's JIT.
"""

from __future__ import annotations

import os
import time

import torch
from torch.utils.benchmark import Timer

from fusion import backend
from fusion.bench.results import save_json
from fusion.kernels.timing import launch_us


def main() -> None:
    torch.manual_seed(0)
    blocks = [
        torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.LayerNorm(256)) for _ in range(8)
    ]
    m = torch.nn.Sequential(*blocks).cuda().bfloat16().eval()
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    variants = {"eager": m}
    for name, opts in (("fusion", {}), ("fusion+cudagraphs", {"cudagraphs": True})):
        variants[name] = torch.compile(m, backend="fusion", options=opts)
    variants["inductor"] = torch.compile(m)
    variants["inductor+reduce-overhead"] = torch.compile(m, mode="reduce-overhead")
    rows = {}
    with torch.no_grad():
        want = m(x)
        for name, f in variants.items():
            for _ in range(3):
                got = f(x)
            diff = (got.float() - want.float()).abs().max().item()
            print(f"{name}: max |out - eager| = {diff:.3g} (bf16, 8 blocks)")
        for name, f in variants.items():
            t = Timer("f(x); torch.cuda.synchronize()", globals={"f": f, "x": x, "torch": torch})
            rows[name] = t.blocked_autorange(min_run_time=0.3).median * 1e6
    for name, us in rows.items():
        print(f"{name:26s} {us:8.1f} µs/call   {rows['eager'] / us:5.2f}× eager")
    backend.reset()
    f = torch.compile(m, backend="fusion")
    with torch.no_grad():
        f(x)
    launchers = [lch for r in backend.reports for p in r.parts for lch in p.launchers()]
    cost = launch_us(launchers, lambda: f(x))
    print(
        f"per launch: {cost['direct']:.1f} µs direct ({'/'.join(cost.get('paths', [])) or 'none'}), "
        f"{cost['jit']:.1f} µs through Triton's JIT ({cost['kernels']} kernels, {cost['fallbacks']} fell back)"
    )
    # The same host's floor for comparison: one eager aten op (allocate the output, launch), host time only.
    a = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(1000):
        torch.add(a, a)
    cost["eager_add_us"] = (time.perf_counter() - start) / 1000 * 1e6
    torch.cuda.synchronize()
    print(
        f"one eager torch.add on this host: {cost['eager_add_us']:.1f} µs of CPU (the floor a launch is measured against)"
    )
    out = os.environ.get("OUT")
    if out:
        save_json(os.path.join(out, "launch_cost.json"), {"us_per_call": rows, "per_launch": cost}, device="cuda")


if __name__ == "__main__":
    main()
