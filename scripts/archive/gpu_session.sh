#!/usr/bin/env bash
# This round's GPU measurements (issue 23), in calls of the device tool (each under its 10-minute limit):
#
#     bash scripts/archive/gpu_session.sh a     # CUDA tests, library-call cost probe, launch cost, compute-sanitizer smoke,
#                                       # suite: resnet50, mobilenet_v2
#     bash scripts/archive/gpu_session.sh b     # suite: resnet18, efficientnet_b0, mobilenet_v3_large, convnext_tiny
#     bash scripts/archive/gpu_session.sh c     # suite: vit_b_16, bert, gpt2, llama
#     bash scripts/archive/gpu_session.sh d     # launch paths and cost, a probe of the suite's timing, the training steps
#     bash scripts/archive/gpu_session.sh e     # after reinplace and non-innermost reductions: SE models, training again
#     bash scripts/archive/gpu_session.sh f     # the final code: the vision suite (5 models, every backend)
#     bash scripts/archive/gpu_session.sh g     # the final code: MobileNetV3, ViT and the HF models
#     bash scripts/archive/gpu_session.sh h     # after pass bmm_as_mm (ViT's in-projection as one GEMM): ViT and BERT
#     bash scripts/archive/gpu_session.sh i     # looped reductions on CUDA; where Llama and GPT-2 lose GPU time (profiles)
#     bash scripts/archive/gpu_session.sh j     # after cat kernels and the output split: CUDA tests, the text models + ViT
#     bash scripts/archive/gpu_session.sh k     # the vision suite; compute-sanitizer over the GPU smoke test
#     bash scripts/archive/gpu_session.sh l     # where ResNet-18 and ConvNeXt lose GPU time to Inductor (kernel profiles)
#     bash scripts/archive/gpu_session.sh m     # CUDA tests; compute-sanitizer over this round's kernel kinds
#     bash scripts/archive/gpu_session.sh n     # after max-pool kernels and ConvNeXt's bias: the four conv models
#     bash scripts/archive/gpu_session.sh o     # ViT-B/16's kernels (eager vs fusion); the training steps again
#     bash scripts/archive/gpu_session.sh p     # after LayerNorm stores MHA's transposed copy: memcheck, ViT-B/16 suite rows
#     bash scripts/archive/gpu_session.sh q     # the CPU cost of one launch on the final code (and the launch path taken)
#     bash scripts/archive/gpu_session.sh s     # after the launch trim: the CPU-bound rows again (eager, fusion, Inductor)
#   2026-11-25:
#     bash scripts/archive/gpu_session.sh u     # CUDA tests (hardware bf16 rounding, shared kernels); first-call time cold,
#                                       # fusion vs Inductor; ViT-B/16 and ResNet-50 training kernels and CPU profile
#     bash scripts/archive/gpu_session.sh v     # after pass gemm_heads and one reinterpret per view chain: ViT suite row and
#                                       # kernels; CPU time per op of the ResNet-50 training step, eager vs fusion
#     bash scripts/archive/gpu_session.sh w     # this round's code: the vision suite (5 models, every backend)
#     bash scripts/archive/gpu_session.sh x     # this round's code: MobileNetV3, ViT and the HF models
#     bash scripts/archive/gpu_session.sh y     # CUDA tests (Phases 3, 8, 9); the ResNet-50 training step after the bindings
#   2026-11-25, second session:
#     bash scripts/archive/gpu_session.sh z     # pass conv1x1: conv vs GEMM per call (CPU, GPU); ResNet-50, MobileNetV2,
#                                       # EfficientNet-B0 and the ResNet-50 training step with and without it
#     bash scripts/archive/gpu_session.sh z1    # after conv1x1, its prims fix and the caching allocator: the vision suite
#     bash scripts/archive/gpu_session.sh z2    # the same code: MobileNetV3, ViT and the HF models
#     bash scripts/archive/gpu_session.sh z3    # CUDA tests (Phases 8, 9); both training steps (ResNet-50, BERT)
#   2026-11-25, third session:
#     bash scripts/archive/gpu_session.sh aa    # where GPT-2 and Llama spend CPU under fusion and Inductor (ops, cProfile)
#     bash scripts/archive/gpu_session.sh ab    # after passes cse and constants, split items as strides: CUDA tests; the
#                                       # text models, MobileNetV3 and ViT (every backend); GPT-2's CPU per op again
#     bash scripts/archive/gpu_session.sh ac    # the same code: the vision suite (5 models) and Llama, every backend
#     bash scripts/archive/gpu_session.sh ad    # what passes cse and constants buy (GPT-2, one process); ResNet-50 again
#   2026-11-25, fourth session:
#     bash scripts/archive/gpu_session.sh ae    # where ResNet-50 spends CPU under fusion and Inductor (ops, cProfile);
#                                       # GPT-2's ops after the select drop
#     bash scripts/archive/gpu_session.sh af    # ResNet-50: GPU kernel time vs wall (fusion, Inductor); with and without conv1x1
#     bash scripts/archive/gpu_session.sh ag    # CPU-bound rows: the calling thread's CPU against wall, waits, other threads
#     bash scripts/archive/gpu_session.sh ah    # after cold caches, 25 rounds and the early compile pool: the vision suite
#                                       # (eager, fusion, Inductor)
#     bash scripts/archive/gpu_session.sh ai    # the same code: MobileNetV3, ViT and the HF models (eager, fusion, Inductor)
#     bash scripts/archive/gpu_session.sh aj    # the same code: both training steps
#   Prepared in the fourth session, never run (parts am to ap took their place):
#     bash scripts/archive/gpu_session.sh ak    # CUDA-graph variants of the vision models beside reduce-overhead; what the
#                                       # inference half of conv1x1 buys (ResNet-50, MobileNetV2, 25 rounds)
#     bash scripts/archive/gpu_session.sh al    # CUDA-graph variants of MobileNetV3, ViT and the HF models; BERT's training step
#   2026-11-25, fifth session:
#     bash scripts/archive/gpu_session.sh am    # CUDA tests (Phases 8, 9); what the inference half of conv1x1 buys
#                                       # (ResNet-50, MobileNetV2, EfficientNet-B0; 25 interleaved rounds, cold caches)
#     bash scripts/archive/gpu_session.sh an    # after the forward half of conv1x1 went opt-in: the four vision models with
#                                       # 1x1 convolutions, every backend (CUDA graphs and reduce-overhead included)
#     bash scripts/archive/gpu_session.sh ao    # the same code: MobileNetV3 (every backend); CUDA-graph variants of ConvNeXt,
#                                       # ViT and the HF models (their default rows: parts ah, ai, same code for them)
#     bash scripts/archive/gpu_session.sh ap    # the same code: the training steps (ResNet-50 with the backward half of conv1x1
#                                       # on and off; BERT)
#   2026-11-25, sixth session:
#     bash scripts/archive/gpu_session.sh aq    # after pass depthwise (a depthwise conv as a window sum in the generated
#                                       # kernel): CUDA tests, memcheck of the window kernels, MobileNetV2 with every
#                                       # backend and the pass switched off (fusion+no-depthwise)
#                                       # (ran the pass's first version: XBLOCK 1024, on under CUDA graphs too)
#     bash scripts/archive/gpu_session.sh as    # after the window kernels took 512 elements a program and CUDA graphs turned
#                                       # the pass off: CUDA tests; MobileNetV2 and EfficientNet-B0, every backend,
#                                       # the pass off, and on under CUDA graphs
#     bash scripts/archive/gpu_session.sh au    # after a window stays out of reduction kernels and off costly per-tap chains
#                                       # (EfficientNet's SiLU): CUDA tests; MobileNetV2, EfficientNet-B0, MobileNetV3
#                                       # with every backend and the pass off
#   (parts ar and at were prepared and never run: as and au took their place; the probe ran by hand as aq2, aq3)
#   By hand after au: av (gpu_profile_models.py efficientnet_b0, fusion vs fusion+no-depthwise), aw (EfficientNet-B0
#   with the variants in reverse order, and gpu_profile_cpu.py: fusion is slower there whatever the order)
#     bash scripts/archive/gpu_session.sh ax    # after a window over a costly chain is left to cuDNN (not stored for it):
#                                       # MobileNetV2, EfficientNet-B0, MobileNetV3 (eager, fusion, no-depthwise, Inductor)
#
# Everything lands in $OUT (the device tool brings it back); the integrator commits it under scripts/results/.
# NVLink multicast stays off (the GPU host requires it). GPU_SESSION_DRY=1 rehearses the steps on CPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
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
depthwise_ablation=fusion+no-depthwise,fusion+cudagraphs+with-depthwise
dryflag=()
[ "$dry" = 1 ] && dryflag=(--dry-run)
suite() {  # suite BUDGET MODELS BACKENDS
    local extra=()
    [ "$dry" = 1 ] && extra=(--dry-run)
    [ -f "$OUT/suite.json" ] && extra+=(--merge "$OUT/suite.json")
    step "suite: $2 / $3 (budget $1 s)"
    timeout $(($1 + 30)) "$PY" scripts/gpu_suite.py --models "$2" --backends "$3" --budget "$1" --timeout 200 \
        --out "$OUT" "${extra[@]}" 2>&1 | tee -a "$OUT/suite.log"
}

cuda_tests() {  # cuda_tests LIMIT
    step "CUDA tests of Phases 8-9 (generated kernels, several rows per program, launchers, CUDA graphs, attention)"
    timeout "$1" "$PY" -m pytest -q -p no:cacheprovider tests/test_backend.py tests/test_codegen.py tests/test_fuzz.py \
        -k "cuda or cudagraph or gpu or launcher or direct or attention or several_rows or real_sizes" 2>&1 | tail -15 \
        | tee "$OUT/cuda_tests.log"
}
case "$part" in
a)
    cuda_tests 150
    step "CPU cost of one library call by spelling (OpOverload vs torch.convolution vs F.conv2d)"
    timeout 60 "$PY" scripts/archive/gpu_probe_calls.py --out "$OUT" 2>&1 | tee "$OUT/probe_calls.log"
    step "CPU cost per launch and CUDA graphs on a small MLP"
    timeout 60 "$PY" scripts/gpu_launch_cost.py 2>&1 | tee "$OUT/launch_cost.log"
    step "compute-sanitizer memcheck over the GPU smoke test (out-of-bounds writes of generated kernels)"
    if command -v compute-sanitizer >/dev/null; then
        timeout 120 compute-sanitizer --tool memcheck --print-limit 20 "$PY" scripts/gpu_smoke.py 2>&1 \
            | tail -25 | tee "$OUT/sanitizer.log"
    else echo "compute-sanitizer not found" | tee "$OUT/sanitizer.log"; fi
    suite $((560 - (SECONDS - start))) resnet50,mobilenet_v2 "$all_fusion"
    ;;
b)
    step "the static launcher's run() in this torch (what _raw_launch must know to skip it)"
    "$PY" - <<'PYEOF' 2>&1 | tee "$OUT/static_launcher_run.log"
import inspect
try:
    from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel as K
except ImportError:
    from torch._inductor.runtime.static_cuda_launcher import StaticallyLaunchedCudaKernel as K
print(inspect.getsource(K.run))
PYEOF
    step "where EfficientNet-B0's CPU time goes under fusion and Inductor (cProfile of a call)"
    timeout 150 "$PY" scripts/gpu_profile_cpu.py efficientnet_b0 2>&1 | tee "$OUT/profile_cpu_effnet.log" | tail -5
    suite $((560 - (SECONDS - start))) resnet18,efficientnet_b0,mobilenet_v3_large,convnext_tiny "$all_fusion"
    ;;
c)
    cuda_tests 120
    step "diagnostic: EfficientNet-B0 with no CUDA-graph variant in the process (is fusion's time its own?)"
    mkdir -p "$OUT/diag"
    timeout 200 "$PY" scripts/gpu_suite.py --models efficientnet_b0 --backends eager,fusion,inductor --budget 170 \
        --timeout 170 --out "$OUT/diag" 2>&1 | tail -6 | tee "$OUT/diag.log"
    suite $((560 - (SECONDS - start))) vit_b_16,bert,gpt2,llama "$all_fusion"
    ;;
d)
    cuda_tests 120
    step "which launch path the static-launcher test took (raw C++ launch on this torch?)"
    timeout 60 "$PY" -m pytest -q -s -p no:cacheprovider tests/test_backend.py -k static_launcher 2>&1 \
        | grep -E "launch paths|passed|failed" | tee "$OUT/launch_paths.log"
    step "CPU cost per launch and CUDA graphs on a small MLP"
    timeout 60 "$PY" scripts/gpu_launch_cost.py 2>&1 | tee "$OUT/launch_cost.log"
    step "the suite's timing against a plain loop (EfficientNet-B0)"
    timeout 150 "$PY" scripts/archive/gpu_probe_suite_timing.py --out "$OUT" 2>&1 | tail -12 | tee "$OUT/probe_suite_timing.log"
    suite $((560 - (SECONDS - start))) bert_train,resnet50_train eager,fusion,inductor
    ;;
e)
    cuda_tests 120
    suite 250 efficientnet_b0,mobilenet_v3_large eager,fusion,fusion+cudagraphs,inductor
    suite $((560 - (SECONDS - start))) bert_train,resnet50_train eager,fusion,inductor
    ;;
f) suite 540 resnet50,mobilenet_v2,resnet18,convnext_tiny,efficientnet_b0 "$all_fusion" ;;
g) suite 540 mobilenet_v3_large,vit_b_16,bert,gpt2,llama "$all_fusion" ;;
h)
    cuda_tests 120
    suite 400 vit_b_16,bert "$all_fusion"
    ;;
i)
    cuda_tests 150
    step "GPU kernels of Llama and GPT-2 under eager, fusion and Inductor"
    timeout 400 "$PY" scripts/gpu_profile_models.py llama gpt2 --backends=eager,fusion,inductor \
        2>&1 | tee "$OUT/profile_models.log" | tail -80
    ;;
j)
    cuda_tests 120
    suite 440 llama,gpt2,bert,vit_b_16 "$all_fusion"
    ;;
k)
    step "compute-sanitizer memcheck over the GPU smoke test (out-of-bounds accesses of generated kernels)"
    if command -v compute-sanitizer >/dev/null; then
        timeout 120 compute-sanitizer --tool memcheck --print-limit 20 "$PY" scripts/gpu_smoke.py > "$OUT/sanitizer_full.log" 2>&1
        grep -E "ERROR SUMMARY|Invalid|out of bounds" "$OUT/sanitizer_full.log" | head -20 | tee "$OUT/sanitizer.log"
        tail -5 "$OUT/sanitizer_full.log"
    else echo "compute-sanitizer not found" | tee "$OUT/sanitizer.log"; fi
    suite $((570 - (SECONDS - start))) resnet50,mobilenet_v2,resnet18,efficientnet_b0,mobilenet_v3_large,convnext_tiny "$all_fusion"
    ;;
l)
    step "GPU kernels of ResNet-18 and ConvNeXt-T under fusion and Inductor"
    timeout 400 "$PY" scripts/gpu_profile_models.py resnet18 convnext_tiny --backends=fusion,inductor \
        2>&1 | tee "$OUT/profile_models.log" | grep -v Warn | tail -80
    ;;
m)
    cuda_tests 150
    step "compute-sanitizer memcheck: looped reductions, cat, the GQA split, max-pool windows"
    if command -v compute-sanitizer >/dev/null; then
        timeout 300 compute-sanitizer --tool memcheck --print-limit 20 "$PY" scripts/gpu_memcheck_kernels.py \
            > "$OUT/memcheck.log" 2>&1
        echo "exit $?" >> "$OUT/memcheck.log"
        tail -12 "$OUT/memcheck.log"
    else echo "compute-sanitizer not found" | tee "$OUT/memcheck.log"; fi
    ;;
n)
    suite 540 resnet18,resnet50,convnext_tiny,mobilenet_v2 "$all_fusion"
    ;;
o)
    step "GPU kernels of ViT-B/16 under eager and fusion"
    timeout 200 "$PY" scripts/gpu_profile_models.py vit_b_16 --backends=eager,fusion \
        2>&1 | tee "$OUT/profile_models.log" | grep -v Warn | tail -40
    suite $((570 - (SECONDS - start))) resnet50_train,bert_train eager,fusion,inductor
    ;;
p)
    cuda_tests 120
    step "compute-sanitizer memcheck over this round's kernel kinds"
    timeout 200 compute-sanitizer --tool memcheck --print-limit 20 "$PY" scripts/gpu_memcheck_kernels.py \
        > "$OUT/memcheck.log" 2>&1; echo "exit $?" >> "$OUT/memcheck.log"; tail -10 "$OUT/memcheck.log"
    suite $((570 - (SECONDS - start))) vit_b_16 "$all_fusion"
    ;;
q)
    step "which launch path the static-launcher test took (raw C++ launch on this torch?)"
    timeout 90 "$PY" -m pytest -q -s -p no:cacheprovider tests/test_backend.py -k static_launcher 2>&1 \
        | grep -E "launch paths|passed|failed" | tee "$OUT/launch_paths.log"
    step "CPU cost per launch and CUDA graphs on a small MLP"
    timeout 120 "$PY" scripts/gpu_launch_cost.py 2>&1 | tee "$OUT/launch_cost.log"
    ;;
s)
    suite 540 efficientnet_b0,convnext_tiny,gpt2,llama,resnet50 eager,fusion,inductor
    ;;
u)
    cuda_tests 150
    step "first call with cold caches, where its time goes (fresh process per model and backend)"
    timeout 200 "$PY" scripts/archive/gpu_compile_time.py resnet18 vit_b_16 2>&1 | tee "$OUT/compile_time.log" | tail -8
    step "GPU kernels of ViT-B/16 and the ResNet-50 training step, eager vs fusion"
    timeout 200 "$PY" scripts/gpu_profile_models.py vit_b_16 resnet50_train --backends=eager,fusion \
        2>&1 | grep -v Warn | tee "$OUT/profile_models.log" | tail -75
    step "CPU time of the ResNet-50 training step, eager vs fusion (cProfile)"
    timeout 120 "$PY" scripts/gpu_profile_cpu.py resnet50_train --backends=eager,fusion 2>&1 \
        | tee "$OUT/profile_cpu.log" | grep -E "=====|generated|part " | head -20
    ;;
v)
    cuda_tests 150
    suite 200 vit_b_16 "$all_fusion"
    step "GPU kernels of ViT-B/16, eager vs fusion"
    timeout 120 "$PY" scripts/gpu_profile_models.py vit_b_16 --backends=eager,fusion \
        2>&1 | grep -v Warn | tee "$OUT/profile_models.log" | tail -30
    step "CPU time per op of the ResNet-50 training step, eager vs fusion"
    timeout 150 "$PY" scripts/gpu_profile_ops.py resnet50_train --backends=eager,fusion 2>&1 \
        | grep -v Warn | tee "$OUT/profile_ops.log" | tail -64
    ;;
w) suite 550 resnet50,mobilenet_v2,resnet18,convnext_tiny,efficientnet_b0 "$all_fusion" ;;
x) suite 550 mobilenet_v3_large,vit_b_16,bert,gpt2,llama "$all_fusion" ;;
y)
    cuda_tests 100
    step "CUDA tests of Phase 3 (the GEMM epilogue, K == 0)"
    timeout 60 "$PY" -m pytest -q -p no:cacheprovider tests/test_pattern_rewriter.py -k cuda 2>&1 | tail -3 \
        | tee "$OUT/cuda_tests_phase3.log"
    suite 130 resnet50_train eager,fusion,inductor
    ;;
z)
    step "a 1x1 convolution: cuDNN vs one GEMM, CPU per call and GPU time"
    timeout 120 "$PY" scripts/archive/gpu_probe_conv1x1.py --out "$OUT" 2>&1 | tee "$OUT/probe_conv1x1.log" | tail -40
    suite 330 resnet50,mobilenet_v2,efficientnet_b0 eager,fusion,fusion+no-conv1x1,inductor
    suite 170 resnet50_train eager,fusion,fusion+no-conv1x1,inductor
    ;;
z1) suite 550 resnet50,mobilenet_v2,resnet18,convnext_tiny,efficientnet_b0 "$all_fusion" ;;
z2) suite 550 mobilenet_v3_large,vit_b_16,bert,gpt2,llama "$all_fusion" ;;
z3)
    cuda_tests 100
    suite 300 resnet50_train,bert_train eager,fusion,inductor
    ;;
aa)
    step "CPU time per op of GPT-2 and Llama, fusion vs Inductor (torch.profiler)"
    timeout 240 "$PY" scripts/gpu_profile_ops.py gpt2 llama --backends=fusion,inductor 2>&1 \
        | grep -v Warn | tee "$OUT/profile_ops.log" | tail -30
    step "Python time of a GPT-2 and a Llama call under fusion (cProfile)"
    timeout 200 "$PY" scripts/gpu_profile_cpu.py gpt2 llama --backends=fusion 2>&1 \
        | grep -v Warn | tee "$OUT/profile_cpu.log" | tail -30
    ;;
ab)
    cuda_tests 100
    suite 420 mobilenet_v3_large,vit_b_16,bert,gpt2,llama "$all_fusion"
    step "CPU time per op of GPT-2, fusion vs Inductor (torch.profiler)"
    timeout 60 "$PY" scripts/gpu_profile_ops.py gpt2 --backends=fusion,inductor 2>&1 \
        | grep -v Warn | tee "$OUT/profile_ops.log" | tail -12
    ;;
ac) suite 540 resnet50,mobilenet_v2,resnet18,convnext_tiny,efficientnet_b0,llama "$all_fusion" ;;
ad)
    suite 150 gpt2 eager,fusion,fusion+no-constants,fusion+no-cse,inductor
    suite 100 resnet50 eager,fusion,inductor
    ;;
ae)
    step "CPU time per op of ResNet-50 and GPT-2, fusion vs Inductor (torch.profiler)"
    timeout 200 "$PY" scripts/gpu_profile_ops.py resnet50 gpt2 --backends=fusion,inductor 2>&1 \
        | grep -v Warn | tee "$OUT/profile_ops.log" | tail -30
    step "Python time of a ResNet-50 call under fusion and Inductor (cProfile)"
    timeout 150 "$PY" scripts/gpu_profile_cpu.py resnet50 --backends=fusion,inductor 2>&1 \
        | grep -v Warn | tee "$OUT/profile_cpu.log" | tail -30
    ;;
af)
    step "ResNet-50: wall against GPU kernel time, launches, top kernels (fusion, Inductor)"
    timeout 200 "$PY" scripts/gpu_profile_models.py resnet50 --backends=fusion,inductor 2>&1 \
        | grep -v Warn | tee "$OUT/profile_models.log" | tail -50
    suite 200 resnet50 eager,fusion,fusion+no-conv1x1,fusion+cudagraphs,inductor
    ;;
ag)
    step "ResNet-50 and GPT-2: wall against the calling thread's CPU time, context switches, other threads"
    timeout 200 "$PY" scripts/archive/gpu_probe_cpu_wait.py resnet50 --backends=eager,fusion,fusion+no-conv1x1,inductor 2>&1 \
        | grep -v Warn | tee "$OUT/probe_cpu_wait.log" | grep -v RESULT | tail -8
    timeout 200 "$PY" scripts/archive/gpu_probe_cpu_wait.py gpt2 --backends=eager,fusion,inductor 2>&1 \
        | grep -v Warn | tee -a "$OUT/probe_cpu_wait.log" | grep -v RESULT | tail -8
    ;;
ah) suite 500 resnet50,mobilenet_v2,resnet18,convnext_tiny,efficientnet_b0 eager,fusion,inductor ;;
ai) suite 500 mobilenet_v3_large,vit_b_16,bert,gpt2,llama eager,fusion,inductor ;;
aj) suite 300 resnet50_train,bert_train eager,fusion,inductor ;;
ak)
    suite 330 resnet50,mobilenet_v2,resnet18,convnext_tiny,efficientnet_b0 \
        eager,fusion+cudagraphs,inductor+reduce-overhead
    step "ablation: conv1x1 in inference (its own JSON: a merge would replace these models' rows above)"
    timeout 230 "$PY" scripts/gpu_suite.py --models resnet50,mobilenet_v2 --backends eager,fusion,fusion+no-conv1x1,inductor \
        --budget 200 --timeout 110 --out "$OUT/ablation" "${dryflag[@]}" 2>&1 | tee -a "$OUT/suite_ablation.log"
    ;;
al)
    suite 330 mobilenet_v3_large,vit_b_16,bert,gpt2,llama eager,fusion+cudagraphs,inductor+reduce-overhead
    timeout 250 "$PY" scripts/gpu_suite.py --models bert_train --backends eager,fusion,inductor --budget 220 \
        --timeout 220 --out "$OUT/train" "${dryflag[@]}" 2>&1 | tee -a "$OUT/suite_train.log"
    ;;
am)
    cuda_tests 110
    step "ablation: conv1x1 in inference (its own JSON: a merge would replace these models' rows in a suite)"
    timeout 420 "$PY" scripts/gpu_suite.py --models resnet50,mobilenet_v2,efficientnet_b0 \
        --backends eager,fusion,fusion+no-conv1x1,inductor --budget 390 --timeout 150 --out "$OUT/ablation" \
        "${dryflag[@]}" 2>&1 | tee -a "$OUT/suite_ablation.log"
    ;;
an) suite 545 resnet50,mobilenet_v2,efficientnet_b0,resnet18 "$all_fusion" ;;
ao)
    suite 150 mobilenet_v3_large "$all_fusion"
    suite $((555 - (SECONDS - start))) convnext_tiny,vit_b_16,bert,gpt2,llama eager,fusion+cudagraphs,inductor+reduce-overhead
    ;;
ap)
    suite 175 resnet50_train eager,fusion,fusion+no-conv1x1,inductor
    timeout $((430 - (SECONDS - start))) "$PY" scripts/gpu_suite.py --models bert_train --backends eager,fusion,inductor \
        --budget $((420 - (SECONDS - start))) --timeout $((420 - (SECONDS - start))) --out "$OUT/train" "${dryflag[@]}" \
        2>&1 | tee -a "$OUT/suite_train.log"
    ;;
aq)
    cuda_tests 120
    step "compute-sanitizer memcheck over the window kernels (max-pool, depthwise) and this round's other kinds"
    if command -v compute-sanitizer >/dev/null && [ "$dry" != 1 ]; then
        timeout 150 compute-sanitizer --tool memcheck --print-limit 20 "$PY" scripts/gpu_memcheck_kernels.py \
            > "$OUT/memcheck.log" 2>&1; echo "exit $?" >> "$OUT/memcheck.log"; tail -12 "$OUT/memcheck.log"
    else timeout 150 "$PY" scripts/gpu_memcheck_kernels.py 2>&1 | tee "$OUT/memcheck.log" | tail -3; fi
    suite $((570 - (SECONDS - start))) mobilenet_v2 "$all_fusion,fusion+no-depthwise"
    ;;
as)
    cuda_tests 100
    suite $((560 - (SECONDS - start))) mobilenet_v2,efficientnet_b0 "$all_fusion,$depthwise_ablation"
    ;;
au)
    cuda_tests 100
    suite $((565 - (SECONDS - start))) mobilenet_v2,efficientnet_b0,mobilenet_v3_large "$all_fusion,fusion+no-depthwise"
    ;;
ax) suite 540 mobilenet_v2,efficientnet_b0,mobilenet_v3_large eager,fusion,fusion+no-depthwise,inductor ;;
*) echo "part must be one of a to z, z1 to z3, aa to aq, as, au, ax" && exit 2 ;;
esac
step "done; files: $(ls "$OUT" | tr '\n' ' ')"
