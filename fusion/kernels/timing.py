"""GPU timings of generated kernels (Phase 8's printout on a GPU): wall time per call, GPU time per kernel from CUDA
events, and each kernel beside Phase 6's prediction (external bytes ÷ copy bandwidth). Nothing here runs on a CPU."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from fusion.kernels.triton_runtime import Launcher, RegionKernel


def wall_us(fn: Callable[..., object], *args: object) -> float:
    """Median wall time of ``fn(*args)`` + a CUDA synchronize, in µs (torch.utils.benchmark)."""
    from torch.utils.benchmark import Timer

    timer = Timer("f(*x); torch.cuda.synchronize()", globals={"f": fn, "x": args, "torch": torch})
    with torch.no_grad():
        return timer.blocked_autorange(min_run_time=0.3).median * 1e6


def kernel_gpu_us(compiled, flat_inputs: Sequence[torch.Tensor], launches: int = 50) -> list[tuple]:
    """(kernel, GPU µs per launch) for every generated kernel of one call: CUDA events around ``launches``
    back-to-back launches of that kernel alone, on the inputs it received in that call (outputs preallocated)."""
    captured: dict[RegionKernel, tuple] = {}
    kernels = [m for m in compiled.graph_module.modules() if isinstance(m, RegionKernel)]
    for m in kernels:  # the graph calls each kernel's launcher: record the inputs of its first call
        m.launch.spy = lambda args, m=m: captured.setdefault(m, tuple(args))
    try:
        with torch.no_grad():
            compiled(*flat_inputs)
    finally:
        for m in kernels:
            m.launch.spy = None
    rows = []
    for mod, args in captured.items():
        launch, _ = mod._launcher(args)
        launch()  # compile and warm up
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            launch()
        end.record()
        end.synchronize()
        rows.append((mod.kernel, start.elapsed_time(end) * 1e3 / launches))
    return rows


def launch_us(launchers: Sequence[Launcher], call: Callable[[], object], calls: int = 200) -> dict[str, float]:
    """CPU cost of one launch, in µs, averaged over ``launchers`` (e.g. ``CompiledGraph.launchers``): ``call()``
    runs the compiled code twice (the second goes through the direct launchers) while recording each kernel's inputs,
    then each kernel is launched ``calls`` times back to back, host time only. ``direct``: what a compiled graph
    does after its first call (Triton's compiled launcher, outputs allocated); ``jit``: Triton's JIT dispatch, what
    it did before. Target: direct <= 10 µs. CUDA only."""
    captured: dict[Launcher, tuple] = {}
    for lch in launchers:
        lch.spy = lambda args, lch=lch: captured.setdefault(lch, tuple(args))
    try:
        with torch.no_grad():
            call()
            call()
    finally:
        for lch in launchers:
            lch.spy = None
    total = {"direct": 0.0, "jit": 0.0}
    for lch, args in captured.items():
        jit, _ = lch.owner._launcher(args)
        for name, fn in (("direct", lambda lch=lch, args=args: lch(*args)), ("jit", jit)):
            fn()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            total[name] += (time.perf_counter() - start) / calls
            torch.cuda.synchronize()
    n = max(len(captured), 1)
    fallbacks = sum(bool(lch.fallback) for lch in captured)
    paths = sorted({lch.kind for lch in captured if lch.kind})  # "static" (torch's launcher) / "triton" (Triton's)
    return {"kernels": len(captured), "direct": total["direct"] / n * 1e6, "jit": total["jit"] / n * 1e6,
            "fallbacks": fallbacks, "paths": paths}  # fmt: skip


def gpu_cases(quick: bool) -> list[tuple[str, torch.nn.Module, tuple]]:
    """(title, model, inputs) on CUDA in bf16: the blocks whose kernels :func:`gpu_numbers` times."""
    from fusion import models

    n = 1024 if quick else 8192
    cases = [
        ("relu(x·a+b)·c + x", models.ElementwiseChain(d=4096), models.elementwise_inputs(batch=n, d=4096)),
        ("x + gelu(layer_norm(x))", models.NormGELUResidual(d_model=4096), models.norm_inputs(1, n, 4096)),
    ]
    return [(title, m.cuda().bfloat16(), tuple(t.cuda().bfloat16() for t in inp)) for title, m, inp in cases]


def gpu_numbers(cases: Sequence[tuple[str, torch.nn.Module, tuple, object]]) -> None:
    """On a GPU: each generated kernel's GPU time beside Phase 6's prediction (external bytes ÷ copy bandwidth).
    ``cases``: (title, model, inputs, the model compiled by Phase 8's ``compile_regions``)."""
    from fusion.aten.bandwidth import measure_bandwidth_gbps
    from fusion.aten.capture import aten_inputs
    from fusion.common import heading, table

    heading(f"On the GPU ({torch.cuda.get_device_name()}, bf16): measured vs predicted", "-")
    bw = measure_bandwidth_gbps("cuda")
    rows, misses = [], []
    for title, m, inp, compiled in cases:
        eager, ours = wall_us(m, *inp), wall_us(compiled, *inp)
        regions = {k.name: k.region for k in compiled.compiled.kernels}  # the runtime holds data, not regions
        for kernel, gpu in kernel_gpu_us(compiled.compiled, aten_inputs(m, inp)):
            predicted = regions[kernel.name].total_bytes / (bw * 1e3)  # µs
            if gpu > 1.3 * predicted:
                misses.append((kernel.name, kernel.kind))
            rows.append((title, kernel.name, f"{predicted:.1f}", f"{gpu:.1f}", f"{gpu / predicted:.2f}×",
                         f"{eager:.1f}", f"{ours:.1f}"))  # fmt: skip
    print(table(rows, ["block", "kernel", "predicted µs", "GPU µs", "GPU/predicted", "eager wall µs", "ours wall µs"]))
    print(f"predicted = the region's external bytes ÷ {bw:.0f} GB/s (a copy measured here); GPU µs from CUDA events.")
    for name, kind in misses:
        why = (
            "a row reduction is a dependent chain (load, cross-warp reduction, second reduction, store) with "
            "less memory-level parallelism per SM than a stream: several rows per program (XBLOCK) helps short rows"
            if kind == "reduction"
            else "a pointwise kernel should stream at copy bandwidth: look at its loads (broadcast, strides) and XBLOCK"
        )
        print(f"{name} is beyond 1.3× of its prediction: {why}.")
