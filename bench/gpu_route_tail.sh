#!/usr/bin/env bash
# One device call, issue 7: the O projection's last program routing (ATHANOR_ROUTE_TAIL) on qwen3-30b-a3b. Its GPU
# tests against the routing kernel (with and without a selection bias); the best-known step built with synchronous
# launches and every eager routing checked on the host (`bench/route_tail_check.py`), under the default ranking and
# under each of $CHECKS (ATHANOR_ROUTE_CHUNK values); then, if the default passed, the tail against the routing kernel
# (ATHANOR_ROUTE_TAIL=0) and the tail under each of $CONFIGS, alternating (`bench/env_sweep.py`), at batch 1, context
# 1024, the recorded routing ($ROUTING). Compiler caches back as $OUT/compile_cache.tgz.
#   ATHANOR_COMMIT=<hash> [CHECKS="0 32"] [CONFIGS="0;1 ATHANOR_ROUTE_CHUNK=0"] bash bench/gpu_route_tail.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 150 python3 -m pytest -q -s -m gpu tests/gpu/test_moe_gpu.py -k "tail" -p no:cacheprovider \
  > "$OUT/tail_tests.log" 2>&1
grep -E "passed|failed|FAILED|Error|linear_route" "$OUT/tail_tests.log" | tail -8
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
check() {  # check [CHUNK]: the step's eager routings checked, the ranking's ATHANOR_ROUTE_CHUNK set if given
  echo "== route_tail_check, ATHANOR_ROUTE_CHUNK=${1:-default}"
  (if [ -n "${1:-}" ]; then export ATHANOR_ROUTE_CHUNK=$1; fi
   CUDA_LAUNCH_BLOCKING=1 timeout 120 python3 bench/route_tail_check.py ${routing:+--routing "$routing"} 2>&1 \
     | grep -vE "^\s*$|Warning|warn" | tail -6) | tee -a "$OUT/route_tail_check.log"
}
check
ok=$(grep -c "checked: [1-9][0-9]*, bad: 0" "$OUT/route_tail_check.log")
for chunk in ${CHECKS-0 32}; do check "$chunk"; done
if [ "$ok" = 1 ]; then
  timeout 240 python3 bench/env_sweep.py --model qwen3-30b-a3b --candidate best --var ATHANOR_ROUTE_TAIL \
    --configs "${CONFIGS:-0;1 ATHANOR_ROUTE_CHUNK=0}" --budget 60 ${routing:+--routing "$routing"} 2>&1 \
    | grep -vE "^\s*$|Warning|warn" | tail -16
fi
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
