"""Triton launch cost probe: CPU µs per launch through the JIT dispatch vs the compiled kernel's own launcher.

PYTHONPATH=. python3 scripts/archive/gpu_probe_launch.py      (on the lent GPU)
"""

import inspect
import time

import torch
import triton
import triton.language as tl

print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())


@triton.jit
def add(x_ptr, y_ptr, o_ptr, XBLOCK: tl.constexpr):
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    m = i < 1000
    tl.store(o_ptr + i, tl.load(x_ptr + i, m) + tl.load(y_ptr + i, m), m)


x = torch.randn(1000, device="cuda")
y = torch.randn_like(x)
o = torch.empty_like(x)
k = add[(1,)](x, y, o, XBLOCK=1024, num_warps=4)
torch.cuda.synchronize()
print("compiled kernel type", type(k), "run attr", type(k.run))
try:
    print("run signature", inspect.signature(k.run))
except Exception as e:
    print("no signature", e)
print("packed_metadata" in dir(k), "function" in dir(k))
o.zero_()
stream = torch.cuda.current_stream().cuda_stream
ok = None
for args in ((x, y, o, 1024), (x, y, o)):
    try:
        k.run(1, 1, 1, stream, k.function, k.packed_metadata, None, None, None, *args)
        torch.cuda.synchronize()
        ok = args
        print("direct run OK with", len(args), "args; correct:", torch.allclose(o, x + y))
        break
    except Exception as e:
        print("direct run failed with", len(args), "args:", type(e).__name__, e)
N = 2000
for name, fn in (
    ("jit", lambda: add[(1,)](x, y, o, XBLOCK=1024, num_warps=4)),
    (
        "direct",
        lambda: k.run(
            1, 1, 1, torch.cuda.current_stream().cuda_stream, k.function, k.packed_metadata, None, None, None, *ok
        ),
    ),
):
    if name == "direct" and ok is None:
        continue
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(N):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"{name}: {(t1 - t) / N * 1e6:.1f} us CPU per launch")
