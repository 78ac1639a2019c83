"""Eager CPU convolution nets with only the input made channels-last against NCHW, interleaved (one thread, batch 1):
what pass channels_last (fusion/compiler/layout.py) decides from. Run it: OMP_NUM_THREADS=1 uv run python scripts/archive/cpu_channels_last_eager.py resnet18,mobilenet_v2
Output of 2026-11-27: scripts/results/cpu-2026-11-27-channels-last-eager.log
"""
import torch, torchvision, time, sys, statistics
torch.set_num_threads(1)
for name in sys.argv[1].split(","):
    m = getattr(torchvision.models,name)().eval()
    x = torch.randn(1,3,224,224); xc = x.to(memory_format=torch.channels_last)
    res = {"nchw": [], "cl": []}
    with torch.no_grad():
        for _ in range(2): m(x); m(xc)
        for r in range(5):
            for k, a in (("nchw", x), ("cl", xc)):
                ts=[]
                for _ in range(3):
                    s=time.perf_counter(); m(a); ts.append(time.perf_counter()-s)
                res[k].append(min(ts))
    a, b = statistics.median(res["nchw"]), statistics.median(res["cl"])
    print(f"{name} nchw {a*1e3:.1f} cl {b*1e3:.1f} speedup {a/b:.2f}", flush=True)
