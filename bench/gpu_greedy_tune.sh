#!/usr/bin/env bash
# One device call, issue 7: the greedy LM head's config (`fused_gemv_argmax_kernel`, lm_head=triton_greedy with
# embedding=triton_qkv_prologue) tuned inside the whole batch-1 step (`bench/step_tune.py`) for qwen3-30b-a3b (its
# recorded routing, $ROUTING, carried) and llama-3.1-8b, whose LM head ran 60 us slower with the argmax at the fused
# LM head's pinned config (4 x 4096).
#   ATHANOR_COMMIT=<hash> [MODELS="qwen3-30b-a3b llama-3.1-8b"] [BUDGET=110] bash bench/gpu_greedy_tune.sh
source "$(dirname "$0")/_gpu_env.sh"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
for model in ${MODELS:-qwen3-30b-a3b llama-3.1-8b}; do
  replay=""; [ "$model" = qwen3-30b-a3b ] && replay=$routing
  timeout 250 python3 bench/step_tune.py --model "$model" ${replay:+--routing "$replay"} --kernels fused_gemv_argmax_kernel \
    --set lm_head=triton_greedy --set embedding=triton_qkv_prologue --budget "${BUDGET:-110}" 2>&1 | tee "$OUT/step_tune_$model.log" \
    | grep -E "^start|^check:|argmax_kernel: |Error"
done
