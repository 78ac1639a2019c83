#!/usr/bin/env bash
# This round's GPU measurements (issues 22-24), in two calls of the device tool (each under its 10-minute limit):
#
#     bash scripts/gpu_session.sh a     # CUDA tests, launch cost, compute-sanitizer smoke, overlap calibration,
#                                       # the suite's BatchNorm vision models through every backend
#     bash scripts/gpu_session.sh b     # the rest of the suite (vision without BN-fold variants, HF, training)
#
# Everything lands in $OUT (the device tool brings it back); the integrator commits it under scripts/results/.
# NVLink multicast stays off (the GPU host requires it). GPU_SESSION_DRY=1 rehearses the steps on CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
part="${1:-a}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY="${PYTHON:-python3}"
dry="${GPU_SESSION_DRY:-0}"
start=$SECONDS
step() { echo "=== [$((SECONDS - start)) s] $*"; }

step "machine"
"$PY" -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__,
torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")'

all_fusion=eager,fusion,fusion+cudagraphs,inductor,inductor+reduce-overhead
with_fold=$all_fusion,fusion+fold,fusion+fold+cudagraphs
suite() {  # suite BUDGET MODELS BACKENDS
    local extra=()
    [ "$dry" = 1 ] && extra=(--dry-run)
    [ -f "$OUT/suite.json" ] && extra+=(--merge "$OUT/suite.json")
    step "suite: $2 / $3 (budget $1 s)"
    timeout $(($1 + 30)) "$PY" scripts/gpu_suite.py --models "$2" --backends "$3" --budget "$1" --timeout 200 \
        --out "$OUT" "${extra[@]}" 2>&1 | tee -a "$OUT/suite.log"
}

if [ "$part" = a ]; then
    step "CUDA tests of Phases 8-9 (launchers, CUDA graphs, attention, generated kernels)"
    timeout 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_backend.py tests/test_codegen.py \
        -k "cuda or cudagraph or gpu or launcher or direct or attention" 2>&1 | tail -25 | tee "$OUT/cuda_tests.log"
    step "CPU cost per launch (direct launcher vs Triton's JIT) and CUDA graphs on a small MLP"
    timeout 60 "$PY" scripts/gpu_launch_cost.py 2>&1 | tee "$OUT/launch_cost.log"
    step "compute-sanitizer memcheck over the GPU smoke test (out-of-bounds writes of generated kernels)"
    if command -v compute-sanitizer >/dev/null; then
        timeout 150 compute-sanitizer --tool memcheck --print-limit 20 "$PY" scripts/gpu_smoke.py 2>&1 \
            | tail -25 | tee "$OUT/sanitizer.log"
    else echo "compute-sanitizer not found" | tee "$OUT/sanitizer.log"; fi
    step "Phase 10 on one GPU: cost-model calibration (matmul peak, copy bandwidth)"
    timeout 60 "$PY" scripts/gpu_overlap.py --single --out "$OUT" 2>&1 | tail -15
    suite $((560 - (SECONDS - start))) resnet50,mobilenet_v2,resnet18,efficientnet_b0 "$with_fold"
else
    step "CUDA tests of Phases 8-9 again (after fixes of part a's findings)"
    timeout 100 "$PY" -m pytest -q -p no:cacheprovider tests/test_backend.py tests/test_codegen.py \
        -k "cuda or cudagraph or gpu or launcher or direct or attention" 2>&1 | tail -12 | tee "$OUT/cuda_tests.log"
    step "CPU cost per launch and CUDA graphs on a small MLP"
    timeout 90 "$PY" scripts/gpu_launch_cost.py 2>&1 | tee "$OUT/launch_cost.log"
    suite $((560 - (SECONDS - start))) vit_b_16,bert,gpt2,llama,convnext_tiny,mobilenet_v3_large,bert_train,resnet50_train \
        "$all_fusion"
fi
step "done; files: $(ls "$OUT" | tr '\n' ' ')"
