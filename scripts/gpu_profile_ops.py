"""Which ops a call spends its CPU time on, per backend (issue 23: the training step is CPU-bound).

    PYTHONPATH=. python3 scripts/gpu_profile_ops.py resnet50_train --backends=eager,fusion   (the lent GPU)
    python3 scripts/gpu_profile_ops.py --dry-run resnet18                                     (CPU, tiny shapes)

torch.profiler's CPU events of a few calls, as the suite runs them (``fusion.bench.suite._runner``), grouped by name:
per call, how often each op (aten op, autograd node, our launchers' Python frames are not events) runs and its CPU
time, self (the op alone) and total (with what it calls). The top rows of each backend side by side show where one
spends CPU the other does not.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from fusion import backend
from fusion.bench.results import save_json
from fusion.bench.suite import SuiteConfig, _runner
from fusion.bench.suite_models import MODELS


def op_table(step, n: int) -> list[dict]:
    """Per op name: calls, self and total CPU µs per call of ``step``, over ``n`` profiled calls."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    rows = [
        {"op": e.key[:90], "calls": e.count / n, "self_us": e.self_cpu_time_total / n, "total_us": e.cpu_time_total / n}
        for e in prof.key_averages()
    ]
    return sorted(rows, key=lambda r: -r["self_us"])


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    names = [a for a in argv if not a.startswith("--")] or ["resnet50_train"]
    picked = next((a.split("=", 1)[1] for a in argv if a.startswith("--backends=")), "")
    backends = picked.split(",") if picked else ["eager", "fusion"]
    cfg = SuiteConfig(device="cpu" if dry else "cuda", sizes="tiny" if dry else "full")
    torch.backends.cudnn.benchmark = "--cudnn-benchmark" in argv  # as the suite runs (its algorithms timed once)
    results = {}
    for name in names:
        spec = MODELS[name]
        model32, inputs32 = spec.build(cfg.sizes)
        for label in backends:
            backend.reset()
            step = _runner(spec, model32, inputs32, cfg, label, cfg.dtype)
            for _ in range(3 if dry else 8):
                step()
            rows = op_table(step, 2 if dry else 10)
            results[f"{name}/{label}"] = rows
            self_total = sum(r["self_us"] for r in rows)
            print(f"\n===== {name} {label}: {self_total / 1e3:.2f} ms of CPU self time per call in profiled ops")
            print(f"  {'calls':>6} {'self µs':>9} {'total µs':>9}  op")
            for r in rows[:28]:
                print(f"  {r['calls']:6.0f} {r['self_us']:9.0f} {r['total_us']:9.0f}  {r['op']}")
            del step
    out = os.environ.get("OUT")
    if out:
        save_json(os.path.join(out, "profile_ops.json"), {"rows": results}, device=cfg.device)


if __name__ == "__main__":
    main(sys.argv[1:])
