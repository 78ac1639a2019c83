"""Which part of ``timeit``'s way of calling makes a compiled call cost more CPU? (EfficientNet-B0: ``fusion``'s calls
took 6 ms of CPU each inside ``Timer.timeit(10)`` and 3.2 ms in a plain loop a second later, on one H200 host.)

    PYTHONPATH=. python3 scripts/gpu_context_probe.py efficientnet_b0        (on the lent GPU, inside the suite)
    python3 scripts/gpu_context_probe.py --dry-run resnet18                   (CPU, tiny: rehearse it)

Inside the suite's own process, just before its timer, per compiled backend, the thread CPU time of each call
(``gpu_call_trace.traced``), 12 calls a way between two synchronisations, ways interleaved over 5 rounds:
``loop`` (a plain loop), ``loop, collector off`` (``gc.disable()`` around it), ``exec'd loop`` (the same loop in a
function compiled by ``exec`` from ``timeit``'s template, the collector on), ``timeit`` (the standard library's
``timeit.Timer.timeit(10)``: that function with the collector off), ``Timer n=10`` (torch's), the same with its
``set_torch_threads`` made a no-op, the plain loop inside ``set_torch_threads``, torch's Timer's block of 12 without
its warm-up (``_timeit``), and plain loops of k calls, a synchronisation, then 10 calls (k = 1, 2: the Timer's
warm-up and ``blocked_autorange``'s first block). Found on one H200 host (2026-11-29): the standard library's
``timeit`` as fast as the loop, torch's Timer slow with or without its thread setting. The suite's own
timing is skipped (the probe stops the process after).
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import time
import timeit

import torch
import torch.utils.benchmark as tbench
import torch.utils.benchmark.utils.common as tcommon
from gpu_call_trace import settle, traced
from torch.profiler import ProfilerActivity, profile

TEMPLATE = """
def inner(_it, _timer):
    _t0 = _timer()
    for _i in _it:
        fn()
    _t1 = _timer()
    return _t1 - _t0
"""


def profiled(label: str, way: str, how, calls: int) -> None:
    """One block of ``way`` under torch.profiler: the GPU's kernel time and the host's time in the CUDA runtime's
    calls (launches, allocations, synchronisations) a call, and the ops with the most self CPU. A launch that waits
    for room in the GPU's queue shows as time in ``cudaLaunchKernel``/``cuLaunchKernel``."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        how()
    events = prof.key_averages()
    gpu = sum(e.device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA) / calls
    runtime = sorted((e for e in events if e.key.startswith(("cuda", "cu"))), key=lambda e: -e.cpu_time_total)[:5]
    ops = sorted((e for e in events if not e.key.startswith(("cuda", "cu"))), key=lambda e: -e.self_cpu_time_total)[:6]
    print(f"  profiled, {label}, {way}: GPU {gpu / 1e3:.2f} ms a call; runtime: "
          + ", ".join(f"{e.key} {e.count / calls:.0f}x {e.cpu_time_total / max(e.count, 1):.1f} us" for e in runtime))  # fmt: skip
    print("    most self CPU a call: "
          + ", ".join(f"{e.key} {e.self_cpu_time_total / calls:.0f} us" for e in ops), flush=True)  # fmt: skip


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    name = next((a for a in argv if not a.startswith("--")), "efficientnet_b0")

    def before(fns, sync):
        cuda = torch.cuda.is_available() and not dry

        def clock() -> float:
            sync()
            return time.perf_counter()

        threads = torch.get_num_threads()

        def one(label, fn):
            log: list = []
            call = traced(fn, log, cuda)
            namespace = {"fn": call}
            exec(TEMPLATE, namespace)
            inner = namespace["inner"]

            def loop():
                clock()
                for _ in range(12):
                    call()
                clock()

            def gc_off():
                gc.disable()
                try:
                    loop()
                finally:
                    gc.enable()

            def timer_no_threads():
                plain = tcommon.set_torch_threads
                tcommon.set_torch_threads = lambda n: contextlib.nullcontext()
                try:
                    tbench.Timer("fn()", globals={"fn": call}, timer=clock, num_threads=threads).timeit(10)
                finally:
                    tcommon.set_torch_threads = plain

            def after(k: int):  # k calls, a synchronisation, then 10 calls (Timer.timeit's warm-up is k = 2)
                def run():
                    clock()
                    for _ in range(k):
                        call()
                    clock()
                    for _ in range(10):
                        call()
                    clock()

                return run

            def threads_loop():
                with tcommon.set_torch_threads(threads):
                    loop()

            ways = {
                "loop": loop,
                "loop, collector off": gc_off,
                "exec'd loop": lambda: inner(iter([None] * 12), clock),
                "timeit": lambda: timeit.Timer("fn()", timer=clock, globals={"fn": call}).timeit(12),
                "Timer n=10": lambda: tbench.Timer(
                    "fn()", globals={"fn": call}, timer=clock, num_threads=torch.get_num_threads()
                ).timeit(10),
                "Timer, threads not set": timer_no_threads,
                "loop, threads set": threads_loop,
                "Timer, its block alone": lambda: tbench.Timer("fn()", globals={"fn": call}, timer=clock)._timeit(12),
                "1, sync, 10": after(1),
                "2, sync, 10": after(2),
            }
            per: dict = {way: [] for way in ways}
            for _ in range(3 if dry else 5):
                for way, how in ways.items():
                    log.clear()
                    how()
                    sync()
                    per[way].append(statistics.median(c for _, c, _ in settle(log)))
            print(f"\n{label}: median CPU ms a call, per round")
            for way, ms in per.items():
                print(f"  {way:22s} " + "  ".join(f"{m:.2f}" for m in ms), flush=True)
            for way in ("Timer n=10", "loop"):  # the slow way and the plain one under torch.profiler
                profiled(label, way, ways[way], 12)

        for label, fn in fns.items():
            if label != "eager":
                one(label, fn)
        raise SystemExit(0)

    from gpu_suite_probe import suite_keeping

    suite_keeping(name, ["eager", "fusion", "inductor"], dry, before)


if __name__ == "__main__":
    main(sys.argv[1:])
