"""Why does the same library call cost more CPU from ``fusion``'s graph than from Inductor's? (ConvNeXt-T on an H200,
cProfile, 2026-11-29: ``addmm`` 24 µs a call against 16, ``convolution`` 32 against 18.)

    PYTHONPATH=. python3 scripts/gpu_op_cost_probe.py convnext_tiny          (on the lent GPU; full suite sizes)
    python3 scripts/gpu_op_cost_probe.py --dry-run resnet18                   (CPU, tiny: rehearse it)

Per backend (``fusion``, Inductor), one call of the model as the suite runs it, with ``torch.convolution``,
``torch.addmm``, ``torch.mm`` and ``torch.bmm`` wrapped (our graph calls them through ``torch``, Inductor's through
``extern_kernels``): each library call's thread CPU time inside the graph, and its arguments. Then each recorded
call replayed alone, 50 times back to back (a synchronisation every 10): with the very tensors the graph passed,
and with fresh copies of them (same sizes, strides and dtype). Medians in µs a call, per op:
- in the graph against replayed: what the graph around a call adds (allocator state, preceding launches);
- the graph's tensors against fresh copies: what the tensors themselves cost (their layout, offsets, alignment);
- ``fusion`` against Inductor at each step. Raw JSON to $OUT/op_cost_<model>.json.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import defaultdict

import torch
from torch._inductor.select_algorithm import extern_kernels

from fusion import backend  # noqa: F401  (registers backend="fusion")
from fusion.bench.results import save_json
from fusion.bench.suite import MODELS, SuiteConfig, _runner

OPS = ("convolution", "addmm", "mm", "bmm")


def fresh(x):
    """A copy of a tensor argument in a new allocation, same sizes, strides and dtype; anything else as it is."""
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)
    return x


def record(fn, sync) -> list[tuple[str, float, tuple, dict]]:
    """One call of ``fn`` with the library ops wrapped: (op, thread CPU µs, args, kwargs) per library call."""
    calls: list = []
    saved = {(ns, name): getattr(ns, name) for ns in (torch, extern_kernels) for name in OPS if hasattr(ns, name)}

    def wrap(name, op):
        def call(*args, **kwargs):
            c0 = time.thread_time()
            out = op(*args, **kwargs)
            calls.append((name, (time.thread_time() - c0) * 1e6, args, kwargs))
            return out

        return call

    try:
        for (ns, name), op in saved.items():
            setattr(ns, name, wrap(name, op))
        # a model that calls torch.addmm itself (GPT-2's Conv1D) has Dynamo guard on it: run the compiled code as is
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            fn()
        sync()
    finally:
        for (ns, name), op in saved.items():
            setattr(ns, name, op)
    return calls


def replay(name: str, args: tuple, kwargs: dict, sync, n: int) -> float:
    """Median thread CPU µs of ``n`` calls of the op alone (a synchronisation every 10), without autograd, as the
    compiled graphs run them (Inductor's ``out=`` calls refuse a tensor that requires grad)."""
    op, times = getattr(torch, name), []
    with torch.no_grad():
        for i in range(n):
            if i % 10 == 0:
                sync()
            c0 = time.thread_time()
            op(*args, **kwargs)
            times.append((time.thread_time() - c0) * 1e6)
    sync()
    return statistics.median(times)


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    name = next((a for a in argv if not a.startswith("--")), "convnext_tiny")
    cfg = SuiteConfig(device="cpu" if dry else "cuda", sizes="tiny" if dry else "full")
    sync = torch.cuda.synchronize if cfg.device == "cuda" else (lambda: None)
    torch.backends.cudnn.benchmark = cfg.device == "cuda"  # as the suite runs
    spec = MODELS[name]
    model32, inputs32 = spec.build(cfg.sizes)
    n = 10 if dry else 50
    found: dict = {"model": name}
    for label in ("fusion", "inductor"):
        fn = _runner(spec, model32, inputs32, cfg, label, cfg.dtype)
        for _ in range(5):
            fn()
        sync()
        for _ in range(3):  # warm the wrapped path too; keep the last call's record
            calls = record(fn, sync)
        per: dict = defaultdict(lambda: {"graph": [], "replayed": [], "fresh": []})
        for op, us, args, kwargs in calls:
            per[op]["graph"].append(us)
            per[op]["replayed"].append(replay(op, args, kwargs, sync, n))
            per[op]["fresh"].append(replay(op, tuple(fresh(a) for a in args), kwargs, sync, n))
        found[label] = {
            op: {k: statistics.median(v) for k, v in d.items()} | {"calls": len(d["graph"])} for op, d in per.items()
        }
        print(f"\n{name} {label}: µs of CPU a call, medians (in the graph / replayed alone / on fresh copies)")
        for op, d in found[label].items():
            print(
                f"  {op:12s} x{d['calls']:3d}   {d['graph']:7.1f} / {d['replayed']:7.1f} / {d['fresh']:7.1f}",
                flush=True,
            )
    out = os.environ.get("OUT")
    if out:
        save_json(os.path.join(out, f"op_cost_{name}.json"), found, device=cfg.device)


if __name__ == "__main__":
    main(sys.argv[1:])
