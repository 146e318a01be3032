#!/usr/bin/env bash
# One device call (~8 min on an H200), issue 7, qwen3-30b-a3b at batch 1, context 1024 (recorded routing, $ROUTING):
# the routing kernel on the router sums ranking its experts in chunks from stored choosers (ATHANOR_ROUTE_CHUNK=32, 16)
# against all at once in registers (unset), alternating (`bench/env_sweep.py`); then the expert GEMVs' configs tuned
# inside the whole captured step with the BLOCK_K 1024 configs new to their autotuner (`bench/step_tune.py`). GPU tests
# of the routing and MoE kernels first. The compiler caches go back as $OUT/compile_cache.tgz.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] [TUNE_BUDGET=200] bash bench/gpu_qwen3_tune.sh
source "$(dirname "$0")/_gpu_env.sh"
gpu_tests 150 "linear_route or moe_block" "moe_block rows|linear_route 2048"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
timeout 240 python3 bench/env_sweep.py --model qwen3-30b-a3b --candidate best --var ATHANOR_ROUTE_CHUNK \
  --configs "32;16" --budget 60 ${routing:+--routing "$routing"} 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -16
timeout $((${TUNE_BUDGET:-200} + 120)) python3 bench/step_tune.py --model qwen3-30b-a3b --kernels expert_gemv_kernel \
  ${routing:+--routing "$routing"} --budget "${TUNE_BUDGET:-200}" 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -30
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
