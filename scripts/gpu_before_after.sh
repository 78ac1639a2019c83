#!/usr/bin/env bash
# A refactor measured before and after on one GPU, in one call: the model suite's default and CUDA-graph columns of
# an earlier commit (its tree extracted to $BASE, e.g. `git archive <commit> | tar -x -C _base`) and of this tree,
# model by model, alternating, so that both see the same machine at nearly the same time.
#
#     BASE=_base OUT=... bash scripts/gpu_before_after.sh resnet18,resnet50 480
#
# Writes $OUT/before/suite.json and $OUT/after/suite.json (scripts/gpu_suite.py's format); a model is started only
# while the budget (seconds, default 540) has room for it.
set -uo pipefail
cd "$(dirname "$0")/.."
BASE="${BASE:?set BASE to the extracted tree of the earlier commit}"
OUT="${OUT:-$(mktemp -d)}"
models="${1:?comma-separated models}"
budget="${2:-540}"
backends="${BACKENDS:-eager,fusion,fusion+cudagraphs}"
PY="${PYTHON:-python3}"
dry=()
[ "${GPU_MEASURE_DRY:-0}" = 1 ] && dry=(--dry-run)
mkdir -p "$OUT/before" "$OUT/after"
start=$SECONDS
for m in ${models//,/ }; do
    for side in before after; do
        left=$((budget - (SECONDS - start)))
        if [ "$left" -lt 60 ]; then echo "=== budget spent: $m $side not run"; continue; fi
        root=$([ "$side" = before ] && echo "$BASE" || echo .)
        merge=()
        [ -f "$OUT/$side/suite.json" ] && merge=(--merge "$OUT/$side/suite.json")
        echo "=== [$((SECONDS - start)) s] $side: $m"
        (cd "$root" && PYTHONPATH=. "$PY" scripts/gpu_suite.py --models "$m" --backends "$backends" \
            --budget "$((left - 10))" --timeout "$((left - 20))" --out "$OUT/$side" "${merge[@]}" "${dry[@]}") \
            2>&1 | grep -v "^USDT\|gpuGetDeviceCount" | tee -a "$OUT/$side/suite.log" | grep -E "^  $m|error|Error" 
    done
done
echo "=== done in $((SECONDS - start)) s"
