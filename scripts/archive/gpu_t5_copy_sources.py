"""T5 encoder's copy kernels on a GPU: each generated kernel with 'clone' in its name, its source, the compiled
graph lines that call it, and its GPU time launched alone on the inputs a real call gave it (CUDA events, 200 calls).

    PYTHONPATH=. python3 scripts/archive/gpu_t5_copy_sources.py      (the lent GPU)
"""

import torch

import fusion.backend as backend
from fusion.bench.suite_models import MODELS

spec = next(m for m in MODELS if m.name == "t5_encoder") if isinstance(MODELS, list) else MODELS["t5_encoder"]
model, inputs = spec.build("full")
model = model.to("cuda", torch.bfloat16).eval().requires_grad_(False)
inputs = tuple(x.cuda() for x in inputs)
fn = torch.compile(model, backend="fusion")
with torch.no_grad():
    fn(*inputs)
launchers = {}
for r in backend.reports:
    for p in r.parts:
        code = p.graph.code if p.graph is not None else ""
        for k in p.launchers():
            if "clone" in k.__name__:
                launchers.setdefault(k.__name__, []).append(k)
        for line in code.splitlines()[:400]:
            if "clone" in line or "bmm" in line or " mm(" in line:
                print("   ", line.strip()[:200])
seen = {}


def spy_for(name):
    def spy(args):
        seen.setdefault(name, [tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)])

    return spy


for name, ks in launchers.items():
    for k in ks:
        k.spy = spy_for(name)
with torch.no_grad():
    fn(*inputs)
for name, ks in launchers.items():
    for k in ks:
        k.spy = None
    k = ks[0]
    print("=====", name, "launchers:", len(ks), "direct:", k.kind)
    print(k.owner.plan.source.split("@triton.jit")[-1])
    for args in seen.get(name, []):
        print(
            "  inputs:", [(tuple(a.shape), a.stride(), a.dtype, a.storage_offset(), a.data_ptr() % 128) for a in args]
        )
        for _ in range(10):
            k(*args)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(200):
            k(*args)
        e.record()
        torch.cuda.synchronize()
        print(f"  alone: {s.elapsed_time(e) * 1e3 / 200:.2f} us a launch")
