#!/usr/bin/env bash
# The GPU measurements of this round, one device-tool call per part (each under the tool's 10-minute limit):
#
#     bash scripts/gpu_measure.sh numerics   # CUDA tests of Phases 8-9; which 0-d operands eager reads at float32 on
#                                            # CUDA; the suite's widened families (eager, fusion, Inductor)
#     bash scripts/gpu_measure.sh cuda       # CUDA tests of Phases 8-9 only
#     bash scripts/gpu_measure.sh profile    # eager's roundings on CUDA again; where the attention families lose
#                                            # (torch.profiler: wall vs GPU time, launches, top kernels)
#     bash scripts/gpu_measure.sh final      # CUDA tests; sums over leading dims; T5, Swin-T profiled; T5, BERT step timed
#     bash scripts/gpu_measure.sh round      # CUDA tests; split reductions against the bandwidth limit; in-kernel dropout
#     bash scripts/gpu_measure.sh train      # the suite's training steps: eager, fusion, Inductor
#     bash scripts/gpu_measure.sh reductions # few outputs over long extents: pass split_reductions on/off, eager, Inductor
#     bash scripts/gpu_measure.sh session    # CUDA tests; Swin-T, MaxViT-T (inference and training)
#     BASE=_before bash scripts/gpu_measure.sh folds
#                                            # CUDA tests; before/after (an earlier tree in $BASE) of Swin-T's training
#                                            # step (eager, fusion): constants the forward returns, folded
#     BASE=_before bash scripts/gpu_measure.sh index_sums
#                                            # the scatter passes' tests on CUDA; Swin-T's training step profiled;
#                                            # before/after ($BASE: eager, fusion); its row against Inductor
#     BASE=_before bash scripts/gpu_measure.sh gathers
#                                            # CUDA tests; before/after (an earlier tree in $BASE) of BERT, Swin-T, GPT-2
#     BASE=_before bash scripts/gpu_measure.sh lnsums
#                                            # CUDA tests; GPT-2's step profiled; before/after ($BASE: eager, fusion)
#     bash scripts/gpu_measure.sh train3     # GPT-2's, Llama's and BERT's training steps: eager, fusion, Inductor
#     BASE=_before bash scripts/gpu_measure.sh gqa
#                                            # CUDA tests; Llama's aten calls; before/after of Llama's and Mistral's steps
#     bash scripts/gpu_measure.sh timer      # why the suite's timer puts EfficientNet-B0 at 0.66 of Inductor where plain
#                                            # loops do not: reference cycles a call leaves (gc probe), the timer's
#                                            # ways inside the suite's own process (timer probe --suite)
#     bash scripts/gpu_measure.sh context    # which part of torch's Timer makes fusion's EfficientNet-B0 calls cost
#                                            # more CPU than a plain loop (context probe); why EfficientNet-B0's step
#                                            # with batch norm decomposed costs more CPU (cProfile, launch paths);
#                                            # the CPU cost of one launch
#     bash scripts/gpu_measure.sh opcost     # why one library call costs more CPU from fusion's graph than from
#                                            # Inductor's: in the graph, replayed alone, on fresh copies (ConvNeXt-T,
#                                            # T5's training step)
#     bash scripts/gpu_measure.sh split      # torch's Timer.timeit taken apart (its thread setting, its two blocks, the
#                                            # collector between them) for EfficientNet-B0, then the suite's row; again
#                                            # in a second process with the collector's objects frozen (gc.freeze)
#     bash scripts/gpu_measure.sh faults     # minor page faults a call under each way of calling, where they are,
#                                            # and again with freed arenas kept (EfficientNet-B0, in the suite, with
#                                            # fusion's own stack-chunk fix off: FUSION_KEEP_STACK_CHUNKS=0)
#     [MODELS=a,b] bash scripts/gpu_measure.sh embed
#                                            # pass embedding_grads (an embedding's gradient as zeros and one index_add_)
#                                            # against ATen's kernel (default: T5's, Mistral's, Llama's, GPT-2's and
#                                            # BERT's training steps)
#     [MODELS=a,b] bash scripts/gpu_measure.sh bn
#                                            # batch norm decomposed in training (decompose_bn) against kept whole, and
#                                            # Inductor (default: EfficientNet-B0's and ResNet-50's steps), with what
#                                            # EfficientNet-B0's forward saves
#     [MODELS=a,b] bash scripts/gpu_measure.sh walks
#                                            # ViT-B/16's training step with a looped reduction's independent walks
#                                            # joined, a cat's columns walked as columns, sums split in memory order:
#                                            # each off alone and all off, against Inductor; the join and the columns
#                                            # in BERT's and GPT-2's steps; ViT-B/16's step profiled. With MODELS
#                                            # (e.g. swin_t_train,maxvit_t_train): the join and the columns only
#     [MODELS=a,b] bash scripts/gpu_measure.sh tiles
#                                            # a column walk that stores the values it sums (GELU's backward with its
#                                            # bias gradient) on the 64 x 64 tile against the wide one, and Inductor
#                                            # (default: GPT-2's, BERT's and ViT-B/16's training steps)
#     MODELS=a,b BACKENDS=x,y [CUDA_TESTS_S=150] bash scripts/gpu_measure.sh suite
#                                            # optionally the CUDA tests, then the suite's models x backends in one call
#                                            # (e.g. BACKENDS=eager,fusion,fusion+cudagraphs,inductor: one process
#                                            # per model, backends interleaved)
#
# Everything lands in $OUT (the device tool brings it back); commit what a document cites under scripts/results/.
# NVLink multicast stays off (the GPU host requires it). GPU_MEASURE_DRY=1 rehearses the steps on CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
part="${1:-numerics}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY="${PYTHON:-python3}"
dry="${GPU_MEASURE_DRY:-0}"
dryrun=(); [ "$dry" = 1 ] && dryrun=(--dry-run)  # what each script takes for its dry run
start=$SECONDS
step() { echo "=== [$((SECONDS - start)) s] $*"; }

step "machine"
"$PY" -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__,
torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")' | tee "$OUT/machine.txt"

suite() {  # suite BUDGET MODELS BACKENDS
    local extra=("${dryrun[@]}")
    [ -f "$OUT/suite.json" ] && extra+=(--merge "$OUT/suite.json")
    step "suite: $2 / $3 (budget $1 s)"
    timeout $(($1 + 30)) "$PY" scripts/gpu_suite.py --models "$2" --backends "$3" --budget "$1" --timeout 200 \
        --out "$OUT" "${extra[@]}" 2>&1 | tee -a "$OUT/suite.log"
}

cuda_tests() {  # cuda_tests LIMIT [LOG NAME]
    step "CUDA tests of Phases 8-9 (generated kernels, launchers, CUDA graphs, attention, eager's roundings)"
    timeout "$1" "$PY" -m pytest -q -p no:cacheprovider tests/test_backend.py tests/test_codegen.py tests/test_codegen_gathers.py tests/test_fuzz.py tests/test_random.py \
        tests/test_split_reductions.py \
        -k "cuda or cudagraph or gpu or launcher or direct or attention or several_rows or real_sizes or one_rounding \
or zero_dim or outer or leading or window or stack or transposed" 2>&1 | tail -15 | tee "$OUT/${2:-cuda_tests}.log"
}

zero_dim() {
    step "which 0-d float operands of a half op eager reads at float32 (CUDA 0-d tensor; CPU scalar tensor)"
    "$PY" - <<'PY' 2>&1 | tee "$OUT/zero_dim.txt"
import torch
from fusion.aten import precision
dev = "cuda" if torch.cuda.is_available() else "cpu"
for packet in precision.PROBED:
    for dtype in (torch.float16, torch.bfloat16):
        for pos in (0, 1):
            ours = precision.zero_dim_at_op_math(packet, pos, 2, dtype, torch.float32, dev)
            print(f"{dev} {packet._qualified_op_name:10} {str(dtype):15} position {pos}: "
                  f"{'float32' if ours else 'rounded'}")
PY
}

case "$part" in
numerics)
    cuda_tests 170
    zero_dim
    suite $((560 - (SECONDS - start))) t5_encoder,mistral,swin_t,maxvit_t,opt,densenet121 eager,fusion,inductor
    ;;
cuda) cuda_tests 300 ;;
profile)
    step "eager's roundings on CUDA (one rounding per value, 0-d operands)"
    timeout 120 "$PY" -m pytest -q -p no:cacheprovider tests/test_codegen.py -k "one_rounding or zero_dim" 2>&1 \
        | tail -5 | tee "$OUT/roundings.log"
    step "profile: the attention families against eager and Inductor"
    timeout 400 "$PY" scripts/gpu_profile_models.py t5_encoder mistral swin_t opt "${dryrun[@]}" 2>&1 \
        | grep -v "^USDT\|^ERROR:.*gpuGetDeviceCount" | tee "$OUT/profile_models.log"
    ;;
final)
    cuda_tests 200
    step "sums over leading dims: generated against eager"
    timeout 90 "$PY" scripts/gpu_outer_sums.py "${dryrun[@]}" 2>&1 | tail -6 | tee "$OUT/outer_sums.log"
    step "profile: T5 (its masked softmax) and Swin-T"
    timeout 200 "$PY" scripts/gpu_profile_models.py t5_encoder swin_t --backends=eager,fusion,inductor "${dryrun[@]}" \
        2>&1 | grep -v "^USDT\|^ERROR:.*gpuGetDeviceCount" | tee "$OUT/profile_models.log"
    suite $((560 - (SECONDS - start))) t5_encoder,bert_train eager,fusion,inductor
    ;;
reductions)
    step "reductions with few outputs (split_reductions on and off, eager, Inductor, the copy-bandwidth limit)"
    timeout 540 "$PY" scripts/gpu_reductions.py --out "$OUT" "${dryrun[@]}" 2>&1 \
        | grep -v "Warning\|_warn_once" | tee "$OUT/reductions.log"
    ;;
round)
    cuda_tests 150
    step "reductions with few outputs (split_reductions on and off, eager, Inductor, the copy-bandwidth limit)"
    timeout 270 "$PY" scripts/gpu_reductions.py --out "$OUT" "${dryrun[@]}" 2>&1 \
        | grep -v "Warning\|_warn_once" | tee "$OUT/reductions.log"
    step "dropout's mask in the kernel: bits against tl.rand, statistics, seeding, gradients, timing"
    timeout 140 "$PY" scripts/gpu_random.py "${dryrun[@]}" 2>&1 \
        | grep -v "Warning\|_warn_once" | tee "$OUT/random.log"
    ;;
suite)
    [ "${CUDA_TESTS_S:-0}" -gt 0 ] && cuda_tests "$CUDA_TESTS_S"
    suite $((570 - (SECONDS - start))) "${MODELS:?MODELS=a,b}" "${BACKENDS:?BACKENDS=x,y}"
    ;;
train)
    suite 560 bert_train,gpt2_train,llama_train,resnet50_train,vit_b_16_train,mobilenet_v2_train eager,fusion,inductor
    ;;
session)
    cuda_tests 240
    suite $((565 - (SECONDS - start))) swin_t,maxvit_t,swin_t_train,maxvit_t_train eager,fusion,inductor
    ;;
folds)
    cuda_tests 200
    step "before/after: returned constants folded ($BASE against this tree: eager, fusion)"
    BASE="${BASE:?BASE=the extracted earlier tree}" OUT="$OUT/before_after" PYTHON="$PY" BACKENDS=eager,fusion \
        bash scripts/gpu_before_after.sh "${MODELS:-swin_t_train}" $((585 - (SECONDS - start)))
    ;;
index_sums)
    step "the scatter passes' tests (index_put_sums on CUDA)"
    timeout 90 "$PY" -m pytest -q -p no:cacheprovider tests/test_scatter_passes.py 2>&1 | tail -3 | tee "$OUT/scatter_tests.log"
    step "Swin-T's training step profiled (launches, GPU time, library calls)"
    (cd scripts && OUT="$OUT" PYTHONPATH="$PWD/..:$PWD" timeout 120 "$PY" gpu_profile_models.py swin_t_train \
        --backends=fusion "${dryrun[@]}") 2>&1 | grep -v "Warning\|_warn_once" | tee "$OUT/profile_models.log" | grep "wall\|most"
    step "before/after: index_put sums (${BASE:-?} against this tree: eager, fusion)"
    BASE="${BASE:?BASE=the extracted earlier tree}" OUT="$OUT/before_after" PYTHON="$PY" BACKENDS=eager,fusion \
        bash scripts/gpu_before_after.sh "${MODELS:-swin_t_train}" 200
    suite $((580 - (SECONDS - start))) swin_t_train eager,fusion,inductor
    ;;
gathers)
    cuda_tests 200
    step "before/after: indexed reads in the kernels ($BASE against this tree: eager, fusion, CUDA graphs)"
    BASE="${BASE:?BASE=the extracted earlier tree}" OUT="$OUT/before_after" PYTHON="$PY" \
        bash scripts/gpu_before_after.sh "${MODELS:-bert,swin_t,gpt2}" $((585 - (SECONDS - start)))
    ;;
lnsums)
    cuda_tests 210
    step "GPT-2's training step profiled (launches, GPU time, library calls)"
    (cd scripts && OUT="$OUT" PYTHONPATH="$PWD/..:$PWD" timeout 100 "$PY" gpu_profile_models.py gpt2_train \
        --backends=fusion "${dryrun[@]}") 2>&1 | grep -v "Warning\|_warn_once" | tee "$OUT/profile_models.log" | grep "wall\|most"
    step "before/after: split LayerNorm gradients, selects after attention, the q/k/v cat (${BASE:-?} against this tree)"
    BASE="${BASE:?BASE=the extracted earlier tree}" OUT="$OUT/before_after" PYTHON="$PY" BACKENDS=eager,fusion \
        bash scripts/gpu_before_after.sh "${MODELS:-gpt2_train}" $((590 - (SECONDS - start)))
    ;;
train3)
    suite 570 gpt2_train,llama_train,bert_train eager,fusion,inductor
    ;;
timer)
    step "reference cycles a compiled call leaves, collector off (EfficientNet-B0: fusion, Inductor)"
    timeout 120 "$PY" scripts/gpu_gc_probe.py efficientnet_b0 fusion,inductor "${dryrun[@]}" 2>&1 | grep -v "Warning\|warn" \
        | tee "$OUT/gc_probe.log"
    step "the suite's timer against plain loops, inside the suite's own process, before its timer and after"
    timeout 300 "$PY" scripts/gpu_timer_probe.py efficientnet_b0 --suite "${dryrun[@]}" 2>&1 | grep -v "Warning\|warn" \
        | tee "$OUT/timer_probe.log"
    ;;
context)
    step "torch's Timer against plain loops and the standard library's timeit, inside the suite (EfficientNet-B0)"
    (cd scripts && PYTHONPATH="$PWD/..:$PWD" timeout 170 "$PY" gpu_context_probe.py efficientnet_b0 "${dryrun[@]}") 2>&1 \
        | grep -v "Warning\|warn" | tee "$OUT/context_probe.log" | tail -26
    step "EfficientNet-B0's step, batch norm kept and decomposed: CPU a step, launch paths, cProfile"
    (cd scripts && PYTHONPATH="$PWD/..:$PWD" timeout 300 "$PY" gpu_profile_cpu.py efficientnet_b0_train \
        --backends=fusion,fusion+with-decompose_bn "${dryrun[@]}") 2>&1 | grep -v "Warning\|warn" | tee "$OUT/profile_cpu_bn.log" \
        | grep -i "ms\|path" | head -20
    if [ "$dry" != 1 ]; then
        step "the CPU cost of one launch (the hook check without a call), eager's torch.add beside it"
        OUT="$OUT" timeout 90 "$PY" scripts/gpu_launch_cost.py 2>&1 | grep -v "Warning\|warn" | tee "$OUT/launch_cost.log" | tail -6
    fi
    ;;
opcost)
    models="${MODELS:-convnext_tiny,t5_encoder_train}"
    for m in ${models//,/ }; do
        step "a library call's CPU in the graph, alone, and on fresh copies: $m"
        OUT="$OUT" timeout 270 "$PY" scripts/gpu_op_cost_probe.py "$m" "${dryrun[@]}" 2>&1 | grep -v "Warning\|warn" \
            | tee "$OUT/op_cost_$m.log" | tail -12
    done
    ;;
split)
    for i in 1 2; do  # process 2 freezes the collector's objects first (gc.freeze) once the models are compiled
        f=(); [ "$i" = 2 ] && f=(--freeze)
        step "torch's Timer taken apart, inside the suite (EfficientNet-B0), process $i ${f[*]}"
        (cd scripts && PYTHONPATH="$PWD/..:$PWD" timeout 200 "$PY" gpu_timer_split_probe.py efficientnet_b0 "${dryrun[@]}" \
            "${f[@]}") 2>&1 | grep -v "Warning\|warn" | tee "$OUT/timer_split_probe_$i.log" | tail -30
    done
    ;;
faults)
    step "page faults per call under each way of calling, inside the suite (EfficientNet-B0), and where they are"
    (cd scripts && FUSION_KEEP_STACK_CHUNKS=0 PYTHONPATH="$PWD/..:$PWD" timeout 240 "$PY" gpu_fault_probe.py \
        efficientnet_b0 "${dryrun[@]}") 2>&1 \
        | grep -v "Warning\|warn" | tee "$OUT/fault_probe.log" | tail -30
    ;;
embed)
    MODELS="${MODELS:-t5_encoder_train,mistral_train,llama_train,gpt2_train,bert_train}"
    for m in ${MODELS//,/ }; do
        step "an embedding's gradient as zeros and one index_add_, against ATen's kernel: $m"
        OUT="$OUT" timeout 150 "$PY" scripts/gpu_ab.py "${dryrun[@]}" "$m" fusion fusion+with-embedding_grads 2>&1 \
            | grep -v "Warning\|warn" | tee -a "$OUT/ab_embed.log" | tail -3
    done
    ;;
bn)
    MODELS="${MODELS:-efficientnet_b0_train,resnet50_train}"
    for m in ${MODELS//,/ }; do  # Inductor's first EfficientNet-B0 step alone took 65 s (2026-11-28)
        step "batch norm kept whole, decomposed, and Inductor: $m"
        timeout 210 "$PY" scripts/gpu_ab.py "${dryrun[@]}" "$m" fusion fusion+with-decompose_bn inductor 2>&1 \
            | grep -v "Warning\|warn" | tee "$OUT/ab_bn_$m.log" | tail -3
    done
    step "what each forward saves, and the peaks"
    timeout 150 "$PY" scripts/gpu_train_memory.py "${dryrun[@]}" efficientnet_b0_train \
        --backends=fusion,fusion+with-decompose_bn,inductor 2>&1 | grep -v "Warning\|warn" | tee "$OUT/train_memory.log"
    ;;
gqa)
    cuda_tests 150
    step "what Llama's step leaves to aten (full sizes, CUDA's passes)"
    timeout 90 "$PY" scripts/fallbacks.py --device cuda --models llama --no-infer 2>&1 | grep -v "Warning\|warn" \
        | tee "$OUT/fallbacks_llama.log" | tail -14
    step "before/after: transposed copies of a middle-dim sum stored by its kernel ($BASE against this tree)"
    BASE="${BASE:?BASE=the extracted earlier tree}" OUT="$OUT/before_after" PYTHON="$PY" BACKENDS=eager,fusion \
        bash scripts/gpu_before_after.sh "${MODELS:-llama_train,mistral_train}" $((590 - (SECONDS - start)))
    ;;
walks)
    L=fusion.kernels.triton_launch; S=fusion.compiler.split_reductions
    if [ -z "${MODELS:-}" ]; then
        step "ViT-B/16's step: walks joined, cat columns, sums split in memory order; each off alone, all off; Inductor"
        timeout 300 "$PY" scripts/gpu_ab.py "${dryrun[@]}" vit_b_16_train fusion "no_join=fusion@$L.JOIN_WALKS=False" \
            "no_mod_columns=fusion@$L.COLUMNS_THROUGH_MOD=False" "no_memory_order=fusion@$S.MEMORY_ORDER=False" \
            "before=fusion@$L.JOIN_WALKS=False@$L.COLUMNS_THROUGH_MOD=False@$S.MEMORY_ORDER=False" inductor 2>&1 \
            | grep -v "Warning\|warn" | tee "$OUT/ab_walks_vit.log" | tail -7
    fi
    M="${MODELS:-bert_train,gpt2_train}"
    for m in ${M//,/ }; do  # MaxViT-T's first fusion step alone took 63 s (2026-11-28)
        step "walks joined and columns through a %, in another model's step: $m"
        timeout 280 "$PY" scripts/gpu_ab.py "${dryrun[@]}" "$m" fusion "no_join=fusion@$L.JOIN_WALKS=False" \
            "no_mod_columns=fusion@$L.COLUMNS_THROUGH_MOD=False" 2>&1 \
            | grep -v "Warning\|warn" | tee -a "$OUT/ab_walks.log" | tail -4
    done
    if [ -z "${MODELS:-}" ]; then
        step "ViT-B/16's step profiled"
        timeout 150 "$PY" scripts/gpu_profile_models.py "${dryrun[@]}" vit_b_16_train --backends=fusion,inductor 2>&1 \
            | grep -v "Warning\|warn" > "$OUT/profile_vit_train.log"; tail -40 "$OUT/profile_vit_train.log"
    fi
    ;;
tiles)
    M="${MODELS:-gpt2_train,bert_train,vit_b_16_train}"
    for m in ${M//,/ }; do
        step "a column walk that stores what it sums: the 64 x 64 tile against the wide one, in $m's step"
        timeout 190 "$PY" scripts/gpu_ab.py "${dryrun[@]}" "$m" fusion \
            "narrow=fusion@fusion.kernels.triton_launch.NARROW_STORING_WALKS=True" inductor 2>&1 \
            | grep -v "Warning\|warn" | tee -a "$OUT/ab_tiles.log" | tail -3
    done
    ;;
*) echo "part must be numerics, cuda, profile, final, reductions, round, session, suite, train, train3, timer, context, opcost, bn, gqa, folds, index_sums, lnsums, gathers, walks or tiles" && exit 2 ;;
esac
step "done; files: $(ls "$OUT" | tr '\n' ' ')"
