"""Torch's ``Timer.timeit(10)`` taken apart: which of its steps makes ``fusion``'s EfficientNet-B0 calls cost more CPU
than a plain loop, and whether the host is slower then (a fixed piece of pure-Python work, timed after each call: if
it slows down too, the host is slower, not ``fusion``'s code; it also leaves the GPU idle between calls).

    PYTHONPATH=. python3 scripts/gpu_timer_split_probe.py efficientnet_b0        (on the lent GPU, inside the suite)
    python3 scripts/gpu_timer_split_probe.py --dry-run resnet18                   (CPU, tiny: rehearse it)
    ... --freeze: ``gc.freeze()`` first, once the models are compiled (the collector then walks only what the calls
    make: if the slow ways become fast, a collection's walk of the process's objects is part of the cause)

Inside the suite's own process, just before its timer, per compiled backend, 12 calls a way (each call's thread CPU,
the median), ways interleaved over 5 rounds: ``Timer n=10`` (``timeit(10)``: the thread setting, a block of 2 calls,
a block of 10, a Measurement); the same with the thread setting made a no-op; its two blocks alone (``_timeit 2+10``,
the collector on between them, as ``timeit`` leaves it); the two blocks with the collector off throughout, with no
collection, a young one or a full one between them; one block of 12; a plain loop. ``Timer n=10`` and the loop run
again with the fixed work after each call. Then the suite's own row, in the same process.

Found on three H200 hosts (2026-11-29): ``Timer n=10`` costs up to 1.5x the loop's CPU a call for ``fusion``, not
for Inductor, while the fixed work takes the same time (the host is not slower); the two blocks with the collector
off throughout cost what the loop costs; with it on between them, on one host as much as ``Timer n=10``.
Per way it also reads the thread's ``getrusage`` and the collector's runs: on two more hosts that day, every Timer way
took 145 minor page faults a ``fusion`` call, and a loop none, with no collection in any way. ``gpu_fault_probe.py``
traced them to CPython's frame-stack chunks (``fusion/kernels/stack_chunks.py``, now on: this probe no longer shows
the cost unless run with ``FUSION_KEEP_STACK_CHUNKS=0``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import statistics
import sys
import threading
import time

import torch
import torch.utils.benchmark as tbench
import torch.utils.benchmark.utils.common as tcommon
from gpu_call_trace import settle, traced

SPUN = ("Timer n=10", "loop")  # these ways also run with the fixed work after each call


def work() -> float:
    """Thread CPU ms of a fixed piece of pure-Python work (the host's speed at this moment)."""
    c0 = time.thread_time()
    total = 0
    for i in range(20000):
        total += i & 7
    return (time.thread_time() - c0) * 1e3


RUSAGE = ("ru_utime", "ru_stime", "ru_minflt", "ru_nvcsw", "ru_nivcsw")


class GcLog:
    """Python's collections while a way runs (``gc.callbacks``): how many of each generation, and their ms."""

    def __init__(self) -> None:
        self.by_gen = [0, 0, 0]
        self.ms = 0.0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.by_gen[info["generation"]] += 1
            self.ms += (time.perf_counter() - self._t0) * 1e3


def usage() -> tuple:
    """The calling thread's resource usage (Linux: RUSAGE_THREAD; elsewhere the process's)."""
    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    r = resource.getrusage(who)
    return tuple(getattr(r, k) for k in RUSAGE)


def process_facts() -> str:
    """What else could run beside the calls: Python threads, OS threads, the collector's hooks and thresholds."""
    tasks = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else -1
    tools = []
    if hasattr(sys, "monitoring"):
        tools = [(i, sys.monitoring.get_tool(i)) for i in range(6) if sys.monitoring.get_tool(i)]
    return (
        f"python threads {[t.name for t in threading.enumerate()]}; OS threads {tasks}; gc.callbacks "
        f"{[getattr(c, '__qualname__', repr(c)) for c in gc.callbacks]}; threshold {gc.get_threshold()}; "
        f"frozen {gc.get_freeze_count()}; sys.monitoring tools {tools}; profile {sys.getprofile()}; trace "
        f"{sys.gettrace()}; switch interval {sys.getswitchinterval()}"
    )


def ways_for(call, clock) -> dict:
    """{way: run 12 calls of ``call`` that way}."""
    threads = torch.get_num_threads()

    def timer() -> tbench.Timer:
        return tbench.Timer("fn()", globals={"fn": call}, timer=clock, num_threads=threads)

    def unthreaded():
        kept = tcommon.set_torch_threads
        tcommon.set_torch_threads = lambda n: contextlib.nullcontext()
        try:
            timer().timeit(10)
        finally:
            tcommon.set_torch_threads = kept

    def two_blocks():
        t = timer()
        t._timeit(2)
        t._timeit(10)

    def blocks_gc_off(generation: int | None):
        def run():  # the collector off throughout; a collection of `generation` between the blocks, if any
            t = timer()
            gc.disable()
            try:
                t._timeit(2)
                if generation is not None:
                    gc.collect(generation)
                t._timeit(10)
            finally:
                gc.enable()

        return run

    def loop():
        clock()
        for _ in range(12):
            call()
        clock()

    return {
        "Timer n=10": lambda: timer().timeit(10),
        "Timer n=10, threads not set": unthreaded,
        "_timeit 2+10": two_blocks,
        "_timeit 2+10, gc off": blocks_gc_off(None),
        "2, collect(0), 10, gc off": blocks_gc_off(0),
        "2, collect(2), 10, gc off": blocks_gc_off(2),
        "_timeit(12)": lambda: timer()._timeit(12),
        "loop": loop,
    }


def probe(label: str, fn, sync, cuda: bool, rounds: int) -> None:
    log: list = []
    spins: list = []
    spinning = [False]
    traced_fn = traced(fn, log, cuda)

    def call():
        out = traced_fn()
        if spinning[0]:
            spins.append(work())
        return out

    def clock() -> float:
        sync()
        return time.perf_counter()

    plain = ways_for(call, clock)
    ways = {(way, s): how for s in (False, True) for way, how in plain.items() if not s or way in SPUN}
    per: dict = {way: [] for way in ways}
    spin: dict = {way: [] for way in ways}
    used: dict = {way: [0.0] * (len(RUSAGE) + 4) for way in ways}  # summed over rounds: rusage, 3 gens, gc ms
    gclog = GcLog()
    gc.callbacks.append(gclog)
    try:
        for _ in range(rounds):
            for way, how in ways.items():
                log.clear()
                spins.clear()
                spinning[0] = way[1]
                gclog.by_gen, gclog.ms = [0, 0, 0], 0.0
                u0 = usage()
                how()
                sync()
                u1 = usage()
                row = [b - a for a, b in zip(u0, u1, strict=True)] + [*gclog.by_gen, gclog.ms]
                used[way] = [x + y for x, y in zip(used[way], row, strict=True)]
                per[way].append(statistics.median(c for _, c, _ in settle(log)))
                spin[way].append(statistics.median(spins) if spins else 0.0)
    finally:
        gc.callbacks.remove(gclog)
    print(f"\n{label}: median CPU ms a call per round | the fixed work's ms after each call, median per round")
    for way in ways:
        name = way[0] + (", work after" if way[1] else "")
        print(f"  {name:30s} " + "  ".join(f"{m:5.2f}" for m in per[way]) + "  | "
              + "  ".join(f"{m:5.3f}" for m in spin[way]), flush=True)  # fmt: skip
    print(
        f"{label}: per call, summed over the rounds' calls: user / system ms, minor faults, voluntary / forced "
        "context switches; collections of generation 0 / 1 / 2 in all, and their ms in all"
    )
    for way in ways:
        name = way[0] + (", work after" if way[1] else "")
        n = 12 * rounds
        ut, st, flt, vcs, ics, g0, g1, g2, gms = used[way]
        print(f"  {name:30s} {ut / n * 1e3:6.2f} / {st / n * 1e3:5.2f} ms  {flt / n:7.1f} faults  {vcs / n:5.2f} / "
              f"{ics / n:5.2f} switches | gc {g0:.0f} / {g1:.0f} / {g2:.0f}, {gms:6.1f} ms", flush=True)  # fmt: skip


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    name = next((a for a in argv if not a.startswith("--")), "efficientnet_b0")

    freeze = "--freeze" in argv

    def before(fns, sync):
        if freeze:  # every object alive now out of the collector's reach: no collection walks them again
            gc.collect()
            gc.freeze()
            print(f"gc.freeze(): {gc.get_freeze_count()} objects frozen", flush=True)
        print(process_facts(), flush=True)
        for label, fn in fns.items():
            if label != "eager":
                probe(label, fn, sync, torch.cuda.is_available() and not dry, 3 if dry else 5)
        print("\nthe suite's own timing follows, in this process", flush=True)

    from gpu_suite_probe import suite_keeping

    suite_keeping(name, ["eager", "fusion", "inductor"], dry, before)


if __name__ == "__main__":
    main(sys.argv[1:])
