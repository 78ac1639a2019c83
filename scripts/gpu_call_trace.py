"""Every call the suite's timer makes, traced: which calls of a block are slow, and on which side (CPU or GPU)?

    PYTHONPATH=. python3 scripts/gpu_call_trace.py efficientnet_b0 [--backends=eager,fusion,inductor]
    python3 scripts/gpu_call_trace.py --dry-run resnet18                        (CPU, tiny: rehearse it)

Inside the suite's own process, just before its timer (``gpu_suite_probe.suite_keeping``), each compiled function is
wrapped so that every call records its wall time on the host (no synchronisation: how long Python takes to queue
the work), the calling thread's CPU time, and on CUDA the GPU's time from an event recorded before the call to one
recorded after it. Then the functions are timed three ways, each in interleaved rounds as the suite times them:
- ``suite``: ``fusion.benchmark.time_variants`` with the suite's ``min_run_time`` (the suite's timer itself);
- ``Timer n=10``: ``torch.utils.benchmark.Timer.timeit(10)`` (two warm-up calls, then a block of 10);
- ``autorange``: ``Timer.blocked_autorange(0.04)`` alone (what ``time_variants`` calls);
- ``loop of 30``: a plain loop between two synchronisations; also inside ``set_torch_threads`` (as the Timer runs its
  blocks), and with Python's collector off (as ``timeit`` runs them).
``--ways=suite,loop of 30``: only those ways (each round's start is printed with the epoch time, to line up with
``nvidia-smi``'s samples). ``--cprofile``: then cProfile's top functions of each compiled backend, under the suite's way and a plain loop.
Printed per way and backend: the calls of each round in order as ``host ms / CPU ms / GPU ms`` (the first round in
full, the medians of every round), and the rounds' medians. Raw JSON to $OUT/call_trace_<model>.json.
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

import torch
import torch.utils.benchmark as tbench
import torch.utils.benchmark.utils.common as tbench_common

from fusion import benchmark as lesson
from fusion.bench.results import save_json


def traced(fn, log: list, cuda: bool):
    """``fn`` recording (host s, thread CPU s, start event, end event) per call into ``log``."""

    def call():
        ev0 = ev1 = None
        if cuda:
            ev0 = torch.cuda.Event(enable_timing=True)
            ev1 = torch.cuda.Event(enable_timing=True)
            ev0.record()
        c0, t0 = time.thread_time(), time.perf_counter()
        out = fn()
        t1, c1 = time.perf_counter(), time.thread_time()
        if cuda:
            ev1.record()
        log.append((t1 - t0, c1 - c0, ev0, ev1))
        return out

    return call


def settle(log: list) -> list[tuple[float, float, float]]:
    """ms per call: (host, CPU, GPU or 0)."""
    return [(h * 1e3, c * 1e3, e0.elapsed_time(e1) if e0 is not None else 0.0) for h, c, e0, e1 in log]


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    name = next((a for a in argv if not a.startswith("--")), "efficientnet_b0")
    picked = next((a.split("=", 1)[1] for a in argv if a.startswith("--backends=")), "eager,fusion,inductor")
    rounds = 3 if dry else 5
    found: dict = {"model": name, "ways": {}}

    def before(fns, sync):
        cuda = torch.cuda.is_available() and not dry
        logs = {label: [] for label in fns}
        wrapped = {label: traced(fn, logs[label], cuda) for label, fn in fns.items()}

        def clock() -> float:
            sync()
            return time.perf_counter()

        def suite_way(label):
            lesson.time_variants(
                {label: wrapped[label]},
                rounds=1,
                min_run_time=0.04,
                warmup=0,
                sync=sync,
                threads=torch.get_num_threads(),
            )

        def timer10(label):
            tbench.Timer(
                stmt="fn()", globals={"fn": wrapped[label]}, timer=clock, num_threads=torch.get_num_threads()
            ).timeit(10)

        def loop30(label):
            clock()
            for _ in range(30):
                wrapped[label]()
            clock()

        def autorange(label):
            tbench.Timer(
                stmt="fn()", globals={"fn": wrapped[label]}, timer=clock, num_threads=torch.get_num_threads()
            ).blocked_autorange(min_run_time=0.04)

        def threads_loop(label):
            with tbench_common.set_torch_threads(torch.get_num_threads()):
                loop30(label)

        def gc_off_loop(label):
            gc.disable()
            try:
                loop30(label)
            finally:
                gc.enable()

        ways = (
            ("suite", suite_way),
            ("autorange", autorange),
            ("Timer n=10", timer10),
            ("loop of 30", loop30),
            ("loop, set_num_threads", threads_loop),
            ("loop, collector off", gc_off_loop),
        )
        only = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--ways=")), None)
        for way, how in ways:
            if only and way not in only:
                continue
            per: dict = {label: [] for label in fns}
            for i in range(rounds):
                for label in fns:
                    logs[label].clear()
                    print(f"@{time.time():.3f} {way} round {i} {label}", flush=True)
                    how(label)
                    sync()
                    per[label].append(settle(logs[label]))
            found["ways"][way] = {k: [[list(c) for c in r] for r in v] for k, v in per.items()}
            print(f"\n{way}: calls of the first round, host / CPU / GPU ms")
            for label, rs in per.items():
                print(f"  {label:9s} " + "  ".join(f"{h:.2f}/{c:.2f}/{g:.2f}" for h, c, g in rs[0][:24]))
            print(f"{way}: each round's median call, host / CPU / GPU ms (calls a round)")
            for label, rs in per.items():
                cells = []
                for r in rs:
                    h, c, g = (statistics.median(x[i] for x in r) for i in range(3))
                    cells.append(f"{h:.2f}/{c:.2f}/{g:.2f}({len(r)})")
                print(f"  {label:9s} " + "  ".join(cells), flush=True)

        if "--cprofile" in argv:  # where the CPU time goes in the suite's way and in a plain loop
            for label in [x for x in fns if x != "eager"]:
                for way, how in (("suite", suite_way), ("loop of 30", loop30)):
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(rounds):
                        logs[label].clear()
                        how(label)
                        sync()
                    prof.disable()
                    calls = rounds * len(logs[label])
                    buf = io.StringIO()
                    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
                    print(f"\ncProfile, {label}, {way} (about {calls} calls):")
                    print("\n".join(ln for ln in buf.getvalue().splitlines() if ln.strip())[:3000], flush=True)

    from gpu_suite_probe import suite_keeping

    found["suite"], _, _ = suite_keeping(name, picked.split(","), dry, before)
    out = os.environ.get("OUT")
    if out:
        save_json(os.path.join(out, f"call_trace_{name}.json"), found, device="cpu" if dry else "cuda")


if __name__ == "__main__":
    main(sys.argv[1:])
