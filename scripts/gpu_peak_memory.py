"""What is alive at a call's peak: the caching allocator's event trace replayed, per backend (CUDA only).

    PYTHONPATH=. python3 scripts/gpu_peak_memory.py --models t5_encoder --backends fusion,inductor --out $OUT

For each model and backend (built as the suite builds it: bf16 inference, or a training step with ``--train``) the
script warms the call, records the allocator's history over one more call (``torch.cuda.memory._record_memory_history``
with Python stacks), and replays its events: every allocation made during the call, freed when its free is requested.
At the largest running total it lists the live blocks, each with the line of the compiled graph's code (fx's
``<eval_with_key>`` or Inductor's output code) that allocated it. ``$OUT/<model>-<backend>.txt`` holds the report,
with the compiled code it cites (``--top`` blocks); ``$OUT/memory_peak.json`` the totals.
"""

from __future__ import annotations

import argparse
import json
import linecache
import os
from pathlib import Path

import torch

import fusion.backend  # noqa: F401 - registers backend="fusion" (Phase 9)
from fusion.bench.suite import SuiteConfig, _runner, warm_compilers
from fusion.bench.suite_models import MODELS


def _site(frames: list[dict]) -> tuple[str, int, str]:
    """(file, line, function) of the innermost frame in compiled code: fx's generated forward or Inductor's."""
    for f in frames:
        name = f.get("filename", "")
        if name.startswith("<eval_with_key>") or "torchinductor" in name:
            return name, f.get("line", 0), f.get("name", "")
    f = frames[0] if frames else {}
    return f.get("filename", "?"), f.get("line", 0), f.get("name", "?")


def _source(file: str, line: int) -> str:
    text = linecache.getline(file, line)
    if not text and os.path.exists(file):
        text = Path(file).read_text().splitlines()[line - 1] + "\n"
    return text.strip()


def peak_report(trace: list[dict], top: int) -> tuple[int, list[tuple[int, str, int, str]]]:
    """The replayed peak (bytes above the start) and the ``top`` largest blocks alive there: (bytes, file, line,
    source)."""
    live: dict[int, tuple[int, tuple]] = {}
    total = best = 0
    at_best: dict[int, tuple[int, tuple]] = {}
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], _site(e.get("frames", [])))
            total += e["size"]
            if total > best:
                best, at_best = total, dict(live)
        elif e["action"] == "free_requested" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
    blocks = sorted(at_best.values(), key=lambda b: -b[0])[:top]
    return best, [(size, file, line, _source(file, line)) for size, (file, line, _) in blocks]


def _launches() -> list[str]:
    """Each launch of the newest ``fusion`` compile: what the memory plan saw and decided."""
    from fusion import backend as fusion_backend
    from fusion.compiler.memory_plan import stored_of
    from fusion.kernels.triton_runtime import Launcher

    lines = []
    for part in fusion_backend.reports[-1].parts if fusion_backend.reports else []:
        for n in part.graph.graph_module.graph.nodes:
            if isinstance(n.target, Launcher):
                lc, plan = n.target, n.target.owner.plan
                stored = [(s.shape, s.dtype) for s in plan.stored]
                ir = plan.ir.in_place if plan.ir is not None else None
                lines.append(f"{n.name}: {plan.results} {stored} {stored_of(lc)} {lc.donated} {ir}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="t5_encoder")
    p.add_argument("--backends", default="fusion,inductor")
    p.add_argument("--train", action="store_true", help="a training step (the suite's training rows)")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = SuiteConfig(device="cuda", sizes="full", rounds=0)
    backends = args.backends.split(",")
    warm_compilers(backends, cfg)
    totals: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for model_name in args.models.split(","):
        spec = MODELS[model_name]
        if args.train:
            import dataclasses

            spec = dataclasses.replace(spec, train=True)
        model32, inputs32 = spec.build("full")
        for backend in backends:
            torch.manual_seed(0)
            fn = _runner(spec, model32, inputs32, cfg, backend, cfg.dtype)
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
            result = fn()
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            peak = torch.cuda.max_memory_allocated() - base
            del result
            trace = snap["device_traces"][torch.cuda.current_device()]
            replayed, blocks = peak_report(trace, args.top)
            lines = [f"{model_name} {backend}: peak {peak / 2**20:.1f} MB above the call's start (replayed "
                     f"{replayed / 2**20:.1f} MB); the {len(blocks)} largest blocks alive at the peak:"]  # fmt: skip
            lines += [
                f"{size / 2**20:9.2f} MB  {Path(file).name}:{line}  {src[:200]}" for size, file, line, src in blocks
            ]
            files = sorted({file for _, file, _, _ in blocks if file.startswith("<eval_with_key>")})
            for file in files:
                lines += [
                    "",
                    f"== {file}",
                    *(f"{i + 1:5d} {t.rstrip()}" for i, t in enumerate(linecache.getlines(file))),
                ]
            if backend.startswith("fusion"):
                lines += [
                    "",
                    "== launches: name, outputs (recipes), stored, fresh outputs, donated, in place",
                    *_launches(),
                ]
            (out / f"{model_name}-{backend}.txt").write_text("\n".join(lines) + "\n")
            print("\n".join(lines[: len(blocks) + 1]), flush=True)
            totals["rows"].append({"model": model_name, "backend": backend, "train": args.train, "peak_bytes": peak,
                                   "replayed_bytes": replayed})  # fmt: skip
            del fn
            torch.cuda.empty_cache()
    (out / "memory_peak.json").write_text(json.dumps(totals, indent=1))


if __name__ == "__main__":
    main()
