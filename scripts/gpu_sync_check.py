"""Is a compiled step CPU-bound, or blocked? Per model and backend: wall time per step (GPU synchronised), the
process's CPU time per step (time.process_time: what the thread really ran; well below the wall time means it
waited), and every synchronising CUDA call of one step (torch.cuda.set_sync_debug_mode("warn"), with where it came
from).

    PYTHONPATH=. python3 scripts/gpu_sync_check.py llama_train vit_b_16_train --backends=fusion,inductor
    python3 scripts/gpu_sync_check.py --dry-run llama_train        (CPU, tiny shapes: rehearse it)
"""

from __future__ import annotations

import sys
import time
import traceback
import warnings
from collections import Counter

import torch
from suite_steps import fresh_steps, sync

from fusion.bench.suite import SuiteConfig


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    names = [a for a in argv if not a.startswith("--")] or ["llama_train"]
    cfg = SuiteConfig(device="cpu" if dry else "cuda", sizes="tiny" if dry else "full")
    picked = next((a.split("=", 1)[1] for a in argv if a.startswith("--backends=")), "")
    backends = tuple(picked.split(",")) if picked else ("fusion", "inductor")
    print(torch.__version__, "cpu" if dry else torch.cuda.get_device_name(), flush=True)
    for name, label, step in fresh_steps(names, backends, cfg):
        for _ in range(3 if dry else 8):
            step()
        sync()
        n = 3 if dry else 30
        walls, cpus = [], []
        for _ in range(n):
            sync()
            w0, c0 = time.perf_counter(), time.process_time()
            step()
            sync()
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        walls.sort(), cpus.sort()
        print(
            f"\n{name} {label}: wall {walls[n // 2] * 1e3:.2f} ms, CPU {cpus[n // 2] * 1e3:.2f} ms per step", flush=True
        )
        found: Counter = Counter()
        if torch.cuda.is_available():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    step()
                    sync()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            for w in caught:
                if "synchroniz" in str(w.message) and "prototype" not in str(w.message):
                    found[(str(w.message)[:80], f"{w.filename}:{w.lineno}")] += 1
        for (msg, where), c in found.most_common(15):
            print(f"  sync ×{c}: {msg} at {where}")
        if not found:
            print("  no synchronising call in one step" if torch.cuda.is_available() else "  (no CUDA)")
        del step
        torch.cuda.empty_cache() if torch.cuda.is_available() else None


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Exception:
        traceback.print_exc()
        raise
