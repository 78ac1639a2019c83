#!/usr/bin/env bash
# Phase 4 on the lent GPU, in one call: the full benchmark on CUDA (torch.compile of every workload included), a
# CPU run without compile, then a short summary. Run it from the repository root on the device machine:
#
#     bash scripts/gpu_run.sh          (device tool: carry [".whl"], timeout_s 600; it finishes in ~3-5 minutes)
#
# Writes $OUT/bench_cuda.json (+ .log, roofline_cuda.png if matplotlib is there) and $OUT/bench_cpu.json (+ .log).
# The lead commits the JSON under scripts/results/. GPU_RUN_DRY=1 rehearses the same steps on CPU with toy shapes.
# On CUDA each variant is also profiled (torch.profiler, 20 calls: GPU kernel time, kernels per call, top kernels;
# a few seconds in all) and the Conv+BN+ReLU net gets a fourth row, fold + cuDNN epilogue. For a one-minute check
# of those pieces alone, without the full run: PYTHONPATH=. python3 scripts/gpu_check.py
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
start=$SECONDS

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "pip install of the carried wheels failed"; exit 1; }
    export PYTHONPATH=/tmp/site:.
else
    export PYTHONPATH=.
fi

echo "=== machine"
nvidia-smi || echo "(no nvidia-smi)"
python3 -c 'import sys, torch, tabulate; print("python", sys.version.split()[0], "| torch", torch.__version__,
"| CUDA", torch.version.cuda, "| GPU", torch.cuda.get_device_name() if torch.cuda.is_available() else None,
"| tabulate", tabulate.__version__, "| cores", __import__("os").cpu_count())' || exit 1

if [ "${GPU_RUN_DRY:-0}" = 1 ]; then gpu=(--device cpu --tiny); cpu=(--device cpu --tiny --no-compile); else
    gpu=(--device cuda); cpu=(--device cpu --no-compile); fi
plot=()
python3 -c 'import matplotlib' 2>/dev/null && plot=(--plot "$OUT/roofline_cuda.png")

echo "=== full benchmark: ${gpu[*]} (torch.compile included)"
timeout 330 python3 -m fusion.benchmark "${gpu[@]}" --json "$OUT/bench_cuda.json" "${plot[@]}" 2>&1 \
    | tee "$OUT/bench_cuda.log"
gpu_rc=${PIPESTATUS[0]}

echo "=== CPU run for comparison: ${cpu[*]} (all cores, float32)"
timeout 120 python3 -m fusion.benchmark "${cpu[@]}" --json "$OUT/bench_cpu.json" 2>&1 | tee "$OUT/bench_cpu.log"
cpu_rc=${PIPESTATUS[0]}

echo "=== summary"
python3 scripts/bench_summary.py "$OUT/bench_cuda.json" "$OUT/bench_cpu.json"
echo "exit codes: gpu run $gpu_rc, cpu run $cpu_rc (124 = timed out; the JSON then holds the workloads done so far)"
echo "total $((SECONDS - start)) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit "$gpu_rc"
