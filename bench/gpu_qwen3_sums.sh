#!/usr/bin/env bash
# One device call (~6 min on an H200), issue 7: qwen3-30b-a3b's MoE block with no routing launch at all
# (`routing=triton_o_sums`: the O projection's router sums ranked by the expert programs) against the routing kernel on
# the sums (`triton_o_epilogue`) and the best-known options (`triton`), alternating, twice each, per kernel and critical
# path; the expert shapes of the first tuned in the whole step (`bench/step_tune.py`); llama-3.2-1b and llama-3.1-8b's
# best-known once each (the pinned-config lookup changed). GPU tests first. Batch 1, context 1024; $ROUTING replayed.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] [TUNE_BUDGET=120] bash bench/gpu_qwen3_sums.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 150 python3 -m pytest -q -s -m gpu tests/gpu/test_kernels_gpu.py -k "linear_route or router_sums" \
  > "$OUT/gpu_tests.log" 2>&1
grep -E "passed|failed|FAILED|Error|linear_route 2048|two MoE layers" "$OUT/gpu_tests.log" | tail -8
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
mkdir -p /tmp/q
cells=""
for r in 1 2; do
  variant /tmp/q/best_$r.py qwen3-30b-a3b
  variant /tmp/q/o_epilogue_$r.py qwen3-30b-a3b routing=triton_o_epilogue
  variant /tmp/q/o_sums_$r.py qwen3-30b-a3b routing=triton_o_sums
  cells=$cells,qwen3-30b-a3b:/tmp/q/best_$r.py:1:1024,qwen3-30b-a3b:/tmp/q/o_epilogue_$r.py:1:1024
  cells=$cells,qwen3-30b-a3b:/tmp/q/o_sums_$r.py:1:1024
done
cells=$cells,llama-3.2-1b:best:1:1024,llama-3.1-8b:best:1:1024
timeout 300 python3 bench/decode_matrix.py --kernels --budget 270 --routing "$routing" --cells "${cells#,}" 2>&1 \
  | grep -E "ms +[0-9.]+% roofline|Error"
python3 bench/kernel_table.py "$OUT" 14 | grep -E "ms/token|critical|route|expert|fused_gemv|attention" | head -90
tar czf "$OUT/cells.tgz" -C "$OUT" $(cd "$OUT" && ls decode_*_b1_c1024.json) && rm -f "$OUT"/decode_*_b1_c1024.json
timeout $((${TUNE_BUDGET:-120} + 90)) python3 bench/step_tune.py --model qwen3-30b-a3b --set routing=triton_o_sums \
  --kernels expert_gemv_kernel ${routing:+--routing "$routing"} --budget "${TUNE_BUDGET:-120}" 2>&1 \
  | grep -vE "^\s*$" | tail -30
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
