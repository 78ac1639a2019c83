"""Is a CPU-bound row's wall time the calling thread's own CPU work, or time it waits (GIL, a full launch queue, a
sync, other threads)? Issue 23: the same compiled code timed 3.5-5.5 ms a call in one process.

    PYTHONPATH=. python3 scripts/archive/gpu_probe_cpu_wait.py resnet50 gpt2 [--backends eager,fusion,inductor]   (the GPU)
    python3 scripts/archive/gpu_probe_cpu_wait.py --dry-run resnet18                                           (CPU, tiny)

One process, the suite's own runners (``fusion.bench.suite._runner``), variants interleaved over rounds. Per block of
calls (one sync at its end): wall ms a call; the calling thread's CPU ms a call (``time.thread_time``: the time it
ran, not the time it waited); every other thread's CPU ms a call (``/proc/self/task``); the calling thread's context
switches a call, voluntary (it blocked) and not (it was preempted); the threads alive. Medians over rounds, JSON on
stdout (``RESULT {...}``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time

import torch

from fusion import backend
from fusion.bench.suite import SuiteConfig, _runner, warm_compilers
from fusion.bench.suite_models import MODELS

TICK = os.sysconf("SC_CLK_TCK")


def _threads() -> dict[int, tuple[float, int, int]]:
    """tid -> (CPU seconds, voluntary switches, involuntary switches) of every thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15 of stat)
            vol = invol = 0
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        vol = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        invol = int(line.split()[1])
            out[int(tid)] = (cpu, vol, invol)
        except (OSError, ValueError, IndexError):
            continue
    return out


def block(fn, n: int, sync) -> dict:
    me = threading.get_native_id()
    before, t_cpu, t0 = _threads(), time.thread_time(), time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    wall, cpu, after = time.perf_counter() - t0, time.thread_time() - t_cpu, _threads()
    others = sum(after[t][0] - before.get(t, (0, 0, 0))[0] for t in after if t != me)
    vol = after[me][1] - before[me][1]
    invol = after[me][2] - before[me][2]
    return {
        "wall_ms": wall / n * 1e3,
        "thread_cpu_ms": cpu / n * 1e3,
        "other_threads_cpu_ms": others / n * 1e3,
        "voluntary_switches": vol / n,
        "involuntary_switches": invol / n,
        "threads": len(after),
    }


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    names = [a for a in argv if not a.startswith("--")] or ["resnet50"]
    picked = next((a.split("=", 1)[1] for a in argv if a.startswith("--backends=")), "")
    cfg = SuiteConfig(device="cpu" if dry else "cuda", sizes="tiny" if dry else "full")
    sync = torch.cuda.synchronize if cfg.device == "cuda" else (lambda: None)
    labels = picked.split(",") if picked else ["eager", "fusion", "inductor"]
    print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", flush=True)
    warm_compilers(labels, cfg)
    for name in names:
        spec = MODELS[name]
        model32, inputs32 = spec.build(cfg.sizes)
        backend.reset()
        torch._dynamo.reset()
        fns = {}
        for label in labels:
            fn = _runner(spec, model32, inputs32, cfg, label, cfg.dtype)
            for _ in range(3):
                fn()
            sync()
            fns[label] = fn
        n, rounds = (2, 2) if dry else (50, 5)
        rows: dict[str, list[dict]] = {k: [] for k in fns}
        for _ in range(rounds):
            for label, fn in fns.items():
                rows[label].append(block(fn, n, sync))
        for label, blocks in rows.items():
            med = {k: round(statistics.median(b[k] for b in blocks), 3) for k in blocks[0]}
            med["wall_ms_each_round"] = [round(b["wall_ms"], 3) for b in blocks]
            med["thread_cpu_ms_each_round"] = [round(b["thread_cpu_ms"], 3) for b in blocks]
            print(f"RESULT {json.dumps({'model': name, 'backend': label, **med})}", flush=True)
            print(
                f"{name:>10} {label:>20}  wall {med['wall_ms']:7.3f} ms  own CPU {med['thread_cpu_ms']:7.3f} ms  "
                f"others {med['other_threads_cpu_ms']:6.3f} ms  switches {med['voluntary_switches']:6.1f} vol "
                f"{med['involuntary_switches']:5.2f} invol  threads {med['threads']}  rounds {med['wall_ms_each_round']}",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
