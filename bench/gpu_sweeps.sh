#!/usr/bin/env bash
# One device call, issue 7: settings read at graph capture, each against a model's best-known candidate at batch 1,
# context 1024, alternating in one process (`bench/env_sweep.py`), one sweep per argument "MODEL|VAR|CONFIGS"
# (CONFIGS ';'-separated; a value may set more variables after a space); qwen3 replays $ROUTING (carried). Then,
# with $ACCOUNT_ENV set (say ATHANOR_KV_BLOCK=32), the cells $ACCOUNT (MODEL:CANDIDATE:BATCH:CONTEXT,...) per kernel
# and critical path (`decode_matrix.py --kernels`). The compiler caches go back as $OUT/compile_cache.tgz.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] [ACCOUNT=qwen3-30b-a3b:best:1:1024 ACCOUNT_ENV="..."] \
#     bash bench/gpu_sweeps.sh "llama-3.2-1b|ATHANOR_KV_BLOCK|32;16" ...
source "$(dirname "$0")/_gpu_env.sh"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
for sweep in "$@"; do
  IFS='|' read -r model var configs <<< "$sweep"
  replay=""
  [[ -n "$routing" && $(basename "$routing") == "$model"_* ]] && replay=$routing  # the profile names its model
  echo "== $model $var: $configs"
  timeout 240 python3 bench/env_sweep.py --model "$model" --candidate best --var "$var" --configs "$configs" \
    --budget 60 ${replay:+--routing "$replay"} 2>&1 | grep -vE "^\s*$|Warning|warn" | sed -n '/^candidate/,$p'
done
if [ -n "${ACCOUNT:-}" ]; then
  (export ${ACCOUNT_ENV:-}; timeout 240 python3 bench/decode_matrix.py --kernels --budget 200 --routing "$routing" \
    --cells "$ACCOUNT" 2>&1 | grep -E "ms +[0-9.]+% roofline|Error")
  python3 bench/kernel_table.py "$OUT" 16 | grep -vE "^\s*$" | head -52
fi
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
