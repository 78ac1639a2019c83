"""Does a compiled call leave reference cycles behind (memory that only Python's collector frees)? Per backend: one
model's call repeated with the collector off (as ``timeit`` and ``torch.utils.benchmark.Timer`` run a block), then
what ``gc.collect()`` finds, the CUDA memory still allocated before that collection, and the types in the garbage.

    PYTHONPATH=. python3 scripts/gpu_gc_probe.py efficientnet_b0 fusion,inductor     (the lent GPU)
    python3 scripts/gpu_gc_probe.py --dry-run efficientnet_b0 fusion                  (CPU, tiny shapes)
"""

from __future__ import annotations

import gc
import sys
from collections import Counter

import torch

from fusion import backend  # noqa: F401  (registers backend="fusion")
from fusion.bench.suite import SuiteConfig, _runner
from fusion.bench.suite_models import MODELS


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    args = [a for a in argv if not a.startswith("--")]
    name, backends = (args + ["efficientnet_b0"])[0], (args + ["", "fusion,inductor"])[1].split(",")
    cfg = SuiteConfig(device="cpu" if dry else "cuda", sizes="tiny" if dry else "full")
    spec = MODELS[name]
    model32, inputs32 = spec.build(cfg.sizes)
    cuda = torch.cuda.is_available() and not dry
    for label in backends:
        torch._dynamo.reset()
        fn = _runner(spec, model32, inputs32, cfg, label, cfg.dtype)
        for _ in range(3):
            fn()
        gc.collect()
        base = torch.cuda.memory_allocated() if cuda else 0
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        for _ in range(20):
            fn()
        held = (torch.cuda.memory_allocated() - base) / 2**20 if cuda else 0.0
        found = gc.collect()
        kinds = Counter(type(o).__name__ for o in gc.garbage)
        tensors = sum(1 for o in gc.garbage if isinstance(o, torch.Tensor))
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()
        print(
            f"{name} {label}: 20 calls, collector off: {found} objects in cycles, {tensors} tensors among them, "
            f"{held:.1f} MiB of CUDA memory held until the collection; {kinds.most_common(10)}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
