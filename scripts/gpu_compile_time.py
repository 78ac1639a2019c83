"""Where a first call's time goes (issue 23's target: compile time ≤ Inductor's on every model).

    PYTHONPATH=. python3 scripts/gpu_compile_time.py resnet18 vit_b_16      (on the lent GPU; full suite sizes)
    python3 scripts/gpu_compile_time.py --dry-run resnet18                  (CPU, tiny shapes: rehearse it)

Each (model, backend) runs in a fresh process with cold caches (new FUSION_CACHE_DIR, TRITON_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR), as a user's first run: the first call's wall time, and for ``fusion`` where it went
(cProfile, cumulative seconds): Dynamo's tracing, AOTAutograd, our backend (passes, code generation, the compile
pool), the pool's own wall time, and the kernels generated against the distinct codes compiled. One JSON line per run
on stdout (``RESULT {...}``) and a table at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

# (label, file suffix, function): cumulative seconds of these in the first call's profile. Nested: Dynamo calls the
# backend, the backend AOTAutograd, AOTAutograd our compiler (passes, then compile_graph, which ends in the pool).
PHASES = [
    ("dynamo", "torch/_dynamo/convert_frame.py", "_compile"),
    ("our backend", "fusion/backend.py", "fusion_backend"),
    ("aot", "torch/_functorch/aot_autograd.py", "aot_module_simplified"),
    ("codegen", "fusion/codegen.py", "compile_graph"),
    ("pool", "fusion/kernels/precompile.py", "precompile"),
    ("first launches", "fusion/kernels/triton_runtime.py", "_first"),
]


def one(name: str, label: str, dry: bool) -> dict:
    import cProfile
    import pstats

    import torch

    from fusion import backend
    from fusion.bench.suite import SuiteConfig, _runner
    from fusion.bench.suite_models import MODELS

    cfg = SuiteConfig(device="cpu" if dry else "cuda", sizes="tiny" if dry else "full")
    spec = MODELS[name]
    model32, inputs32 = spec.build(cfg.sizes)
    step = _runner(spec, model32, inputs32, cfg, label, cfg.dtype)
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.disable()
    row = {"model": name, "backend": label, "first_call_s": round(time.perf_counter() - start, 2)}
    stats = pstats.Stats(prof).stats  # (file, line, func) -> (cc, nc, tottime, cumtime, callers)
    for phase, suffix, func in PHASES:
        row[phase] = round(sum(v[3] for k, v in stats.items() if k[0].endswith(suffix) and k[2] == func), 2)
    if label == "fusion":
        kernels = [k for r in backend.reports for p in r.parts for k in p.kernels]
        from fusion.kernels.triton_lang import code_only

        row["kernels"] = len(kernels)
        row["distinct_codes"] = len({code_only(k.source) for k in kernels})
    return row


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    if argv and argv[0] == "--one":
        print("RESULT " + json.dumps(one(argv[1], argv[2], dry)), flush=True)
        return
    names = [a for a in argv if not a.startswith("--")] or ["resnet18", "vit_b_16"]
    backends = ["fusion"] if dry else ["fusion", "inductor"]
    rows = []
    for name in names:
        for label in backends:
            env = dict(os.environ)
            for var in ("FUSION_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
                env[var] = tempfile.mkdtemp(prefix=var.lower() + "_")
            cmd = [sys.executable, __file__, "--one", name, label] + (["--dry-run"] if dry else [])
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if not lines:
                print(f"{name} {label}: failed\n{out.stderr[-2000:]}", flush=True)
                continue
            row = json.loads(lines[-1][len("RESULT ") :])
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\nfirst call, cold caches (s)     " + "  ".join(f"{p:>14}" for p, _, _ in PHASES))
    for r in rows:
        extra = f"  kernels {r['kernels']} / distinct {r['distinct_codes']}" if "kernels" in r else ""
        phases = "  ".join(f"{r[p]:>14.2f}" for p, _, _ in PHASES)
        print(f"{r['model']:>16} {r['backend']:>9} {r['first_call_s']:6.2f}  {phases}{extra}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "compile_time.json"), "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
