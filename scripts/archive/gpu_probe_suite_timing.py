"""Why does the suite time backend="fusion" on EfficientNet-B0 at ~6 ms a call when a plain loop times it at ~3.6?

    PYTHONPATH=. python3 scripts/archive/gpu_probe_suite_timing.py [--model efficientnet_b0] [--out DIR]   (on the GPU)

One process, the suite's own runners (fusion.bench.suite._runner), each number the mean/median per call:
1. fusion alone: a plain loop of 30 calls with one sync at the end; then Phase 4's time_variants (the suite's timer);
2. the same after Inductor has compiled the same model class in this process (a second Dynamo cache entry);
3. time_variants over {eager, fusion, inductor} interleaved, as the suite does.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from fusion import benchmark
from fusion.bench.suite import SuiteConfig, _runner
from fusion.bench.suite_models import MODELS


def loop_ms(fn, n: int = 30) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e3


def suite_ms(fns: dict) -> dict:
    t = benchmark.time_variants(fns, rounds=3, min_run_time=0.3, warmup=3, sync=torch.cuda.synchronize,
                                threads=torch.get_num_threads())  # fmt: skip
    return {k: round(v.median_s * 1e3, 3) for k, v in t.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="efficientnet_b0")
    ap.add_argument("--out", default=os.environ.get("OUT", "scripts/results"))
    args = ap.parse_args()
    cfg = SuiteConfig(device="cuda", sizes="full")
    spec = MODELS[args.model]
    model32, inputs32 = spec.build(cfg.sizes)
    rows = {}
    fusion = _runner(spec, model32, inputs32, cfg, "fusion", cfg.dtype)
    rows["1 fusion alone: loop"] = round(loop_ms(fusion), 3)
    rows["1 fusion alone: time_variants"] = suite_ms({"fusion": fusion})["fusion"]
    inductor = _runner(spec, model32, inputs32, cfg, "inductor", cfg.dtype)
    rows["2 inductor: loop"] = round(loop_ms(inductor), 3)
    rows["2 fusion after inductor compiled: loop"] = round(loop_ms(fusion), 3)
    eager = _runner(spec, model32, inputs32, cfg, "eager", cfg.dtype)
    for k, v in suite_ms({"eager": eager, "fusion": fusion, "inductor": inductor}).items():
        rows[f"3 interleaved time_variants: {k}"] = v
    rows["4 fusion: loop again"] = round(loop_ms(fusion), 3)
    for k, v in rows.items():
        print(f"{k:45s} {v:8.3f} ms", flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": args.model}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_suite_timing.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
