#!/usr/bin/env bash
# One device call (~7 min on an H200), issue 7: the step's output copies in one launch (`copy_outputs`) against two
# clones (ATHANOR_OUTPUT_COPIES=2) on qwen3-30b-a3b's best-known, alternating (`bench/env_sweep.py`; recorded routing,
# $ROUTING); then `lm_head=triton_fused embedding=triton` on the dense models against their best-known (llama-3.2-1b
# twice, llama-3.1-8b once, alternating). Batch 1, context 1024. The engine's and serving's GPU step tests first.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_step_copies.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 150 python3 -m pytest -q -s -m gpu tests/gpu/test_engine_gpu.py tests/gpu/test_serve_gpu.py tests/gpu/test_kernels_gpu.py \
  -k "captured_decode_equals_eager or chained or greedy" > "$OUT/gpu_tests.log" 2>&1
grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -6
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
timeout 170 python3 bench/env_sweep.py --model qwen3-30b-a3b --candidate best --var ATHANOR_OUTPUT_COPIES \
  --configs "2" --budget 40 ${routing:+--routing "$routing"} 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -10
dense="best;lm_head=triton_fused embedding=triton"
MODEL=llama-3.2-1b RUNS=2 BUDGET=60 VARIANTS=$dense bash bench/gpu_variants.sh && mv "$OUT/cells.tgz" "$OUT/cells_1b.tgz"
MODEL=llama-3.1-8b RUNS=1 BUDGET=60 VARIANTS=$dense bash bench/gpu_variants.sh && mv "$OUT/cells.tgz" "$OUT/cells_8b.tgz"
