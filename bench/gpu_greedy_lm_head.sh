#!/usr/bin/env bash
# One device call, issue 7: the greedy LM head (`lm_head=triton_greedy`: the argmax folded into the LM head, its
# tokens read by a one-program kernel: the engine's argmax kernel goes) and the first layer's QKV kernel gathering
# its row (`embedding=triton_qkv_prologue`: the gather launch goes) against the best-known candidate, alternating in
# one process, batch 1, context 1024, each cell profiled per kernel: qwen3-30b-a3b (recorded routing from $ROUTING,
# carried) three rounds, llama-3.2-1b two, llama-3.1-8b one. After the GPU tests matching TESTS (by default both
# moves' kernel and candidate tests).
#   ATHANOR_COMMIT=<hash> [TESTS=EXPR] bash bench/gpu_greedy_lm_head.sh
source "$(dirname "$0")/_gpu_env.sh"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
GPU_TEST_FILES="tests/gpu/test_kernels_gpu.py tests/gpu/test_engine_gpu.py tests/gpu/test_serve_gpu.py" \
  gpu_tests 170 "${TESTS:-greedy_lm_head or captured_decode_equals_eager or embedding}" "greedy LM head"
mkdir -p /tmp/g
variants=("" "lm_head=triton_greedy" "embedding=triton_qkv_prologue" "lm_head=triton_greedy embedding=triton_qkv_prologue")
cells=""
for spec in qwen3-30b-a3b:3 llama-3.2-1b:2 llama-3.1-8b:1; do
  model=${spec%:*}
  for r in $(seq "${spec#*:}"); do
    for i in "${!variants[@]}"; do
      # shellcheck disable=SC2086
      variant /tmp/g/v${i}_${model}_$r.py "$model" ${variants[$i]}
      cells=$cells,$model:/tmp/g/v${i}_${model}_$r.py:1:1024
    done
  done
done
for i in "${!variants[@]}"; do echo "v$i: ${variants[$i]:-best}"; done | tee "$OUT/variants.txt"
timeout 380 python3 bench/decode_matrix.py --kernels --budget 350 --routing "$routing" --cells "${cells#,}" 2>&1 \
  | grep -E "ms +[0-9.]+% roofline|Error"
tar czf "$OUT/cells.tgz" -C "$OUT" $(cd "$OUT" && ls decode_*_b1_c1024.json) && rm -f "$OUT"/decode_*_b1_c1024.json
