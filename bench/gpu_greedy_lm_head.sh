#!/usr/bin/env bash
# One device call, issue 7: the greedy LM head (`lm_head=triton_greedy`: the argmax in the LM head's epilogue, the
# engine's argmax launch gone) against the best-known candidate at batch 1, context 1024, alternating in one process
# per model (`bench/env_sweep.py`): the tokens written by the LM head's last program (ATHANOR_GREEDY_TAIL unset:
# group tickets) and by a one-program kernel after it ("kernel"); qwen3-30b-a3b on its recorded routing ($ROUTING,
# carried), llama-3.2-1b, llama-3.1-8b. After the GPU tests matching TESTS (by default the greedy LM head's).
#   ATHANOR_COMMIT=<hash> [TESTS=EXPR] [MODELS="qwen3-30b-a3b llama-3.2-1b llama-3.1-8b"] bash bench/gpu_greedy_lm_head.sh
source "$(dirname "$0")/_gpu_env.sh"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
GPU_TEST_FILES="tests/gpu/test_kernels_gpu.py tests/gpu/test_engine_gpu.py tests/gpu/test_serve_gpu.py" \
  gpu_tests 150 "${TESTS:-greedy_lm_head}" "greedy LM head"
for model in ${MODELS:-qwen3-30b-a3b llama-3.2-1b llama-3.1-8b}; do
  replay=""; [ "$model" = qwen3-30b-a3b ] && replay=$routing
  timeout 150 python3 bench/env_sweep.py --model "$model" ${replay:+--routing "$replay"} --candidate best \
    --set lm_head=triton_greedy --var ATHANOR_GREEDY_TAIL --configs kernel --budget 60 2>&1 | grep -E "^(best|changed)|check|Error"
done
