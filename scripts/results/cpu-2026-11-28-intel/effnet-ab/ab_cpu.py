"""One model of the CPU suite, backends interleaved in one process: rounds of 5 calls each, medians (2 threads).

Run: OMP_NUM_THREADS=2 PYTHONPATH=. uv run python scripts/results/cpu-2026-11-28-intel/effnet-ab/ab_cpu.py \
         efficientnet_b0 fusion,inductor 15
"""

import statistics
import sys
import time

import torch

from fusion import backend  # noqa: F401  (registers backend="fusion")
from fusion.bench.suite import MODELS, SuiteConfig, _runner

torch.set_num_threads(2)
name, backends = sys.argv[1], sys.argv[2].split(",")
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 15
spec = MODELS[name]
calls = {}
for b in backends:
    torch._dynamo.reset()
    model, inputs = spec.build("cpu")
    calls[b] = _runner(spec, model, inputs, SuiteConfig("cpu", "cpu"), b, torch.float32)
    for _ in range(5):
        calls[b]()
times = {b: [] for b in calls}
for _ in range(rounds):
    for b, call in calls.items():
        t0 = time.perf_counter()
        for _ in range(5):
            call()
        times[b].append((time.perf_counter() - t0) / 5)
base = statistics.median(times[backends[-1]])
print(name, "  ".join(f"{b} {statistics.median(times[b]) * 1e3:.3f} ms "
                      f"({base / statistics.median(times[b]):.3f} of {backends[-1]})" for b in backends))  # fmt: skip
