#!/usr/bin/env bash
# One device call (< 10 min on an H200), issue 7: the MoE down projection at batch 1 as one program per strip that
# streams the token's experts in turn (`expert_sum_kernel`, the default) against the ticketed split version (one
# program per strip and pair, ATHANOR_EXPERT_SUM=split). The GPU test first (bit-identical outputs, each timed in a
# graph over 16 routings), then qwen3-30b-a3b's best-known candidate at batch 1, context 1024, per kernel, with the
# default, the split version, and the default again (A/B/A: the spread between the two A runs is the noise).
# Routing is replayed from $ROUTING (default .routing/qwen3-30b-a3b_gsm8k_en.json, carried; see bench/README
# "Routing"); without the file, the Zipf-parametric profile. JSON under $OUT/{one,split,one-again}.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_expert_sum.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 150 python3 -m pytest -q -s -m gpu tests/gpu/test_kernels_gpu.py -k expert_sum > "$OUT/gpu_tests.log" 2>&1
grep -E "expert sum|passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -8
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
echo "qwen3 routing: ${routing:-Zipf-parametric}"
for run in one split one-again; do
  mode=${run%-again}
  mkdir -p "$OUT/$run"
  OUT=$OUT/$run ATHANOR_EXPERT_SUM=$mode timeout 170 python3 bench/decode_matrix.py --kernels --budget 60 \
    --routing "$routing" --cells qwen3-30b-a3b:best:1:1024 2>&1 | tail -2
done
for run in one split one-again; do
  echo "== $run"; python3 bench/kernel_table.py "$OUT/$run" 9
done
