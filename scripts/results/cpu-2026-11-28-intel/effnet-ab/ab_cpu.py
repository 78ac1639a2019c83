# One model, backends interleaved in one process: rounds of 5 calls each, medians (2 threads).
# Run: OMP_NUM_THREADS=2 PYTHONPATH=. uv run python scripts/results/cpu-2026-11-28-intel/effnet-ab/ab_cpu.py efficientnet_b0 fusion,inductor 15
import sys, time, torch, statistics as st
from fusion import backend
from fusion.bench.suite import MODELS, SuiteConfig, _runner
torch.set_num_threads(2)
name, backs = sys.argv[1], sys.argv[2].split(",")
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 15
spec = MODELS[name]
calls = {}
for b in backs:
    torch._dynamo.reset()
    m, x = spec.build("cpu")
    calls[b] = _runner(spec, m, x, SuiteConfig("cpu", "cpu"), b, torch.float32)
    for _ in range(5): calls[b]()
ts = {b: [] for b in calls}
for r in range(rounds):
    for b, c in calls.items():
        n = 5
        t0 = time.perf_counter()
        for _ in range(n): c()
        ts[b].append((time.perf_counter() - t0) / n)
base = st.median(ts[backs[-1]])
print(name, "  ".join(f"{b} {st.median(ts[b])*1e3:.3f} ms ({base/st.median(ts[b]):.3f} of {backs[-1]})" for b in backs))
