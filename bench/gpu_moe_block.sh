#!/usr/bin/env bash
# One device call (~8 min on an H200), issue 7: qwen3-30b-a3b with the MoE block in one persistent launch
# (`routing=triton_moe_block`: the O projection, routing and the experts' GEMVs with grid barriers between) against
# the MoE best-known options, alternating, under each ATHANOR_MOE_BLOCK config of `bench/env_sweep.py`. GPU tests
# first (the block against the four launches in a graph); the sweep is skipped if they fail. Batch 1, context 1024;
# qwen3 replays $ROUTING (carried). Between them, the block's phases timed apart (`bench/moe_block_phases.py`, its
# configs $PHASE_CONFIGS). The compiler caches go back as $OUT/compile_cache.tgz.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] [TESTS="moe_block or ..."] [SWEEP_BUDGET=200] [CONFIGS="per_sm=3;..."]
#   [PHASE_CONFIGS=";split_k1=1"] bash bench/gpu_moe_block.sh
source "$(dirname "$0")/_gpu_env.sh"
gpu_tests 240 "${TESTS:-moe_block or linear_route}" "moe_block rows|linear_route 2048"
if grep -qE "[0-9]+ failed|Error" "$OUT/gpu_tests.log"; then
  grep -E "^E |assert" "$OUT/gpu_tests.log" | head -20
  echo "GPU tests failed: no sweep"
else
  timeout 200 python3 bench/moe_block_phases.py ${PHASE_CONFIGS:+--configs "$PHASE_CONFIGS"} 2>&1 | grep -vE "Warning|warn" \
    | tail -12
  routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
  [ -f "$routing" ] || routing=""
  timeout $((${SWEEP_BUDGET:-200} + 200)) python3 bench/env_sweep.py --model qwen3-30b-a3b \
    ${routing:+--routing "$routing"} --budget "${SWEEP_BUDGET:-200}" ${CONFIGS:+--configs "$CONFIGS"} 2>&1 \
    | grep -vE "^\s*$|Warning|warn" | tail -40
fi
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
