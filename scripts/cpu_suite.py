"""Why a model of the CPU suite runs as it does under ``backend="fusion"``: per model, the backend's report (graphs,
generated kernels and which renderer ran each, library calls left to aten, fallbacks with their reasons).

The timing itself is the suite's (``python -m fusion.benchmark --suite --device cpu --sizes cpu`` or
``scripts/gpu_suite.py --cpu``); this script reads what ``fusion.backend.reports`` says after one call.

Run it:   uv run python scripts/cpu_suite.py [--models resnet18,bert] [--sizes cpu|tiny] [--full]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fusion import backend  # noqa: E402  (a script may import a lesson: this one registers backend="fusion")
from fusion.bench.suite import MODELS, SuiteConfig, _runner  # noqa: E402
from fusion.compiler.report import summary  # noqa: E402

CPU_MODELS = ("resnet18", "mobilenet_v2", "efficientnet_b0", "vit_b_16", "bert", "gpt2", "llama")


def explain(name: str, sizes: str, full: bool) -> None:
    backend.reset()
    spec = MODELS[name]
    model32, inputs32 = spec.build(sizes)
    _runner(spec, model32, inputs32, SuiteConfig("cpu", sizes), "fusion", torch.float32)()
    parts = [p for r in backend.reports for p in r.parts]
    ran = Counter(v for p in parts for v in p.renderers().values())
    libs = Counter()
    for p in parts:
        libs.update(p.library_calls)
    falls = Counter((what.split(":")[0], why[:110]) for p in parts for what, why in p.fallbacks)
    print(f"== {name} ({sizes}): {len(backend.reports)} graph(s), {sum(len(p.kernels) for p in parts)} kernels")
    print(f"   kernels ran by: {dict(ran) or '-'}")
    print(f"   library calls (aten): {', '.join(f'{op}×{c}' for op, c in libs.most_common()) or '-'}")
    for p in parts:  # a kernel the C lowering refused runs in Triton's interpreter: its name and why
        for lch in p.launchers():
            if getattr(lch.owner, "ran", "") == "triton-interpreter":
                print(f"   interpreter: {lch.__name__[:60]}: {getattr(lch.owner, 'c_refused', '')[:200]}")
    for (what, why), c in falls.most_common(12):
        print(f"   fallback ×{c} {what}: {why}")
    if full:
        print(summary(backend.reports))
        for r in backend.reports:
            print(r.table())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", default=",".join(CPU_MODELS))
    p.add_argument("--sizes", default="cpu", choices=("tiny", "cpu", "full"))
    p.add_argument("--full", action="store_true", help="every graph's table too")
    args = p.parse_args(argv)
    for name in [m for m in args.models.split(",") if m]:
        explain(name, args.sizes, args.full)
        torch._dynamo.reset()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
