"""Where a compiled call's CPU time goes (issue 23: backend="fusion" is CPU-bound where Inductor is not).

    PYTHONPATH=. python3 scripts/gpu_profile_cpu.py resnet50 bert_train      (on the lent GPU; full suite sizes)
    python3 scripts/gpu_profile_cpu.py --dry-run bert_train                   (CPU, tiny shapes: rehearse it)
    ... --backends=eager,fusion                                               (a subset of the backends)

Per model (inference or a training step, exactly as the suite runs it) and backend (fusion, inductor): wall time per
call with the GPU synchronised, the CPU time of the call alone (no sync: how long Python takes to enqueue the work),
which launch path each generated kernel took (direct / JIT, and why), and cProfile's top functions by own time and by
cumulative time.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from collections import Counter

import torch
from suite_steps import fresh_steps, sync

from fusion import backend
from fusion.bench.suite import SuiteConfig


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    names = [a for a in argv if not a.startswith("--")] or ["resnet50"]
    cfg = SuiteConfig(device="cpu" if dry else "cuda", sizes="tiny" if dry else "full")
    print(torch.__version__, "cpu" if dry else torch.cuda.get_device_name())
    picked = next((a.split("=", 1)[1] for a in argv if a.startswith("--backends=")), "")
    backends = picked.split(",") if picked else ("fusion",) if dry else ("fusion", "inductor")
    for name, label, step in fresh_steps(names, backends, cfg):
        for _ in range(4):
            step()
        sync()
        n = 3 if dry else 20
        start = time.perf_counter()
        for _ in range(n):
            step()
        cpu = (time.perf_counter() - start) / n
        sync()
        wall = (time.perf_counter() - start) / n
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(10):
            step()
        prof.disable()
        sync()
        print(f"\n===== {name} {label}: {wall * 1e3:.2f} ms per call, {cpu * 1e3:.2f} ms of it to enqueue (CPU)")
        if label == "fusion":
            launchers = [lch for r in backend.reports for p in r.parts for lch in p.launchers()]
            paths = Counter((lch.kind or "jit", lch.fallback[:70], lch.static_refused[:70]) for lch in launchers)
            direct = sum(lch.launches for lch in launchers)
            print(
                f"generated kernels: {len(launchers)} in {len(backend.reports)} graph(s); "
                f"direct launches so far {direct}"
            )
            for (kind, fb, refused), count in paths.most_common(8):
                print(f"  {count:4d} × {kind}  fallback={fb!r} static_refused={refused!r}")
            for r in backend.reports:
                for p in r.parts:
                    print(
                        f"  part {p.kind}: kernels {len(p.launchers())}, library calls "
                        f"{sum(p.library_calls.values())}: {dict(p.library_calls.most_common(8))}"
                    )
        for key in ("tottime", "cumulative"):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(key).print_stats(22)
            print(f"--- by {key}")
            print("\n".join(out.getvalue().splitlines()[6:32]))
        del step


if __name__ == "__main__":
    main(sys.argv[1:])
