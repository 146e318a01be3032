#!/usr/bin/env bash
# One device call (~4 min on an H200), issue 7: the best-known candidates at batch 1, context 1024, as they stand -
# llama-3.2-1b and qwen3-30b-a3b (recorded routing from $ROUTING, carried) three times each (their figures sit near
# their lines, so one cell is not enough), llama-3.1-8b once - per kernel and critical path, with the carried
# compiler caches restored (`_gpu_env.sh`) and each cell's autotuned picks recorded. TESTS=EXPR: the GPU tests
# matching it first (engine, serving, kernels, MoE).
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] [TESTS=EXPR] bash bench/gpu_best_b1.sh
source "$(dirname "$0")/_gpu_env.sh"
log_clocks
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
[ -n "${TESTS:-}" ] && GPU_TEST_FILES="tests/gpu/test_engine_gpu.py tests/gpu/test_serve_gpu.py tests/gpu/test_kernels_gpu.py
  tests/gpu/test_moe_gpu.py" gpu_tests 200 "$TESTS"
mkdir -p /tmp/d
cells=""
for r in 1 2 3; do variant /tmp/d/best_1b_$r.py llama-3.2-1b; cells=$cells,llama-3.2-1b:/tmp/d/best_1b_$r.py:1:1024; done
cells=$cells,llama-3.1-8b:best:1:1024
for r in 1 2 3; do variant /tmp/d/best_qwen3_$r.py qwen3-30b-a3b; cells=$cells,qwen3-30b-a3b:/tmp/d/best_qwen3_$r.py:1:1024; done
timeout 360 python3 bench/decode_matrix.py --kernels --budget 330 --routing "$routing" --cells "${cells#,}" 2>&1 \
  | grep -E "ms +[0-9.]+% roofline|Error"
python3 bench/kernel_table.py "$OUT" 14 | grep -E "ms/token|critical" | head -20
# The device returns a few files: the cells' records go back in one archive (decode_cells.json has them too).
tar czf "$OUT/cells.tgz" -C "$OUT" $(cd "$OUT" && ls decode_*_b1_c1024.json) && rm -f "$OUT"/decode_*_b1_c1024.json
