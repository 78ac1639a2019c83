# The 8M-float chain's C kernel alone, into an output already mapped, against copy_ and clone (2 threads).
# Run: OMP_NUM_THREADS=2 uv run python scripts/results/cpu-2026-11-28-intel/renderer/kernel_into_mapped.py
import sys, torch, time, statistics as st
sys.path.insert(0, ".")
from fusion import models
from fusion.codegen import compile_regions
torch.set_num_threads(2)
m = models.ElementwiseChain(d=1024).eval()
x = torch.randn(8 * 1024 * 1024 // 1024, 1024)
import inspect
c = compile_regions(m, [x]); r = c(x)
ls = c.compiled.launchers
print(len(ls), [l.kind for l in ls])
ck = ls[0].direct
out = torch.empty_like(x); y = torch.empty_like(x)
ins = [x]  # check arity
nargs = len(ck.fn.argtypes) - 1
print("nargs", nargs)
def tm(f, n=30):
    for _ in range(3): f()
    ts=[]
    for _ in range(n):
        t0=time.perf_counter(); f(); ts.append(time.perf_counter()-t0)
    return st.median(ts)*1e3
bufs = [x] + [out] * (nargs - 1)
print("kernel into mapped out: %.2f ms" % tm(lambda: ck.fn(*[b.data_ptr() for b in bufs], 2)))
print("copy_ into mapped: %.2f ms" % tm(lambda: y.copy_(x)))
print("clone: %.2f ms" % tm(lambda: x.clone()))
print("compiled call: %.2f ms" % tm(lambda: c(x)))
print("eager: %.2f ms" % tm(lambda: m(x)))
