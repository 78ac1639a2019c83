"""Why a model of the CPU suite runs as it does under ``backend="fusion"``: per model, the backend's report (graphs,
generated kernels and which renderer ran each, library calls left to aten, fallbacks with their reasons).

The timing itself is the suite's (``python -m fusion.benchmark --suite --device cpu --sizes cpu`` or
``scripts/gpu_suite.py --cpu``); this script reads what ``fusion.backend.reports`` says after one call.

``--kernels N``: where a call's time goes, the N slowest C kernels with their time a call, bytes and shapes, and the
time of the whole call, of all C kernels and of the launches' Python (one thread unless OMP_NUM_THREADS says more;
issue 38's profile of EfficientNet-B0 came from it).

Run it:   uv run python scripts/cpu_suite.py [--models resnet18,bert] [--sizes cpu|tiny] [--full] [--kernels 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fusion import backend  # noqa: E402  (a script may import a lesson: this one registers backend="fusion")
from fusion.bench.suite import MODELS, SuiteConfig, _runner  # noqa: E402
from fusion.compiler.report import summary  # noqa: E402

CPU_MODELS = ("resnet18", "mobilenet_v2", "efficientnet_b0", "vit_b_16", "bert", "gpt2", "llama")


def kernel_times(call, top: int, calls: int = 10) -> None:
    """Time each C kernel of ``call`` (after warm-up calls) around its ctypes call: per kernel name its time a call,
    bytes (its tensors' storages) and bandwidth; then the call, all kernels, and the launches' Python."""
    from fusion.kernels import c_runtime, triton_runtime

    spent, count, size, shapes = defaultdict(float), Counter(), {}, {}
    launch = [0.0, 0]
    c_call, l_call = c_runtime.CKernel.__call__, triton_runtime.Launcher.__call__

    def timed_c(self, *ts):
        ptrs, n = [t.data_ptr() for t in ts], torch.get_num_threads()
        t0 = time.perf_counter()
        self.fn(*ptrs, n)
        spent[self.name] += time.perf_counter() - t0
        count[self.name] += 1
        size[self.name] = sum(t.untyped_storage().nbytes() for t in ts)
        shapes[self.name] = [tuple(t.shape) for t in ts][:2]

    def timed_launch(self, *a):
        t0 = time.perf_counter()
        out = l_call(self, *a)
        launch[0] += time.perf_counter() - t0
        launch[1] += 1
        return out

    for _ in range(3):
        call()
    c_runtime.CKernel.__call__, triton_runtime.Launcher.__call__ = timed_c, timed_launch
    try:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        whole = (time.perf_counter() - t0) / calls
    finally:
        c_runtime.CKernel.__call__, triton_runtime.Launcher.__call__ = c_call, l_call
    in_c = sum(spent.values())
    print(f"   a call {whole * 1e3:.2f} ms: C kernels {in_c / calls * 1e3:.2f} ms ({len(spent)} kernels, "
          f"{launch[1] // calls} launches), launch Python {(launch[0] - in_c) / max(launch[1], 1) * 1e6:.1f} us each "
          f"(timers included); threads {torch.get_num_threads()}")  # fmt: skip
    for k in sorted(spent, key=spent.get, reverse=True)[:top]:
        t = spent[k] / count[k]
        print(f"   {t * 1e6:8.1f} us x{count[k] // calls} {size[k] / 1e6:7.3f} MB {size[k] / t / 1e9:6.2f} GB/s  "
              f"{k[:56]} {shapes[k]}")  # fmt: skip


def explain(name: str, sizes: str, full: bool, kernels: int = 0) -> None:
    backend.reset()
    spec = MODELS[name]
    model32, inputs32 = spec.build(sizes)
    call = _runner(spec, model32, inputs32, SuiteConfig("cpu", sizes), "fusion", torch.float32)
    call()
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
    if kernels:
        kernel_times(call, kernels)
    if full:
        print(summary(backend.reports))
        for r in backend.reports:
            print(r.table())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", default=",".join(CPU_MODELS))
    p.add_argument("--sizes", default="cpu", choices=("tiny", "cpu", "full"))
    p.add_argument("--full", action="store_true", help="every graph's table too")
    p.add_argument("--kernels", type=int, default=0, metavar="N", help="time each C kernel: the N slowest")
    args = p.parse_args(argv)
    if args.kernels and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # as the CPU suite measures
    for name in [m for m in args.models.split(",") if m]:
        explain(name, args.sizes, args.full, args.kernels)
        torch._dynamo.reset()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
