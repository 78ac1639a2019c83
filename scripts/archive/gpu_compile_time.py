"""Where a first call's time goes (issue 23's target: compile time ≤ Inductor's on every model).

    PYTHONPATH=. python3 scripts/archive/gpu_compile_time.py resnet18 vit_b_16      (on the lent GPU; full suite sizes)
    python3 scripts/archive/gpu_compile_time.py --dry-run resnet18                  (CPU, tiny shapes: rehearse it)

Each (model, backend) runs in a fresh process with cold caches (new FUSION_CACHE_DIR, TRITON_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR), as a user's first run, after each compiler's one-time process costs were paid on a throwaway
function (``fusion.bench.suite.warm_compilers``, as the suite does): the first call's wall time, and for ``fusion``
where it went, by wall-clock stopwatches around our functions (cProfile cannot see the frames Dynamo runs a backend
in): the whole backend call (Dynamo hands it the graph: AOTAutograd's trace and our compile of each graph), our
compile of the aten graphs (passes, partition, code generation, the pool's wait), the pool's wait alone, and the
kernels' first launches (loading what the pool compiled); Dynamo's own tracing is the first call less the backend and
the run. The kernels generated against the distinct codes compiled. One JSON line per run on stdout
(``RESULT {...}``) and a table at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

# (label, module, attribute): wall seconds spent inside each during the first call (nested, so they overlap: the
# backend call holds our compile, our compile holds the pool's wait).
PHASES = [
    ("backend call", "fusion.backend", "fusion_backend"),
    ("our compile", "fusion.backend", "compile_aten_graph"),
    ("pool wait", "fusion.compiler.partition", "precompile"),
    ("first launches", "fusion.kernels.triton_runtime", "Launcher._first"),
]


def _stopwatches() -> dict[str, float]:
    """Wrap each function of :data:`PHASES` so that its wall time adds up in the returned dict (by label)."""
    import functools
    import importlib

    spent = {label: 0.0 for label, _, _ in PHASES}
    for label, module, attr in PHASES:
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        fn = getattr(owner, name)

        def timed(*args, _fn=fn, _label=label, **kwargs):
            start = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[_label] += time.perf_counter() - start

        setattr(owner, name, functools.wraps(fn)(timed))
    return spent


def one(name: str, label: str, dry: bool) -> dict:
    import torch

    from fusion import backend
    from fusion.bench.suite import SuiteConfig, _runner, warm_compilers
    from fusion.bench.suite_models import MODELS

    cfg = SuiteConfig(device="cpu" if dry else "cuda", sizes="tiny" if dry else "full")
    spec = MODELS[name]
    model32, inputs32 = spec.build(cfg.sizes)
    warm_compilers([label], cfg)  # the process's one-time costs (imports, Dynamo's first use, the compile pool)
    spent = _stopwatches() if label == "fusion" else {}
    step = _runner(spec, model32, inputs32, cfg, label, cfg.dtype)
    start = time.perf_counter()
    step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    row = {"model": name, "backend": label, "first_call_s": round(time.perf_counter() - start, 2)}
    row.update({phase: round(seconds, 2) for phase, seconds in spent.items()})
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
        phases = "  ".join(f"{r[p]:>14.2f}" if p in r else f"{'-':>14}" for p, _, _ in PHASES)
        print(f"{r['model']:>16} {r['backend']:>9} {r['first_call_s']:6.2f}  {phases}{extra}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "compile_time.json"), "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
