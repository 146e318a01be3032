#!/usr/bin/env bash
# One device call (< 10 min on an H200), issue 7: RoPE + the KV-cache write inside the QKV GEMV
# (`rope=triton_qkv_epilogue`) and the top-k inside the router GEMV (`routing=triton_router_epilogue`), one
# kernel fewer per layer each. The GPU kernel tests (new: both epilogues in bf16 inside CUDA graphs), then
# batch-1 decode at context 1024 per kernel for the three models' best-known candidate and the A/B without
# the epilogues (rope=triton_fused_cache, routing=triton; AB=0 skips it). At fd708d0 and 11981a0 the best-known
# candidate had both epilogues for every model; since, only dense models take the RoPE one. qwen3
# replays the routing profile in $ROUTING (default .routing/qwen3-30b-a3b_gsm8k_en.json, carried: a recorded
# Qwen3-30B-A3B selection table, see bench/README "Routing"); without the file, the Zipf-parametric one.
# TESTS_K: a pytest -k expression to run only some tests; ATHANOR_EPILOGUE_EARLY=1: see athanor.kernels.gemv.
#   ATHANOR_COMMIT=<hash> [AB=0] [ROUTING=FILE] [TESTS_K=EXPR] bash bench/gpu_epilogues.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 240 python3 -m pytest -q -s -m gpu tests/gpu/test_kernels_gpu.py tests/gpu/test_moe_gpu.py ${TESTS_K:+-k "$TESTS_K"} > "$OUT/gpu_tests.log" 2>&1
grep -E "qkv_rope_cache|router_topk|passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -20
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
echo "qwen3 routing: ${routing:-Zipf-parametric}"
mkdir -p /tmp/dense /tmp/moe  # the A/B files, one per kind (MoE keeps gate/up unfused); cells name them no_epilogues
for kind in dense:llama-3.2-1b moe:qwen3-30b-a3b; do
  python3 -c 'import sys; from athanor.moves import best_options, render; from athanor.model.presets import PRESETS
print(render("fast", {**best_options(PRESETS[sys.argv[1]]), "rope": "triton_fused_cache", "routing": "triton"}))' \
    ${kind#*:} > /tmp/${kind%%:*}/no_epilogues.py
done
cells=""
for m in llama-3.2-1b qwen3-30b-a3b llama-3.1-8b; do
  cells=$cells,$m:best:1:1024
  kind=dense; [ $m = qwen3-30b-a3b ] && kind=moe
  [ "${AB:-1}" = 0 ] || cells=$cells,$m:/tmp/$kind/no_epilogues.py:1:1024
done
timeout 320 python3 bench/decode_matrix.py --kernels --budget 280 --routing "$routing" --cells "${cells#,}" 2>&1 | tail -3
python3 bench/kernel_table.py "$OUT" 9
