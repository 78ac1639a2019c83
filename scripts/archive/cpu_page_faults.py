"""A CPU model's time and minor page faults a call: eager, backend="fusion", fusion without its memory passes
(options channels_last=False, reuse_buffers=False) and Inductor, interleaved in one process (one thread).

Run it:   OMP_NUM_THREADS=1 uv run python scripts/archive/cpu_page_faults.py mobilenet_v2
Output of 2026-11-27: scripts/results/cpu-2026-11-27-page-faults.log
"""

import copy
import resource
import statistics
import sys
import time

import torch
import torchvision

import fusion.backend  # noqa: F401  (registers backend="fusion")


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> None:
    torch.set_num_threads(1)
    name = sys.argv[1]
    model = getattr(torchvision.models, name)().eval()
    x = torch.randn(1, 3, 224, 224)
    off = {"reuse_buffers": False, "channels_last": False}
    with torch.no_grad():
        ref = model(x)
        fns = {
            "eager": model,
            "fusion": torch.compile(model, backend="fusion"),
            "before": torch.compile(copy.deepcopy(model), backend="fusion", options=off),
            "inductor": torch.compile(model, backend="inductor"),
        }
        for fn in fns.values():
            torch.testing.assert_close(fn(x), ref, rtol=1e-4, atol=1e-4)
            fn(x)
        res = {k: [] for k in fns}
        for _ in range(5):
            for k, fn in fns.items():
                f0, t0 = faults(), time.perf_counter()
                for _ in range(3):
                    fn(x)
                res[k].append(((time.perf_counter() - t0) / 3, (faults() - f0) / 3))
    base = statistics.median(t for t, _ in res["eager"])
    cells = []
    for k, v in res.items():
        t, f = statistics.median(t for t, _ in v), statistics.median(f for _, f in v)
        cells.append(f"{k} {t * 1e3:.2f}ms {base / t:.2f}x {f:.0f}f")
    print(name, "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
