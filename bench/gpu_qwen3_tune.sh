#!/usr/bin/env bash
# One device call (~8 min on an H200), issue 7, qwen3-30b-a3b at batch 1, context 1024 (recorded routing, $ROUTING):
# a setting read at graph capture ($VAR, by default the routing kernel's ATHANOR_ROUTE_CHUNK) at each of $CONFIGS
# against the best-known, alternating (`bench/env_sweep.py`); then the configs of $KERNELS (by default the expert
# GEMVs; "" for none) tuned inside the whole captured step (`bench/step_tune.py`). GPU tests matching $TESTS first
# ("" for none). The compiler caches go back as $OUT/compile_cache.tgz.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] [VAR=ATHANOR_ROUTE_CHUNK CONFIGS="32;16"] [KERNELS=expert_gemv_kernel]
#     [TUNE_BUDGET=200] [TESTS="linear_route or moe_block"] bash bench/gpu_qwen3_tune.sh
source "$(dirname "$0")/_gpu_env.sh"
tests=${TESTS-linear_route or moe_block}
[ -n "$tests" ] && gpu_tests 150 "$tests" "moe_block rows|linear_route 2048"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
timeout 240 python3 bench/env_sweep.py --model qwen3-30b-a3b --candidate best --var "${VAR:-ATHANOR_ROUTE_CHUNK}" \
  --configs "${CONFIGS:-32;16}" --budget 60 ${routing:+--routing "$routing"} 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -16
kernels=${KERNELS-expert_gemv_kernel}
[ -n "$kernels" ] && timeout $((${TUNE_BUDGET:-200} + 120)) python3 bench/step_tune.py --model qwen3-30b-a3b \
  --kernels "$kernels" ${routing:+--routing "$routing"} --budget "${TUNE_BUDGET:-200}" 2>&1 \
  | grep -vE "^\s*$|Warning|warn" | tail -40
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
