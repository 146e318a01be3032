#!/usr/bin/env bash
# One device call, issue 7: `merge_start` (the attention merge kernel lets the O projection launch before its wait,
# so with `split_early` the O GEMV's programs are resident while the split kernel runs) against qwen3-30b-a3b's
# best-known options, alternating; then, with and without it, the O projection's split-K configs whose split is one
# tile (BLOCK_K 1024, SPLIT_K 4: the program's whole strip of the weight loaded before its PDL wait), tuned in the step.
#   ATHANOR_COMMIT=<hash> bash bench/gpu_merge_start.sh
B=${OUT:-bench/results}
OUT=$B/variants MODEL=qwen3-30b-a3b VARIANTS="best;merge_start=True" RUNS=2 BUDGET=${BUDGET:-200} \
  TESTS=${TESTS:-early_keys} bash "$(dirname "$0")/gpu_variants.sh"
source "$(dirname "$0")/_gpu_env.sh"
routing=.routing/qwen3-30b-a3b_gsm8k_en.json
for set in "--set merge_start=True" ""; do
  name=$([ -n "$set" ] && echo merge_start || echo best)
  OUT=$B/tune_$name timeout 170 python3 bench/step_tune.py --model qwen3-30b-a3b $set --routing "$routing" \
    --kernels fused_gemv_router_kernel --where BLOCK_K=1024 --where SPLIT_K=4 --budget 100 2>&1 | grep -E "ms|Error"
done
