"""Phase 4's model suite on the lent GPU in one call: every model, every backend, one JSON, a table as it goes.

Each model runs in its own process (``python -m fusion.benchmark --suite --models NAME``) under a time limit, so a
model that hangs, crashes the CUDA context or runs out of memory costs only its own row (``timeout`` / ``crashed``
with the reason); the ratios of one model's backends are still measured in one process. Each process starts with
empty compiler caches (Inductor's, Triton's, ours: :data:`CACHES`), so a first call is a cold compile for every
compiler alike, never a cache hit left by an earlier model or call on the same host. The rows are merged into
``suite.json`` in $OUT (else scripts/results/) after every model, with the summary: pass rate, geomean speed-up vs
eager and vs Inductor, compile time.

Run it:   uv run python scripts/gpu_suite.py [--models a,b] [--backends ...] [--timeout S] [--budget S]
          uv run python scripts/gpu_suite.py --merge earlier/suite.json --models bert,gpt2   (a second call adds rows)
On CPU:   uv run python scripts/gpu_suite.py --cpu --backends eager,fusion,inductor --budget 3000 --out DIR
Dry run:  uv run python scripts/gpu_suite.py --dry-run --models gpt2 --backends eager,fusion   (CPU, tiny shapes)

A device command may run 10 minutes: ``--budget`` (default 560 s) stops starting models past it, and no model's
limit runs past it; split the suite over calls with ``--models`` and ``--merge``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fusion.bench.results import save_json  # noqa: E402
from fusion.bench.suite import BACKENDS, HEADER, MODELS, row_lines, summarize, summary_lines  # noqa: E402

# The on-disk caches of the compilers: Inductor's FX graph and autograd caches, Triton's kernels, ours.
CACHES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "FUSION_CACHE_DIR")


def run_one(model: str, backends: list[str], dry_run: bool, limit_s: float, log_dir: Path, cpu: bool = False):
    """(the model's row, the child's meta) from one child process; never raises."""
    out = log_dir / f"{model}.json"
    cmd = [sys.executable, "-m", "fusion.benchmark", "--suite", "--models", model, "--json", str(out)]
    cmd += ["--backends", ",".join(backends)] + (["--device", "cpu", "--tiny"] if dry_run else [])
    cmd += ["--device", "cpu", "--sizes", "cpu"] if cpu and not dry_run else []
    log_path = log_dir / f"{model}.log"
    env = dict(os.environ)
    for var in CACHES:  # cold caches: every compiler's first call is a first run's, whatever ran on this host before
        env[var] = str(log_dir / f"{model}-{var.lower()}")
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            rc = proc.wait(timeout=max(limit_s, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and its compile workers
            proc.wait()
            rc = None
    seconds = time.perf_counter() - t0
    text = log_path.read_text(errors="replace")
    result = json.loads(out.read_text()) if out.exists() else {}
    rows = [r for r in result.get("models", []) if r.get("model") == model]
    if rows and rc == 0:
        row = rows[0]
    else:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        todo = [ln for ln in lines if "TODO(human)" in ln]  # an unsolved exercise: its task says which phase
        tail = todo[-1:] or lines[-1:] or ["(no output)"]
        why = f"over its limit of {limit_s:.0f} s" if rc is None else f"exit status {rc}: {tail[0][:200]}"
        row = {"model": model, "title": MODELS[model].title if model in MODELS else model, "backends": {}}
        row.update(rows[0] if rows else {}, status="timeout" if rc is None else "crashed", reason=why)
    row["seconds"] = seconds
    return row, result.get("meta", {})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated (default: every model of the suite)")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: all)")
    p.add_argument("--timeout", type=float, default=420.0, help="seconds per model (default 420)")
    p.add_argument("--budget", type=float, default=560.0, help="seconds in all: no model starts or runs past it")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "scripts/results"), help="the folder")
    p.add_argument("--merge", metavar="JSON", help="keep this earlier suite.json's rows for the models not run now")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: rehearse the script here")
    p.add_argument("--cpu", action="store_true", help="issue 38's CPU suite: --device cpu --sizes cpu per model")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m] or list(MODELS)
    backends = [b for b in args.backends.split(",") if b]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "suite.json"
    earlier = json.loads(Path(args.merge).read_text()) if args.merge else {}
    result: dict = {"schema": "suite-1", "meta": earlier.get("meta", {}), "models": []}
    kept = [r for r in earlier.get("models", []) if r["model"] not in models]
    start = time.perf_counter()
    print(f"gpu_suite: {len(models)} model(s), backends {', '.join(backends)}, out {path}", flush=True)
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            left = args.budget - (time.perf_counter() - start)
            if left < 30:
                row = {"model": model, "backends": {}, "status": "skipped", "reason": "over the --budget"}
            else:
                row, meta = run_one(model, backends, args.dry_run, min(args.timeout, left), Path(tmp), args.cpu)
                result["meta"] = meta or result["meta"]
            result["models"].append(row)
            for line in row_lines(row):
                print(line, flush=True)
            result["models"] = kept + [r for r in result["models"] if r not in kept]
            result["summary"] = summarize(result["models"], backends)
            save_json(path, result)
    print("summary:")
    for line in summary_lines(result["summary"]):
        print(line)
    bad = [r["model"] for r in result["models"] if r["status"] in ("timeout", "crashed")]
    print(f"done in {time.perf_counter() - start:.0f} s; timeout/crashed: {', '.join(bad) or 'none'}; JSON: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
