"""Where a compiled call's CPU time goes (issue 23: backend="fusion" is CPU-bound where Inductor is not).

    PYTHONPATH=. python3 scripts/gpu_profile_cpu.py resnet50 bert      (on the lent GPU; full suite sizes)

Per model and backend (fusion, inductor): wall time per call with the GPU synchronised, the CPU time of the call
alone (no sync: how long Python takes to enqueue the work), and cProfile's top functions by own time.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import torch

from fusion import backend
from fusion.bench.suite_models import MODELS


def main() -> None:
    print(torch.__version__, torch.cuda.get_device_name())
    for name in sys.argv[1:] or ["resnet50"]:
        spec = MODELS[name]
        model, inputs = spec.build("full")
        model = model.cuda().bfloat16().eval()
        inputs = tuple(t.cuda().bfloat16() if t.is_floating_point() else t.cuda() for t in inputs)
        if spec.image:
            model = model.to(memory_format=torch.channels_last)
            inputs = tuple(t.to(memory_format=torch.channels_last) for t in inputs)
        for label in ("fusion", "inductor"):
            backend.reset()
            torch._dynamo.reset()
            f = torch.compile(model, backend=label)
            with torch.no_grad():
                for _ in range(3):
                    f(*inputs)
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(20):
                    f(*inputs)
                cpu = (time.perf_counter() - start) / 20
                torch.cuda.synchronize()
                wall = (time.perf_counter() - start) / 20
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(10):
                    f(*inputs)
                prof.disable()
                torch.cuda.synchronize()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
            print(f"\n===== {name} {label}: {wall * 1e3:.2f} ms per call, {cpu * 1e3:.2f} ms of it to enqueue (CPU)")
            if label == "fusion":
                kernels = sum(len(p.launchers()) for r in backend.reports for p in r.parts)
                print(f"generated kernels per call: {kernels}")
            print("\n".join(out.getvalue().splitlines()[4:34]))


if __name__ == "__main__":
    main()
