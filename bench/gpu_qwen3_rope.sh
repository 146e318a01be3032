#!/usr/bin/env bash
# One device call (~3 min on an H200), issue 7: the QKV GEMV's RoPE epilogue on qwen3-30b-a3b (q/k norms, RoPE and
# the cache write inside the projection; `rope=triton_qkv_epilogue`) against the MoE best-known options (a separate
# RoPE kernel), three times each alternating (one A/B in gpu_expert_routing.sh read 2.716 vs 2.739-2.741 ms); then
# llama-3.2-1b's best-known twice on this fresh machine with the carried compiler caches (the last call read
# 0.888-0.889 ms) and llama-3.1-8b's once. Batch 1, context 1024, per kernel and critical path; qwen3 replays $ROUTING.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_qwen3_rope.sh
source "$(dirname "$0")/_gpu_env.sh"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
mkdir -p /tmp/q /tmp/d
cells=""
for r in 1 2 3; do
  variant /tmp/q/separate_$r.py qwen3-30b-a3b
  variant /tmp/q/epilogue_$r.py qwen3-30b-a3b rope=triton_qkv_epilogue
  cells=$cells,qwen3-30b-a3b:/tmp/q/separate_$r.py:1:1024,qwen3-30b-a3b:/tmp/q/epilogue_$r.py:1:1024
done
for r in 1 2; do variant /tmp/d/best_1b_$r.py llama-3.2-1b; cells=$cells,llama-3.2-1b:/tmp/d/best_1b_$r.py:1:1024; done
cells=$cells,llama-3.1-8b:best:1:1024
timeout 400 python3 bench/decode_matrix.py --kernels --budget 370 --routing "$routing" --cells "${cells#,}" 2>&1 \
  | grep -E "ms +[0-9.]+% roofline|Error"
python3 bench/kernel_table.py "$OUT" 14 | grep -E "ms/token|critical|rope|fused_gemv" | head -60
# The device returns a few files: the cells' records go back in one archive (decode_cells.json has them too).
tar czf "$OUT/cells.tgz" -C "$OUT" $(cd "$OUT" && ls decode_*_b1_c1024.json) && rm -f "$OUT"/decode_*_b1_c1024.json
