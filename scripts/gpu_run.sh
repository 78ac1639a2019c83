#!/usr/bin/env bash
# Every GPU measurement of the session in one call on the lent GPU (torch 2.11 / Triton 3.6, torchvision present).
# Run it from the repository root on the device machine:
#
#     bash scripts/gpu_run.sh          (device tool: timeout_s 600; it stays inside GPU_RUN_BUDGET, default 540 s)
#
# Groups, each its own process, JSON and log in $OUT (the JSON is saved after every workload, so a group cut short by
# its timeout still leaves the workloads it finished):
#   core    Phases 2/3/5/7/8 on their workloads: Linear+ReLU ×2, relu(x@w+b), Conv+BN+ReLU, the elementwise chain and
#           x + gelu(LayerNorm(x)) (eager / fused / generated kernels / torch.compile), Q,K,V projections at decode and
#           prefill sizes; the roofline picture (roofline_cuda.png, if matplotlib is there)
#   models  torchvision ResNet-50 and MobileNetV2, batch 64×3×224², bf16, channels_last: eager / fold / fold + cuDNN
#           epilogue / backend="fusion" / torch.compile
#   e2e     ResNet-18 and nn.TransformerEncoderLayer (32×512×1024): eager / backend="fusion" / backend="inductor"
#   cpu     the CPU run for comparison (float32, all cores, no torch.compile): the Linear+ReLU pair, chain, conv net
#   check   scripts/gpu_check.py (cuDNN epilogue numerics, conv backends, the Linear+ReLU hot path); only when asked
# Then scripts/bench_summary.py over every JSON. Each group gets at most its share of what is left of the budget and
# passes --budget to the benchmark, which drops to 2 rounds past half of it and skips workloads past all of it.
#
# GPU_RUN_GROUPS="core models e2e cpu" (default) picks groups; GPU_RUN_BUDGET=540 the seconds for everything;
# GPU_RUN_DRY=1 rehearses the same steps on CPU with toy shapes (what tests/test_benchmark.py runs).
# The lead commits the JSON under scripts/results/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
start=$SECONDS
budget="${GPU_RUN_BUDGET:-540}"
groups="${GPU_RUN_GROUPS:-core models e2e cpu}"
dry="${GPU_RUN_DRY:-0}"

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "pip install of the carried wheels failed"; exit 1; }
    export PYTHONPATH=/tmp/site:.
else
    export PYTHONPATH=.
fi
PY="${PYTHON:-python3}"

echo "=== machine"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
"$PY" - <<'EOF' || exit 1
import importlib, os, sys, torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda, "| GPU", gpu,
      "| cores", os.cpu_count())
for name in ("triton", "torchvision", "matplotlib"):
    try:
        print(f"  {name} {importlib.import_module(name).__version__}")
    except ImportError:
        print(f"  {name} missing: the variants that need it are recorded as unavailable")
EOF

if [ "$dry" = 1 ]; then gpu=(--device cpu --tiny --no-compile); cpu=(--device cpu --tiny --no-compile); else
    gpu=(--device cuda); cpu=(--device cpu --no-compile); fi

# run_group NAME SHARE_SECONDS ARGS...: one benchmark process, its timeout the smaller of its share and what is left
rcs=""
run_group() {
    local name=$1 share=$2
    shift 2
    case " $groups " in *" $name "*) ;; *) return 0 ;; esac
    local left=$((budget - (SECONDS - start) - 15))
    local t=$((share < left ? share : left))
    if [ "$t" -lt 20 ]; then
        echo "=== $name: skipped (the budget is spent: $((SECONDS - start)) s of $budget s)"
        rcs="$rcs $name=skipped"
        return 0
    fi
    echo "=== $name: $* (timeout $t s, $((SECONDS - start)) s elapsed)"
    timeout "$t" "$PY" -m fusion.benchmark "$@" --budget $((t * 3 / 4)) --json "$OUT/bench_$name.json" 2>&1 \
        | tee "$OUT/bench_$name.log"
    rcs="$rcs $name=${PIPESTATUS[0]}"
}

plot=()
"$PY" -c 'import matplotlib' 2>/dev/null && plot=(--plot "$OUT/roofline_cuda.png")
core=linear_relu_memory,linear_relu_compute,matmul_add_relu,conv_bn_relu,elementwise_chain,layernorm_gelu_residual
core=$core,qkv_decode,qkv_prefill
[ "$dry" = 1 ] && core=linear_relu_memory  # the rehearsal checks the steps, not the workloads: one is enough
run_group core 200 "${gpu[@]}" --only "$core" "${plot[@]}"
run_group models 170 "${gpu[@]}" --only resnet50,mobilenet_v2
run_group e2e 130 "${gpu[@]}" --only e2e_resnet18,e2e_transformer
run_group cpu 60 "${cpu[@]}" --only linear_relu_memory,linear_relu_compute,elementwise_chain,conv_bn_relu
case " $groups " in *" check "*)
    echo "=== check: scripts/gpu_check.py"
    timeout 120 "$PY" scripts/gpu_check.py 2>&1 | tee "$OUT/gpu_check.log"
    rcs="$rcs check=${PIPESTATUS[0]}" ;;
esac

echo "=== summary"
"$PY" scripts/bench_summary.py "$OUT"/bench_*.json
echo "exit codes:$rcs (124 = timed out: the JSON then holds the workloads done so far)"
echo "total $((SECONDS - start)) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
case "$rcs" in *=[1-9]*) exit 1 ;; esac
exit 0
