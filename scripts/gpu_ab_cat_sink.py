"""Pass ``reorder`` moving a ``cat`` next to its first reader, before and after, in one process per model (a model's
variants interleaved): ``fusion`` as it was (a cat stayed where it was computed) against ``fusion`` now and Inductor.

    PYTHONPATH=. python3 scripts/gpu_ab_cat_sink.py llama,mistral,llama_train   (on the lent GPU)
    python3 scripts/gpu_ab_cat_sink.py --dry-run llama                          (CPU, tiny shapes: rehearse it)
    ... --profile                  (then each variant's top kernels by device time, torch.profiler, 10 calls)

The change moves Llama's rotate_half cat beside q * cos + rotate_half(q) * sin (29 -> 21 kernels a call on the CPU
suite's Llama); this measures what it does on a GPU. Median ms per call (torch.utils.benchmark via the suite's
interleaved timer); raw JSON to $OUT/ab_cat_sink.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from fusion import backend  # noqa: F401  (registers backend="fusion")
from fusion.bench.suite import MODELS, SuiteConfig, _runner
from fusion.compiler import graph_passes


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    names = [a for a in argv if not a.startswith("--")]
    names = names[0].split(",") if names else ["llama"]
    cfg = SuiteConfig("cpu" if dry else "cuda", "tiny" if dry else "full")
    now = graph_passes.cheap_and_pure

    def before(node):  # the rule as it was: a cat is not moved
        return node.target is not torch.ops.aten.cat.default and now(node)

    sync = (lambda: None) if dry else torch.cuda.synchronize
    rows = []
    for name in names:
        spec = MODELS[name]
        calls = {}
        for label, which, rule in (("fusion_before", "fusion", before), ("fusion", "fusion", now),
                                     ("inductor", "inductor", now)):  # fmt: skip
            torch._dynamo.reset()
            graph_passes.cheap_and_pure = rule
            try:
                model, inputs = spec.build(cfg.sizes)
                dtype = torch.float32 if dry else torch.bfloat16
                calls[label] = _runner(spec, model, inputs, cfg, which, dtype)
                for _ in range(3):
                    calls[label]()
                sync()
            finally:
                graph_passes.cheap_and_pure = now
        from torch.utils.benchmark import Timer

        times = {k: [] for k in calls}
        for _ in range(3 if dry else 15):
            for label, fn in calls.items():
                sync()
                m = Timer("fn(); sync()", globals={"fn": fn, "sync": sync}).blocked_autorange(
                    min_run_time=0.05 if dry else 0.3
                )
                times[label].append(m.median * 1e3)
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        if "--profile" in argv:
            for label, fn in calls.items():
                if label != "inductor":
                    profile_top(label, fn, sync, dry)
        rows.append({"model": name, "ms": med, "all_ms": times})
        print(f"{name:12} " + "  ".join(f"{k} {v:.3f} ms ({med['inductor'] / v:.3f} of Inductor)" for k, v in med.items()),
              flush=True)  # fmt: skip
    meta = {"torch": torch.__version__, "device": "cpu" if dry else torch.cuda.get_device_name()}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "ab_cat_sink.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


def profile_top(label: str, fn, sync, dry: bool, top: int = 14) -> None:
    """The kernels of 10 calls of ``fn`` by device time (CPU time in a dry run): µs a call, launches a call."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] if dry else [ProfilerActivity.CUDA]
    with profile(activities=acts) as prof:
        for _ in range(10):
            fn()
        sync()
    events = [e for e in prof.key_averages() if (e.self_cpu_time_total if dry else e.self_device_time_total) > 0]
    key = (lambda e: e.self_cpu_time_total) if dry else (lambda e: e.self_device_time_total)
    total = sum(key(e) for e in events) / 10
    print(f"  {label}: {total:.1f} us of kernels a call, {sum(e.count for e in events) // 10} launches a call")
    for e in sorted(events, key=key, reverse=True)[:top]:
        print(f"    {key(e) / 10:8.1f} us x{e.count // 10:<3} {e.key[:100]}")


if __name__ == "__main__":
    main(sys.argv[1:])
