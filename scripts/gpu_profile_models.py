"""Where backend="fusion" loses on a model: the top GPU kernels per call (torch.profiler) of eager and of the
backend, and the library calls the backend left outside its generated kernels (issue 23's "why").

    PYTHONPATH=. python3 scripts/gpu_profile_models.py bert vit_b_16      (on the lent GPU; full suite sizes)
"""

from __future__ import annotations

import sys
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from fusion import backend
from fusion.bench.suite_models import MODELS


def top_kernels(fn, inputs, n: int = 8) -> tuple[float, list[tuple[str, float, int]]]:
    with torch.no_grad():
        for _ in range(3):
            fn(*inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn(*inputs)
            torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 5, e.count // 5) for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return sum(r[1] for r in rows), rows[:n]


def main() -> None:
    for name in sys.argv[1:] or ["bert", "vit_b_16"]:
        spec = MODELS[name]
        model, inputs = spec.build("full")  # as the suite runs it: bf16, channels_last images
        model = model.cuda().bfloat16().eval()
        inputs = tuple(t.cuda().bfloat16() if t.is_floating_point() else t.cuda() for t in inputs)
        if spec.image:
            model = model.to(memory_format=torch.channels_last)
            inputs = tuple(t.to(memory_format=torch.channels_last) for t in inputs)
        backend.reset()
        torch._dynamo.reset()
        ours = torch.compile(model, backend="fusion")
        for label, fn in (("eager", model), ("fusion", ours)):
            total, rows = top_kernels(fn, inputs)
            print(f"\n{name} {label}: {total / 1e3:.2f} ms of GPU kernels per call")
            for key, us, count in rows:
                print(f"  {us:8.1f} µs  ×{count:<4d} {key[:110]}")
        calls = Counter()
        for r in backend.reports:
            for p in r.parts:
                calls.update(p.library_calls)
        print(f"{name} fusion: library calls outside generated kernels: {dict(calls.most_common(14))}")


if __name__ == "__main__":
    main()
