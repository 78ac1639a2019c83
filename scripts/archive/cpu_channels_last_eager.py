"""Eager CPU convolution nets with only the input made channels-last against NCHW, interleaved (one thread, batch 1):
what pass channels_last (fusion/compiler/layout.py) decides from.

Run it:   OMP_NUM_THREADS=1 uv run python scripts/archive/cpu_channels_last_eager.py resnet18,mobilenet_v2
Output of 2026-11-27: scripts/results/cpu-2026-11-27-channels-last-eager.log
"""

import statistics
import sys
import time

import torch
import torchvision


def best_of(fn, x, calls: int = 3) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    torch.set_num_threads(1)
    for name in sys.argv[1].split(","):
        model = getattr(torchvision.models, name)().eval()
        x = torch.randn(1, 3, 224, 224)
        inputs = {"nchw": x, "cl": x.to(memory_format=torch.channels_last)}
        res = {k: [] for k in inputs}
        with torch.no_grad():
            for a in inputs.values():
                model(a)
                model(a)
            for _ in range(5):
                for k, a in inputs.items():
                    res[k].append(best_of(model, a))
        a, b = statistics.median(res["nchw"]), statistics.median(res["cl"])
        print(f"{name} nchw {a * 1e3:.1f} cl {b * 1e3:.1f} speedup {a / b:.2f}", flush=True)


if __name__ == "__main__":
    main()
