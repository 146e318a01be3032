#!/usr/bin/env bash
# One device call, issue 7: the greedy LM head (`lm_head=triton_greedy`: the argmax in the LM head's epilogue, the
# engine's argmax launch gone) against the best-known candidate, alternating in one process, at batch 1, context
# 1024: qwen3-30b-a3b (recorded routing from $ROUTING, carried) three rounds, llama-3.2-1b two, llama-3.1-8b one,
# each cell profiled per kernel; after the GPU tests of what it touches (TESTS, by default the greedy LM head's
# kernel and candidate tests, the engine's captured decode and serving's chained steps).
#   ATHANOR_COMMIT=<hash> [VARIANT="lm_head=triton_greedy"] [TESTS=EXPR] bash bench/gpu_greedy_lm_head.sh
source "$(dirname "$0")/_gpu_env.sh"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
GPU_TEST_FILES="tests/gpu/test_kernels_gpu.py tests/gpu/test_engine_gpu.py tests/gpu/test_serve_gpu.py" \
  gpu_tests 170 "${TESTS:-greedy_lm_head or captured_decode_equals_eager or chained}" "greedy LM head"
mkdir -p /tmp/g
option=${VARIANT:-lm_head=triton_greedy}
cells=""
for spec in qwen3-30b-a3b:3 llama-3.2-1b:2 llama-3.1-8b:1; do
  model=${spec%:*}
  for r in $(seq "${spec#*:}"); do
    variant /tmp/g/best_${model}_$r.py "$model"
    variant /tmp/g/greedy_${model}_$r.py "$model" $option
    cells=$cells,$model:/tmp/g/best_${model}_$r.py:1:1024,$model:/tmp/g/greedy_${model}_$r.py:1:1024
  done
done
echo "greedy: $option" | tee "$OUT/variants.txt"
timeout 360 python3 bench/decode_matrix.py --kernels --budget 330 --routing "$routing" --cells "${cells#,}" 2>&1 \
  | grep -E "ms +[0-9.]+% roofline|Error"
tar czf "$OUT/cells.tgz" -C "$OUT" $(cd "$OUT" && ls decode_*_b1_c1024.json) && rm -f "$OUT"/decode_*_b1_c1024.json
