"""A 1x1 convolution as cuDNN runs it and as one cuBLAS GEMM (pass ``conv1x1``, issue 23): CPU per call, GPU time.

    PYTHONPATH=. python3 scripts/archive/gpu_probe_conv1x1.py [--out DIR]      (on the lent GPU; gpu_session.sh part z)

The shapes are the suite's (batch 32, bf16, channels-last): ResNet-50's bottleneck 1x1s and EfficientNet-B0's
expand, project and squeeze-excite 1x1s. Per shape and per spelling (``torch.convolution`` and its
``convolution_backward`` against ``mm`` on the (N·H·W, C) view and the two backward GEMMs):

* CPU µs per call: a batch of 1 at the same channels (the GPU queue never the bottleneck), 200 calls in a loop,
  ``torch.utils.benchmark`` median, loop time / 200;
* GPU µs per call: the full-batch call captured 20 times in one CUDA graph and replayed, timed by CUDA events
  (no CPU in it).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from torch.utils.benchmark import Timer

CALLS = 200
aten = torch.ops.aten
# (name, N, C, H, W, K)
SHAPES = [
    ("resnet50 l1 reduce", 32, 256, 56, 56, 64),
    ("resnet50 l1 expand", 32, 64, 56, 56, 256),
    ("resnet50 l2 expand", 32, 128, 28, 28, 512),
    ("resnet50 l3 reduce", 32, 1024, 14, 14, 256),
    ("resnet50 l4 expand", 32, 512, 7, 7, 2048),
    ("effnet b1 expand", 32, 16, 112, 112, 96),
    ("effnet b2 project", 32, 144, 56, 56, 24),
    ("effnet b5 expand", 32, 112, 14, 14, 672),
    ("effnet SE reduce", 32, 672, 1, 1, 28),
]


def _fns(x, w, dy):
    n, c, h, wd = x.shape
    k = w.shape[0]
    conv_args = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    rows = x.permute(0, 2, 3, 1).reshape(n * h * wd, c)
    w2 = w[:, :, 0, 0]
    g2 = dy.permute(0, 2, 3, 1).reshape(n * h * wd, k)
    return {
        "forward: torch.convolution": lambda: torch.convolution(x, w, None, *conv_args),
        "forward: mm": lambda: torch.mm(rows, w2.t()),
        "backward: convolution_backward": lambda: aten.convolution_backward.default(
            dy, x, w, None, *conv_args, [True, True, False]
        ),
        "backward: two mm": lambda: (torch.mm(g2, w2), torch.mm(g2.t(), rows)),
    }


def _tensors(n, c, h, w, k):
    cl = torch.channels_last
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)  # noqa: E731
    return mk(n, c, h, w), mk(k, c, 1, 1), mk(n, k, h, w)


def cpu_us(fn) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    loop = lambda: [fn() for _ in range(CALLS)]  # noqa: E731
    t = Timer("loop(); torch.cuda.synchronize()", globals={"loop": loop, "torch": torch})
    return t.blocked_autorange(min_run_time=0.3).median / CALLS * 1e6


def gpu_us(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "scripts/results"))
    args = ap.parse_args()
    rows = []
    with torch.no_grad():
        for name, n, c, h, w, k in SHAPES:
            small, full = _fns(*_tensors(1, c, h, w, k)), _fns(*_tensors(n, c, h, w, k))
            for spelling in small:
                row = {
                    "shape": name,
                    "nchw_k": [n, c, h, w, k],
                    "spelling": spelling,
                    "cpu_us": round(cpu_us(small[spelling]), 2),
                    "gpu_us": round(gpu_us(full[spelling]), 2),
                }
                rows.append(row)
                print(f"{name:20s} {spelling:34s} CPU {row['cpu_us']:7.2f} µs  GPU {row['gpu_us']:8.2f} µs", flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_conv1x1.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
