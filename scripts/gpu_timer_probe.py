"""Does the suite's timer measure every backend alike? One model's compiled calls timed several ways in one process.

    PYTHONPATH=. python3 scripts/gpu_timer_probe.py efficientnet_b0 [--suite] [--backends=eager,fusion,inductor]
    python3 scripts/gpu_timer_probe.py --dry-run resnet18 [--suite]                       (CPU, tiny: rehearse it)

``--suite``: inside the suite's own process (``run_suite``: the float64 reference, the accuracy calls), just before
its timer runs and after the suite; without it, functions compiled here, outside the suite.

The suite times a backend with ``torch.utils.benchmark.Timer.blocked_autorange(min_run_time=0.04)`` under a clock
that synchronises: the Timer first grows its block (1, 10, 100 calls...) until one block is long against two clock
reads or longer than ``min_run_time``, so a backend near 4 ms a call gets blocks of 100 calls where a slower one
gets 10, and ``timeit`` turns Python's collector off for each block. On EfficientNet-B0 the suite measured
``fusion`` at 0.66 of Inductor's speed in six processes, while a plain loop over the same compiled functions in the
same processes measured it faster than Inductor. Per backend, ms a call by:
- ``autorange``: the suite's way (the block size it picked is printed);
- ``Timer n=10`` and ``Timer n=100``: fixed blocks, the collector off as ``timeit`` runs them;
- ``n=100 gc on``: the same blocks with the collector on (``timeit``'s ``setup="gc.enable()"``);
- ``loop of 10`` and ``loop of 100``: plain loops between two synchronisations (the collector as it is);
- ``synchronised``: one call between two synchronisations (the median of 10).
In 5 interleaved rounds (every way and every backend, then the next round); medians. Raw JSON to
$OUT/timer_probe_<model>.json.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

import torch
import torch.utils.benchmark as tbench

from fusion import backend  # noqa: F401  (registers backend="fusion")
from fusion.bench.results import save_json
from fusion.bench.suite import SuiteConfig, _runner
from fusion.bench.suite_models import MODELS


def probe(fns: dict, sync, dry: bool, title: str) -> dict:
    """Every way below, 5 interleaved rounds (every way and every backend, then the next round): medians, ms a call."""

    def clock() -> float:
        sync()
        return time.perf_counter()

    threads = torch.get_num_threads()

    def timer(fn, setup: str = "pass") -> tbench.Timer:
        return tbench.Timer(stmt="fn()", setup=setup, globals={"fn": fn, "gc": gc}, timer=clock, num_threads=threads)

    def loop(fn, n: int) -> float:
        t0 = clock()
        for _ in range(n):
            fn()
        return (clock() - t0) / n

    small = 1 if dry else 10
    ways = {
        "autorange": lambda fn: timer(fn).blocked_autorange(min_run_time=0.04),
        f"Timer n={small}": lambda fn: timer(fn).timeit(small),
        f"Timer n={10 * small}": lambda fn: timer(fn).timeit(10 * small),
        f"n={10 * small} gc on": lambda fn: timer(fn, "gc.enable()").timeit(10 * small),
        f"loop of {small}": lambda fn: loop(fn, small),
        f"loop of {10 * small}": lambda fn: loop(fn, 10 * small),
        "synchronised": lambda fn: statistics.median(loop(fn, 1) for _ in range(small)),
    }
    per = {way: {label: [] for label in fns} for way in ways}
    blocks: dict = {}
    for _ in range(3 if dry else 5):
        for way, how in ways.items():
            for label, fn in fns.items():
                m = how(fn)
                if isinstance(m, float):
                    per[way][label].append(m)
                else:
                    per[way][label].append(m.median)
                    if way == "autorange":
                        blocks.setdefault(label, set()).add(m.number_per_run)
    results = {way: {label: statistics.median(ts) * 1e3 for label, ts in d.items()} for way, d in per.items()}
    print(f"\n{title}")
    for way, row in results.items():
        print(f"  {way:16s} " + "   ".join(f"{label} {ms:7.3f}" for label, ms in row.items()), flush=True)
    print("  calls a block under autorange:", {k: sorted(v) for k, v in blocks.items()})
    print("  collector:", gc.isenabled(), gc.get_count(), "objects", len(gc.get_objects()))
    return {"ms": results, "autorange_block": {k: sorted(v) for k, v in blocks.items()}}


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    name = next((a for a in argv if not a.startswith("--")), "efficientnet_b0")
    picked = next((a.split("=", 1)[1] for a in argv if a.startswith("--backends=")), "eager,fusion,inductor")
    cfg = SuiteConfig(device="cpu" if dry else "cuda", sizes="tiny" if dry else "full")
    cuda = cfg.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    found: dict = {"model": name}
    if "--suite" in argv:  # inside the suite's own process: just before its timer runs, and after the suite
        from gpu_suite_probe import suite_keeping

        def before(fns, sync_):
            found["before"] = probe(fns, sync_, dry, "inside the suite, just before its timer:")

        found["suite"], fns, _ = suite_keeping(name, picked.split(","), dry, before)
        found["after"] = probe(fns, sync, dry, "after the suite, the same functions:")
    else:
        torch.backends.cudnn.benchmark = cuda
        spec = MODELS[name]
        model32, inputs32 = spec.build(cfg.sizes)
        fns = {}
        for label in picked.split(","):
            fns[label] = fn = _runner(spec, model32, inputs32, cfg, label, cfg.dtype)
            for _ in range(5):
                fn()
        sync()
        found["fresh"] = probe(fns, sync, dry, "compiled here, outside the suite:")
    out = os.environ.get("OUT")
    if out:
        save_json(os.path.join(out, f"timer_probe_{name}.json"), found, device=cfg.device)


if __name__ == "__main__":
    main(sys.argv[1:])
