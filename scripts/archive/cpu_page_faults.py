"""A CPU model's time and minor page faults a call: eager, backend="fusion", fusion without its memory passes
(options channels_last=False, reuse_buffers=False) and Inductor, interleaved in one process (one thread).

Run it:   OMP_NUM_THREADS=1 uv run python scripts/archive/cpu_page_faults.py mobilenet_v2
Output of 2026-11-27: scripts/results/cpu-2026-11-27-page-faults.log
"""

import torch, torchvision, sys, time, resource, copy
import fusion.backend
torch.set_num_threads(1)
name = sys.argv[1]
m = getattr(torchvision.models,name)().eval()
x = torch.randn(1,3,224,224)
def flt(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
with torch.no_grad():
    ref = m(x)
    fs = {"eager": m, "fusion": torch.compile(m, backend="fusion"),
          "before": torch.compile(copy.deepcopy(m), backend="fusion", options={"reuse_buffers": False, "channels_last": False}),
          "inductor": torch.compile(m, backend="inductor")}
    for k, f in fs.items():
        out = f(x); f(x)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    res = {k: [] for k in fs}
    for r in range(5):
        for k, f in fs.items():
            a = flt(); t = time.perf_counter()
            for _ in range(3): f(x)
            res[k].append(((time.perf_counter() - t) / 3, (flt() - a) / 3))
    import statistics
    b = statistics.median(t for t, _ in res["eager"])
    print(name, "  ".join(f"{k} {statistics.median(t for t,_ in v)*1e3:.2f}ms {b/statistics.median(t for t,_ in v):.2f}x {statistics.median(f for _,f in v):.0f}f" for k, v in res.items()), flush=True)
