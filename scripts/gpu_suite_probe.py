"""Why one suite row differs from the same model timed elsewhere: the suite's own process, then a look inside it.

    PYTHONPATH=. python3 scripts/gpu_suite_probe.py efficientnet_b0 [--backends eager,fusion,inductor]  (the GPU)
    python3 scripts/gpu_suite_probe.py --dry-run resnet18                                          (CPU, tiny)

Runs one model exactly as ``python -m fusion.benchmark --suite`` does (``run_suite``: the float64 reference, every
backend's accuracy, the interleaved timing), keeps the functions it timed, and then, in the same process:
- each backend's calls timed again, pipelined (one sync per 50 calls) and synchronised per call, with the calling
  thread's CPU time beside the wall time;
- cProfile of 20 pipelined calls per backend (top functions by own time);
- ``fusion``'s launchers: which direct path each took (static, triton, none) and why not, calls through it;
  Triton's launch hooks as the runtime sees them.
Printed; the suite's row to $OUT/probe_<model>.json.
"""

from __future__ import annotations

import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import time
from collections import Counter

import torch

import fusion.benchmark as lesson
from fusion import backend  # noqa: F401  (registers backend="fusion")
from fusion.bench import suite
from fusion.bench.results import save_json
from fusion.kernels import triton_runtime


def timed(fn, sync, n: int, per_call: bool) -> tuple[float, float]:
    """(wall ms, thread CPU ms) a call over ``n`` calls."""
    sync()
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(n):
        fn()
        if per_call:
            sync()
    sync()
    return (time.perf_counter() - w0) * 1e3 / n, (time.thread_time() - c0) * 1e3 / n


def suite_keeping(name: str, backends: list[str], dry: bool, before=None) -> tuple[dict, dict, object]:
    """One model's suite row, run as ``python -m fusion.benchmark --suite`` runs it, and the functions it timed:
    (the suite's result, {backend: call}, sync). ``before(fns, sync)`` runs just before the suite's timer."""
    kept: dict = {}
    plain_measure = suite._measure

    def measure(row, fns, cfg, lesson_, sync):
        kept.update(fns=dict(fns), sync=sync)
        if before is not None:
            before(kept["fns"], sync)
        return plain_measure(row, fns, cfg, lesson_, sync)

    suite._measure = measure
    try:
        result = suite.run_suite(
            lesson, models=[name], backends=backends, device="cpu" if dry else None, sizes="tiny" if dry else None
        )
    finally:
        suite._measure = plain_measure
    return result, kept["fns"], kept["sync"]


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    name = next((a for a in argv if not a.startswith("--")), "efficientnet_b0")
    picked = next((a.split("=", 1)[1] for a in argv if a.startswith("--backends=")), "eager,fusion,inductor")

    def before(fns, sync):
        n = 5 if dry else 30
        steps = (
            ("as the suite is about to time them", lambda: None),
            ("after gc.collect()", gc.collect),
            (
                "after torch.cuda.empty_cache() too",
                torch.cuda.empty_cache if torch.cuda.is_available() else lambda: None,
            ),
        )
        print("\nbefore the suite's timing (pipelined, ms a call: wall / thread CPU):")
        for what, act in steps:
            act()
            cells = []
            for k, fn in fns.items():
                wall, cpu = timed(fn, sync, n, False)
                cells.append(f"{k} {wall:.3f} / {cpu:.3f}")
            print(f"  {what:36s} " + "   ".join(cells))

    result, fns, sync = suite_keeping(name, picked.split(","), dry, before)
    n = 5 if dry else 50
    print("\nagain in this process (ms a call: wall / thread CPU):")
    for mode in ("pipelined", "synchronised"):
        for label, fn in fns.items():
            runs = [timed(fn, sync, n, mode == "synchronised") for _ in range(3)]
            w = statistics.median(r[0] for r in runs)
            c = statistics.median(r[1] for r in runs)
            print(f"  {mode:13s} {label:10s} {w:7.3f} / {c:7.3f}")
    print(
        "\nthe suite's timer again (lesson.time_variants, 5 interleaved rounds of 0.04 s blocks), by which backends"
        " share the rounds: ms a call; the caching allocator's device allocations and frees, retries, over the run"
    )
    cuda = torch.cuda.is_available()
    threads = torch.get_num_threads()
    for combo in (
        ("fusion",),
        ("inductor",),
        ("eager", "fusion", "inductor"),
        ("fusion", "inductor"),
        ("eager", "fusion"),
        ("eager", "inductor"),
        ("eager", "fusion", "inductor"),
    ):
        picked_fns = {k: fns[k] for k in combo if k in fns}
        before = torch.cuda.memory_stats() if cuda else {}
        t = lesson.time_variants(picked_fns, rounds=5, min_run_time=0.04, sync=sync, threads=threads)
        after = torch.cuda.memory_stats() if cuda else {}
        delta = {
            k: after.get(k, 0) - before.get(k, 0) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries")
        }
        times = ", ".join(f"{k} {v.median_s * 1e3:.3f}" for k, v in t.items())
        print(f"  {'+'.join(combo):24s} {times:55s} {delta}")
    for label, fn in fns.items():
        prof = cProfile.Profile()
        gc.collect()
        prof.enable()
        for _ in range(2 if dry else 20):
            fn()
        sync()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
        print(f"\n===== cProfile {label} (20 calls)")
        print("\n".join(s.getvalue().splitlines()[6:24]))
    from torch.profiler import ProfilerActivity, profile

    for label, fn in fns.items():  # the CUDA runtime's calls, pipelined: which of them block, and for how long
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(2 if dry else 20):
                fn()
            sync()
        calls = 2 if dry else 20
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        print(f"\n===== torch.profiler {label}, pipelined: µs of self CPU a call (count a call)")
        for e in [e for e in rows if e.key.startswith(("cu", "Memcpy", "Memset"))][:10] + rows[:12]:
            print(f"  {e.self_cpu_time_total / calls:9.1f} µs  ×{e.count / calls:6.1f}  {e.key[:100]}")
    launchers = [o for o in gc.get_objects() if isinstance(o, triton_runtime.Launcher)]
    kinds = Counter((lc.kind, lc.fallback[:80], lc.static_refused[:60]) for lc in launchers)
    print(f"\nlaunchers alive: {len(launchers)}, direct launches {sum(lc.launches for lc in launchers)}")
    for k, c in kinds.most_common():
        print(f"  {c:4d} × kind={k[0]!r} fallback={k[1]!r} static_refused={k[2]!r}")
    try:
        from triton import knobs

        rt_knobs = knobs.runtime
        print("triton launch hooks:", rt_knobs.launch_enter_hook, rt_knobs.launch_exit_hook)
    except Exception as e:  # noqa: BLE001
        print("triton knobs:", type(e).__name__, e)
    print("gc:", gc.isenabled(), gc.get_count(), gc.get_threshold(), "objects", len(gc.get_objects()))
    out = os.environ.get("OUT")
    if out:
        save_json(os.path.join(out, f"probe_{name}.json"), result, device="cpu" if dry else "cuda")


if __name__ == "__main__":
    main(sys.argv[1:])
