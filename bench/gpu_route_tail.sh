#!/usr/bin/env bash
# One device call, issue 7: the O projection's last program routing (ATHANOR_ROUTE_TAIL) on qwen3-30b-a3b. Its GPU
# tests against the routing kernel (with and without a selection bias), under compute-sanitizer's memcheck where they
# fail; then the tail at each of $CONFIGS against the routing kernel (ATHANOR_ROUTE_TAIL=0 as the base), alternating
# (`bench/env_sweep.py`), at batch 1, context 1024, the recorded routing ($ROUTING). Compiler caches back as
# $OUT/compile_cache.tgz.
#   ATHANOR_COMMIT=<hash> [CONFIGS="1 ATHANOR_ROUTE_CHUNK=max;1"] bash bench/gpu_route_tail.sh
source "$(dirname "$0")/_gpu_env.sh"
tests=(python3 -m pytest -q -s -m gpu tests/gpu/test_moe_gpu.py -k "tail" -p no:cacheprovider)
timeout 150 "${tests[@]}" > "$OUT/tail_tests.log" 2>&1
grep -E "passed|failed|FAILED|Error|linear_route" "$OUT/tail_tests.log" | tail -8
if ! grep -q " passed" "$OUT/tail_tests.log" || grep -qE "failed|error" "$OUT/tail_tests.log"; then
  timeout 200 compute-sanitizer --tool memcheck --print-limit 4 "${tests[@]}" -x > "$OUT/sanitizer.log" 2>&1
  grep -E "Invalid|Address|by thread|in .*kernel|ERROR SUMMARY|passed|failed" "$OUT/sanitizer.log" | head -24
fi
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
ATHANOR_ROUTE_TAIL=0 timeout 240 python3 bench/env_sweep.py --model qwen3-30b-a3b --candidate best \
  --var ATHANOR_ROUTE_TAIL --configs "${CONFIGS:-1 ATHANOR_ROUTE_CHUNK=max;1 ATHANOR_ROUTE_CHUNK=0;1}" --budget 60 \
  ${routing:+--routing "$routing"} 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -16
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
