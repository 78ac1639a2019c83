"""The 8M-float chain's C kernel alone, into an output already mapped, against copy_ and clone (2 threads).

Run: OMP_NUM_THREADS=2 uv run python scripts/results/cpu-2026-11-28-intel/renderer/kernel_into_mapped.py
"""

import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from fusion import models  # noqa: E402
from fusion.codegen import compile_regions  # noqa: E402


def timed_ms(fn, n: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


torch.set_num_threads(2)
model = models.ElementwiseChain(d=1024).eval()
x = torch.randn(8 * 1024, 1024)
compiled = compile_regions(model, [x])
compiled(x)
launchers = compiled.compiled.launchers
print(len(launchers), [launcher.kind for launcher in launchers])
kernel = launchers[0].direct
out, dst = torch.empty_like(x), torch.empty_like(x)
nargs = len(kernel.fn.argtypes) - 1
print("nargs", nargs)
buffers = [x] + [out] * (nargs - 1)
print(f"kernel into mapped out: {timed_ms(lambda: kernel.fn(*[b.data_ptr() for b in buffers], 2)):.2f} ms")
print(f"copy_ into mapped: {timed_ms(lambda: dst.copy_(x)):.2f} ms")
print(f"clone: {timed_ms(lambda: x.clone()):.2f} ms")
print(f"compiled call: {timed_ms(lambda: compiled(x)):.2f} ms")
print(f"eager: {timed_ms(lambda: model(x)):.2f} ms")
