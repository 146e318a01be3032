#!/usr/bin/env bash
# One device call (~5 min on an H200), issue 7: `merge_early` (the attention merge kernel lets the O projection launch
# right after its wait), now in the dense best-known candidate, A/B against the same options without it: llama-3.2-1b
# three times each, alternating (its effect, ~25 us, is within one run's spread), llama-3.1-8b once each, and
# qwen3-30b-a3b's best-known (which keeps it off) once, with recorded routing from $ROUTING (carried). Batch 1,
# context 1024, per kernel and critical path.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_merge_early.sh
source "$(dirname "$0")/_gpu_env.sh"
gpu_tests 150 "best_candidate or attention"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
cells=""
for m in llama-3.2-1b llama-3.1-8b; do
  mkdir -p "/tmp/$m"
  for on in 0 1; do
    python3 -c 'import sys; from athanor.moves import best_options, render; from athanor.model.presets import PRESETS
print(render("fast", {**best_options(PRESETS[sys.argv[1]]), "merge_early": sys.argv[2] == "1"}))' "$m" $on \
      > "/tmp/$m/merge_early_$on.py"
  done
  runs="1"; [ $m = llama-3.2-1b ] && runs="1 2 3"
  for r in $runs; do
    for on in 0 1; do
      cp "/tmp/$m/merge_early_$on.py" "/tmp/$m/merge_early_${on}_run$r.py"
      cells=$cells,$m:/tmp/$m/merge_early_${on}_run$r.py:1:1024
    done
  done
done
cells=$cells,qwen3-30b-a3b:best:1:1024
timeout 450 python3 bench/decode_matrix.py --kernels --budget 420 --routing "$routing" --cells "${cells#,}" 2>&1 \
  | grep -E "ms +[0-9.]+% roofline|Error"
python3 bench/kernel_table.py "$OUT" 12 | grep -E "ms/token|merge|fused_gemv_kernel\[1|critical"
