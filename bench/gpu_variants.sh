#!/usr/bin/env bash
# One device call, issue 7: variants of a model's best-known candidate timed alternately in one process (batch 1,
# context 1024; qwen3-30b-a3b on its recorded routing, $ROUTING), RUNS rounds of every variant in turn, after the
# GPU kernel tests matching TESTS (none when empty). A variant is "best" or space-separated option=value pairs (a
# value is a Python literal, else a string); variants are separated by ";".
# PROFILE=1 profiles every cell per kernel too (in the cells' records: `bench/kernel_table.py DIR`).
#   ATHANOR_COMMIT=<hash> MODEL=qwen3-30b-a3b VARIANTS="best;prefetch_o=merge;merge_early=True" [RUNS=2] \
#     [TESTS=EXPR] [BUDGET=420] [PROFILE=1] bash bench/gpu_variants.sh
source "$(dirname "$0")/_gpu_env.sh"
log_clocks
[ -n "${TESTS:-}" ] && gpu_tests 150 "$TESTS"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
model=${MODEL:-qwen3-30b-a3b}
mkdir -p /tmp/e
cells=""
IFS=';' read -ra variants <<< "${VARIANTS:-best}"
for r in $(seq "${RUNS:-2}"); do
  for i in "${!variants[@]}"; do
    f=/tmp/e/variant${i}_${model}_$r.py
    [ "${variants[$i]}" = best ] && variant "$f" "$model" || variant "$f" "$model" ${variants[$i]}
    cells=$cells,$model:$f:1:1024
  done
done
for i in "${!variants[@]}"; do echo "variant$i: ${variants[$i]}"; done | tee "$OUT/variants.txt"
timeout $((${BUDGET:-420} + 20)) python3 bench/decode_matrix.py --budget "${BUDGET:-420}" --routing "$routing" \
  --cells "${cells#,}" ${PROFILE:+--kernels} 2>&1 | grep -E "ms +[0-9.]+% roofline|Error"
tar czf "$OUT/cells.tgz" -C "$OUT" $(cd "$OUT" && ls decode_*_b1_c1024.json) && rm -f "$OUT"/decode_*_b1_c1024.json
