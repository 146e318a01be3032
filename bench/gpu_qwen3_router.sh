#!/usr/bin/env bash
# One device call (~8 min on an H200), issue 7: qwen3-30b-a3b with the router's logits summed by the O projection
# (`routing=triton_o_epilogue`: no router GEMV launch) against the MoE best-known options, alternating, twice each, per
# kernel and critical path; then the kernel configs of the new layer tuned inside the whole captured step
# (`bench/step_tune.py`). GPU tests first: the O projection + router sums against the three launches in a graph.
# Batch 1, context 1024; qwen3 replays $ROUTING (carried). The compiler caches go back as $OUT/compile_cache.tgz.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] [TUNE_BUDGET=240] bash bench/gpu_qwen3_router.sh
source "$(dirname "$0")/_gpu_env.sh"
gpu_tests 150 "linear_route or router_topk" "linear_route 2048|router_topk 128"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
mkdir -p /tmp/q
cells=""
for r in 1 2; do
  variant /tmp/q/best_$r.py qwen3-30b-a3b
  variant /tmp/q/o_epilogue_$r.py qwen3-30b-a3b routing=triton_o_epilogue
  cells=$cells,qwen3-30b-a3b:/tmp/q/best_$r.py:1:1024,qwen3-30b-a3b:/tmp/q/o_epilogue_$r.py:1:1024
done
timeout 200 python3 bench/decode_matrix.py --kernels --budget 170 --routing "$routing" --cells "${cells#,}" 2>&1 \
  | grep -E "ms +[0-9.]+% roofline|Error"
python3 bench/kernel_table.py "$OUT" 14 | grep -E "ms/token|critical|route|expert|fused_gemv" | head -60
tar czf "$OUT/cells.tgz" -C "$OUT" $(cd "$OUT" && ls decode_*_b1_c1024.json) && rm -f "$OUT"/decode_*_b1_c1024.json
timeout $((${TUNE_BUDGET:-240} + 90)) python3 bench/step_tune.py --model qwen3-30b-a3b --set routing=triton_o_epilogue \
  ${routing:+--routing "$routing"} --budget "${TUNE_BUDGET:-240}" 2>&1 | grep -vE "^\s*$" | tail -70
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
