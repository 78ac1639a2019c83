"""The model suite's training rows through ``backend="fusion"`` on the CPU at the tiny sizes: per row its status,
accuracy against eager (the loss and every gradient, Inductor's rule), the first call's time (the compile), and
what the backend left to aten (fallbacks with their reasons, from ``fusion.backend.reports``).

Each row runs in a fresh Dynamo (``torch._dynamo.reset()``), one after another in this process; rounds 0: checked,
never timed. Without ``--models`` every training row of the suite.

Run it:   uv run python scripts/check_train_rows.py [--models swin_t_train,t5_encoder_train] [--infer] [--fallbacks]
          [--cold]   (--infer: the same models' inference rows too; --fallbacks: every fallback's reason, not only
          the count; --cold: an empty kernel cache, so that a first call is a real compile; --fp64: also the step
          through eager and fusion in float64, where rounding hides no wrong kernel)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fusion import backend as _backend  # noqa: E402, F401  (a script may import a lesson: registers "fusion")
from fusion import benchmark as B  # noqa: E402
from fusion.bench import suite as S  # noqa: E402
from fusion.bench.suite_models import SUITE  # noqa: E402
from fusion.compiler import driver  # noqa: E402
from fusion.compiler.report import graph_break_reasons  # noqa: E402


def fallbacks() -> tuple[Counter, int, int]:
    """What the backend's reports say since the last reset: each fallback's reason (counted), the graphs not lowered
    (run as Dynamo captured them) and Dynamo's graph breaks."""
    seen = Counter()
    for rep in driver.reports:
        for what, why in rep.fallbacks:
            seen[re.sub(r"_\d+\b", "", f"{what}: {why}")[:110]] += 1  # bitwise_or_6 and bitwise_or_7: one line
    return seen, sum(bool(r.error) for r in driver.reports), sum(graph_break_reasons().values())


def float64_step(name: str) -> str:
    """The row's step (or call) through eager and through fusion, both in float64: the largest difference of a gradient
    relative to the largest gradient, and relative to its own largest value (gradients above 1e-6 of the largest;
    one that is 0 in theory, a BatchNorm bias before a BatchNorm, is noise on both sides). Rounding alone gives
    ~1e-15; a float32 step inside the model (HF's RMSNorm computes in float32) gives ~1e-7; a wrong kernel more."""
    spec, cfg = S.MODELS[name], S.SuiteConfig(device="cpu")
    model, inputs = spec.build("tiny")
    out = []
    for backend in ("eager", "fusion"):
        torch.manual_seed(0)
        out.append(S._snapshot(S._runner(spec, model, inputs, cfg, backend, torch.float64)()))
    if spec.train:
        names = ["loss"] + [n for n, p in model.named_parameters() if p.requires_grad]
    else:  # an inference row: its outputs
        names = [f"output {i}" for i in range(len(out[0]))]
    scale = max(w.abs().max().item() for w in (out[0][1:] if spec.train else out[0]))
    worst, own, where = 0.0, 0.0, ""
    for n, w, g in zip(names, *out, strict=True):
        d, top = (g - w).abs().max().item(), w.abs().max().item()
        worst = max(worst, d / scale)
        if top > 1e-6 * scale and d / top > own:
            own, where = d / top, n
    return f"float64: max |Δ| {worst:.1e} of the largest gradient, {own:.1e} of its own ({where})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated suite rows (default: every training row)")
    ap.add_argument("--infer", action="store_true", help="also the inference row of each training row's model")
    ap.add_argument("--fallbacks", action="store_true", help="print every fallback reason")
    ap.add_argument("--fp64", action="store_true", help="also the step in float64 through both (a wrong kernel)")
    ap.add_argument("--cold", action="store_true", help="an empty kernel cache: first calls compile every kernel")
    args = ap.parse_args(argv)
    if args.cold:  # read at each compile (c_runtime._cache): the C kernels of earlier runs are not found
        os.environ["FUSION_CACHE_DIR"] = tempfile.mkdtemp(prefix="fusion_cold_")
    names = [m for m in args.models.split(",") if m] or [m.name for m in SUITE if m.train]
    if args.infer:
        names = [x for n in names for x in (n, n.removesuffix("_train")) if x in S.MODELS]
    cache = "an empty kernel cache" if args.cold else "the kernel cache as it is (--cold: empty)"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, tiny sizes, eager vs fusion (CPU), {cache}")
    S.warm_compilers(["fusion"], S.SuiteConfig(device="cpu"))  # the compiler's one-time costs, before any row
    bad = 0
    for name in names:
        t0 = time.perf_counter()
        driver.reset()
        with contextlib.redirect_stdout(io.StringIO()):
            res = S.run_suite(B.LESSON, models=[name], backends=["eager", "fusion"], device="cpu", rounds=0)
        row = res["models"][0]
        f = row.get("backends", {}).get("fusion", {})
        status = f.get("status", row["status"])
        first = f.get("first_call_s")
        why = f.get("reason") or row.get("reason") or ""
        rmse = f"rmse {f['res_rmse']:.2g} (eager {f['eager_rmse']:.2g})" if f.get("res_rmse") is not None else ""
        fb, unlowered, breaks = fallbacks()
        print(
            f"{name:26s} {status:14s} first call {first or 0:6.2f} s  fallbacks {sum(fb.values()):3d}  "
            f"kernels {sum(len(r.kernels) for r in driver.reports):4d}  graphs {len(driver.reports)} "
            f"(not lowered {unlowered}, breaks {breaks})  "
            f"({time.perf_counter() - t0:5.1f} s in all) {rmse} {why}".rstrip()
        )
        if args.fp64 and status == "pass":
            driver.reset()
            print(f"    {float64_step(name)}")
        if args.fallbacks:
            for reason, n in fb.most_common():
                print(f"    {n:3d} x {reason}")
        bad += status != "pass"
    print(f"{len(names) - bad}/{len(names)} pass")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
