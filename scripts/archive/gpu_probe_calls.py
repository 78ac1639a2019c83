"""CPU cost of one library call, by the way it is spelled (issue 23: EfficientNet-B0 is CPU-bound under fusion).

    PYTHONPATH=. python3 scripts/archive/gpu_probe_calls.py [--out DIR]      (on the lent GPU; part of gpu_session.sh a)

A profile of EfficientNet-B0 under backend="fusion" put ~37 µs of CPU on each convolution our compiled graph calls
(``torch.ops.aten.convolution.default``, an OpOverload, as fx writes it) against ~21 µs for Inductor's
``torch.convolution``. Here the same small channels_last bf16 convolutions (a 1x1 and a depthwise 3x3, shapes from
EfficientNet's blocks) are called 200 times in a row through each spelling, under ``no_grad`` and under
``inference_mode``, and the CPU time per call is printed: torch.utils.benchmark, the GPU queue never the bottleneck
(a small batch, ``blocked_autorange`` over the whole loop), µs per call = loop time / 200.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

CALLS = 200


def _spellings(x, w, pad: int, groups: int) -> dict:
    aten = torch.ops.aten
    args = (x, w, None, [1, 1], [pad, pad], [1, 1], False, [0, 0], groups)
    return {
        "aten.convolution.default (OpOverload)": lambda: aten.convolution.default(*args),
        "torch.convolution": lambda: torch.convolution(*args),
        "F.conv2d": lambda: F.conv2d(x, w, None, 1, pad, 1, groups),
        "torch.add (reference)": lambda: torch.add(x, x),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "scripts/results"))
    args = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(1, 96, 28, 28, device=dev, dtype=dt).to(memory_format=torch.channels_last)
    cases = {
        "1x1": (torch.randn(96, 96, 1, 1, device=dev, dtype=dt).to(memory_format=torch.channels_last), 0, 1),
        "depthwise 3x3": (torch.randn(96, 1, 3, 3, device=dev, dtype=dt).to(memory_format=torch.channels_last), 1, 96),
    }
    rows = []
    for case, (w, pad, groups) in cases.items():
        spellings = _spellings(x, w, pad, groups)
        for mode_name, mode in (("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)):
            for name, fn in spellings.items():
                with mode():
                    for _ in range(20):
                        fn()
                    torch.cuda.synchronize()
                    loop = lambda fn=fn: [fn() for _ in range(CALLS)]  # noqa: E731
                    t = Timer("loop(); torch.cuda.synchronize()", globals={"loop": loop, "torch": torch})
                    us = t.blocked_autorange(min_run_time=0.5).median / CALLS * 1e6
                rows.append({"case": case, "mode": mode_name, "spelling": name, "us_per_call": round(us, 2)})
                print(f"{case:14s} {mode_name:15s} {name:40s} {us:7.2f} µs/call", flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_calls.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
