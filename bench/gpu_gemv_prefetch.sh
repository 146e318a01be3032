#!/usr/bin/env bash
# One device call (~6 min on an H200), issue 7: the fused GEMVs loading each next weight tile before summing the one
# in hand (ATHANOR_GEMV_PREFETCH=1) against after it (unset: 0), alternating in one process per model
# (`bench/env_sweep.py --candidate best`): qwen3-30b-a3b (recorded routing, $ROUTING), llama-3.2-1b, llama-3.1-8b at
# batch 1, context 1024. The GPU GEMV tests first, under the setting.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_gemv_prefetch.sh
source "$(dirname "$0")/_gpu_env.sh"
# The expert GEMV's loads and registers as this Triton compiles them, for this tree and (when carried) the one before
# 5cceb4b's scalar weight pick ($BASE, as in gpu_expert_loads.sh).
python3 bench/ptx_loads.py 2>&1 | grep -vi warn
base=${BASE:-.ab_base}
[ -d "$base/src" ] && cp bench/ptx_loads.py "$base/bench/" && python3 "$base/bench/ptx_loads.py" 2>&1 | grep -vi warn | sed "s/^/before: /"
ATHANOR_GEMV_PREFETCH=1 gpu_tests 120 "fused_linear or splitk or qkv_rope or linear_route or router_topk or early_keys"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
for m in qwen3-30b-a3b llama-3.2-1b llama-3.1-8b; do
  extra=""; [ "$m" = qwen3-30b-a3b ] && [ -n "$routing" ] && extra="--routing $routing"
  timeout 170 python3 bench/env_sweep.py --model "$m" --candidate best --var ATHANOR_GEMV_PREFETCH --configs "1" \
    --budget 30 $extra 2>&1 | grep -E "^check|Error" | sed "s/^/$m: /"
done
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
