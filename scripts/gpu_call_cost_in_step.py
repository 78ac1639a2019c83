"""Why the same library call costs more CPU inside our compiled step than inside Inductor's: a GEMM's and a kernel
launch's cost measured in the step (cProfile's own time per call) and alone (a loop of the same call), in one
process, before any compile, after ours and after Inductor's; with the Python threads alive at each point.

    PYTHONPATH=. python3 scripts/gpu_call_cost_in_step.py t5_encoder_train        (on the lent GPU)
    python3 scripts/gpu_call_cost_in_step.py --dry-run gpt2_train                 (CPU, tiny shapes: rehearse it)

Earlier (H200, 2026-11-28, scripts/results/h200-2026-11-28-evening-trainprof/cpu_t5.log): in T5's training step
``torch.mm`` took 19 us of own time a call under ``fusion`` against 13.9 under Inductor, ``torch.bmm`` 23.6 against
16.7, the static launcher's ``_launch_kernel`` 11 against 6.4, while torch.profiler gave aten::mm the same self time
in both: the extra is around the op. A thread that wants the GIL when a call releases it would cost that much. Raw
JSON to $OUT/call_cost_<model>.json.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import statistics
import sys
import threading
import time

import torch
from suite_steps import fresh_steps, sync

from fusion.bench.results import save_json
from fusion.bench.suite import SuiteConfig

WATCH = ("{built-in method torch.mm}", "{built-in method torch.bmm}", "{_launch_kernel}",
         "{built-in method torch._C._dynamo.guards._empty_strided_cuda}")  # fmt: skip


def loop_us(device: str, rounds: int = 5, calls: int = 2000) -> dict[str, float]:
    """µs of CPU a call, alone: torch.mm of a (64, 96) by (96, 128) bfloat16 (float32 on CPU), median of rounds."""
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    a, b = torch.randn(64, 96, device=device, dtype=dt), torch.randn(96, 128, device=device, dtype=dt)
    out = {}
    for label, fn in (("mm", lambda: torch.mm(a, b)), ("empty", lambda: torch.empty(64, 128, device=device))):
        ts = []
        for _ in range(rounds):
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            ts.append((time.perf_counter() - t0) / calls * 1e6)
            sync()
        out[label] = statistics.median(ts)
    return out


def in_step(step, steps: int) -> dict[str, dict[str, float]]:
    """cProfile over ``steps`` steps: calls and µs of own time a call of each function in :data:`WATCH`."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    sync()
    stats = pstats.Stats(prof).stats
    out = {}
    for where, (_, nc, tt, _, _) in stats.items():
        key = pstats.func_std_string(where)  # as cProfile prints it: "{built-in method torch.mm}"
        if key in WATCH:
            out[key] = {"calls": nc / steps, "own_us": tt / nc * 1e6}
    return out


def threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate())


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    names = [a for a in argv if not a.startswith("--")] or ["t5_encoder_train"]
    cfg = SuiteConfig(device="cpu" if dry else "cuda", sizes="tiny" if dry else "full")
    row = {"torch": torch.__version__, "device": cfg.device if dry else torch.cuda.get_device_name(),
           "switch_interval_s": sys.getswitchinterval(), "points": []}  # fmt: skip
    row["points"].append({"when": "before any compile", "alone": loop_us(cfg.device), "threads": threads()})
    print(row["points"][-1], flush=True)
    kept = []
    for name, label, step in fresh_steps(names, ("fusion", "inductor"), cfg):
        for _ in range(4):
            step()
        sync()
        kept.append((label, step))
        point = {"when": f"after {name} {label}", "alone": loop_us(cfg.device), "threads": threads(),
                 "in_step": in_step(step, 3 if dry else 10)}  # fmt: skip
        point["alone_after"] = loop_us(cfg.device)
        row["points"].append(point)
        print(json.dumps(point, indent=1), flush=True)
    for label, step in kept:  # both compiled now: each step again, in the same state
        point = {"when": f"both compiled, {label} again", "in_step": in_step(step, 3 if dry else 10)}
        row["points"].append(point)
        print(json.dumps(point, indent=1), flush=True)
    if out := os.environ.get("OUT"):
        save_json(os.path.join(out, f"call_cost_{names[0]}.json"), row, device=cfg.device)


if __name__ == "__main__":
    main(sys.argv[1:])
