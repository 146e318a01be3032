#!/usr/bin/env bash
# One device call (~6 min on an H200), issue 7: the fused GEMVs reading the residual row for its RMS in one load
# (ATHANOR_WIDE_RSTD=1, the default) against BLOCK_K chunks (=0, as before), the best-known candidates at batch 1,
# context 1024: llama-3.2-1b, llama-3.1-8b and qwen3-30b-a3b (recorded routing, $ROUTING) in one process per setting,
# then qwen3 and the 1B again in a second pair; per kernel and critical path. GPU tests of the kernels first.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_wide_rstd.sh
source "$(dirname "$0")/_gpu_env.sh"
gpu_tests 150 "best_candidate or fused_linear or qkv_rope or expert or linear_route"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
all=qwen3-30b-a3b:best:1:1024,llama-3.2-1b:best:1:1024,llama-3.1-8b:best:1:1024
for run in "0 1 $all" "1 1 $all" "0 2 ${all%,llama-3.1-8b*}" "1 2 ${all%,llama-3.1-8b*}"; do
  set -- $run
  mkdir -p "$OUT/wide$1_$2"
  OUT=$OUT/wide$1_$2 ATHANOR_WIDE_RSTD=$1 timeout 150 python3 bench/decode_matrix.py --kernels --budget 120 \
    --routing "$routing" --cells "$3" 2>&1 | grep -E "ms +[0-9.]+% roofline|Error" | sed "s/^/wide=$1 #$2 /"
done
for d in "$OUT"/wide*; do
  python3 bench/kernel_table.py "$d" 14 | grep -E "ms/token|critical" | sed "s|^|$(basename "$d") |"
  tar czf "$d/cells.tgz" -C "$d" $(cd "$d" && ls decode_*_b1_c1024.json) && rm -f "$d"/decode_*_b1_c1024.json
done
