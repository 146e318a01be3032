#!/usr/bin/env bash
# One device call (~8 min on an H200), issue 7, qwen3-30b-a3b at batch 1, context 1024 (recorded routing, $ROUTING):
# the routing kernel handing its ids to the experts' gate/up programs by a flag they poll (ATHANOR_ROUTE_SIGNAL, on by
# default) against waiting for the routing launch to end (=0), and the argmax's PDL wait and chunk, each against the
# best-known, alternating (`bench/env_sweep.py`); then the Triton LM head's config tuned inside the whole captured step
# (`bench/step_tune.py`). The GPU tests of the flags, the routing and the best-known candidate first.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_route_signal.sh
source "$(dirname "$0")/_gpu_env.sh"
gpu_tests 150 "routing_flags or linear_route or embedding or qwen3-lm-head" "4 MoE layers|linear_route 2048|qwen3-lm"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
timeout 190 python3 bench/env_sweep.py --model qwen3-30b-a3b --candidate best --var ATHANOR_ROUTE_SIGNAL \
  --configs "0;1 ATHANOR_ARGMAX_PDL=0;1 ATHANOR_ARGMAX_CHUNK=4096" --budget 80 ${routing:+--routing "$routing"} 2>&1 \
  | grep -vE "^\s*$|Warning|warn" | tail -14
timeout 170 python3 bench/step_tune.py --model qwen3-30b-a3b --kernels fused_gemv_kernel ${routing:+--routing "$routing"} \
  --budget 75 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -5
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
