#!/usr/bin/env bash
# One device call (< 8 min on an H200), issue 7: the attention merge at batch 1, the step's critical path says, costs
# a launch and ~1.8 us a layer on the 1B (decode_bench.critical_path). Two variants of the best-known candidates,
# each a run of bench/decode_matrix.py under an environment knob, between two runs of the code as it is:
#   base                 split kernel, then the merge kernel (the O projection launches when the merge exits)
#   ATHANOR_ATTN_MERGE=ticket   the last split program of each KV head merges its heads (one launch fewer a layer)
#   ATHANOR_MERGE_EARLY=1       the merge kernel lets the O projection launch right after its wait
# llama-3.2-1b and qwen3-30b-a3b (recorded routing from $ROUTING, carried) at batch 1, context 1024, per kernel.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_attention_merge.sh
source "$(dirname "$0")/_gpu_env.sh"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
cells=llama-3.2-1b:best:1:1024,qwen3-30b-a3b:best:1:1024
top=$OUT
for variant in base ticket early base_again; do
  export OUT=$top/$variant
  mkdir -p "$OUT"
  case $variant in
    ticket) env=ATHANOR_ATTN_MERGE=ticket ;;
    early) env=ATHANOR_MERGE_EARLY=1 ;;
    *) env=ATHANOR_ATTN_MERGE=kernel ;;
  esac
  env $env timeout 200 python3 bench/decode_matrix.py --kernels --budget 170 --routing "$routing" --cells $cells \
    2>&1 | grep -E "ms +[0-9.]+% roofline|Error" | sed "s/^/$variant: /"
done
for variant in base ticket early base_again; do
  echo "== $variant"; python3 bench/kernel_table.py "$top/$variant" 12 | grep -E "ms/token|attention|fused_gemv_kernel\[1|critical"
done
