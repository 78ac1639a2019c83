"""One model, several variants of a backend, timed in one process (interleaved rounds): the A/B of a change.

    PYTHONPATH=. python3 scripts/gpu_ab.py t5_encoder_train fusion inductor \\
        combo_op=fusion@fusion.compiler.bindings.COMBO_CALLS=False no_combo=fusion+no-combo_casts   (the lent GPU)
    python3 scripts/gpu_ab.py --dry-run gpt2_train fusion inductor                                 (CPU, tiny shapes)
    python3 scripts/gpu_ab.py --cpu llama fusion copies=fusion@fusion.compiler.copy_kernels.ON_CPU=True  (CPU suite)

A variant is ``label=backend`` (a backend of the suite: ``fusion``, ``inductor``, ``fusion+no-<pass>``...), or a
backend alone (its own label), optionally followed by ``@module.ATTR=value`` settings (a Python literal), set while
the variant compiles and warms up (a module flag read at compile time: an A/B switch), restored after. Per variant:
the median seconds a call or step (``fusion.benchmark.time_variants``: every variant in turn, synchronised, 15
rounds), the CPU seconds of one call alone (not synchronised: what a CPU-bound step waits on), its ratio to the first
variant. Raw JSON to $OUT/ab_<model>.json.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import statistics
import sys
import time

import torch

from fusion import backend  # noqa: F401  (registers backend="fusion")
from fusion.bench.results import save_json
from fusion.bench.suite import MODELS, SuiteConfig, _runner
from fusion.benchmark import time_variants


def parse(variant: str) -> tuple[str, str, list[tuple[str, str, object]]]:
    """``label=backend@mod.ATTR=value@...`` -> (label, backend, [(module, attribute, value)])."""
    head, *settings = variant.split("@")
    label, _, which = head.partition("=") if "=" in head else (head, "", head)
    sets = []
    for s in settings:
        target, _, value = s.partition("=")
        module, _, attr = target.rpartition(".")
        sets.append((module, attr, ast.literal_eval(value)))
    return label, which, sets


@contextlib.contextmanager
def settings(sets: list[tuple[str, str, object]]):
    old = []
    try:
        for module, attr, value in sets:
            mod = importlib.import_module(module)
            if not hasattr(mod, attr):
                raise AttributeError(f"{module} has no {attr}. Fix: name a module-level flag")
            old.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, value)
        yield
    finally:
        for mod, attr, value in reversed(old):
            setattr(mod, attr, value)


def warm_step(spec, cfg: SuiteConfig, which: str, sync) -> object:
    """The suite's call or training step of ``spec`` under backend ``which`` (bfloat16 on a GPU, float32 on the CPU's
    rehearsal), compiled and called three times."""
    torch.manual_seed(0)
    model, inputs = spec.build(cfg.sizes)
    step = _runner(spec, model, inputs, cfg, which, torch.float32 if cfg.device == "cpu" else torch.bfloat16)
    for _ in range(3):
        step()
    sync()
    return step


def main(argv: list[str]) -> None:
    dry, cpu_sizes = "--dry-run" in argv, "--cpu" in argv
    name, *variants = [a for a in argv if not a.startswith("--")]
    cfg = SuiteConfig("cpu", "cpu") if cpu_sizes else SuiteConfig("cpu" if dry else "cuda", "tiny" if dry else "full")
    sync = (lambda: None) if dry or cpu_sizes else torch.cuda.synchronize
    spec = MODELS[name]
    calls, meta = {}, {}
    for variant in variants:
        label, which, sets = parse(variant)
        torch._dynamo.reset()
        with settings(sets):
            calls[label] = warm_step(spec, cfg, which, sync)
        meta[label] = {"backend": which, "settings": [f"{m}.{a}={v!r}" for m, a, v in sets]}
    timings = time_variants(calls, rounds=3 if dry else 15, min_run_time=0.05 if dry else 0.3, sync=sync)
    cpu = {}
    for label, fn in calls.items():  # one call alone, not synchronised: the CPU's part of it
        ts = []
        for _ in range(3 if dry else 15):
            sync()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
            sync()
        cpu[label] = statistics.median(ts)
    first = next(iter(timings))
    row = {"model": name, "device": "cpu" if dry or cpu_sizes else torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "variants": {}}  # fmt: skip
    for label, t in timings.items():
        row["variants"][label] = {**meta[label], "median_s": t.median_s, "times_s": list(t.times_s),
                                  "cpu_s": cpu[label], "vs_first": timings[first].median_s / t.median_s}  # fmt: skip
        print(f"{name} {label:>12}: {t.median_s * 1e3:8.3f} ms  CPU {cpu[label] * 1e3:8.3f} ms  "
              f"{timings[first].median_s / t.median_s:.3f}x of {first}", flush=True)  # fmt: skip
    if out := os.environ.get("OUT"):
        save_json(os.path.join(out, f"ab_{name}.json"), row, device=cfg.device)


if __name__ == "__main__":
    main(sys.argv[1:])
