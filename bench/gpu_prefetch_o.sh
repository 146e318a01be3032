#!/usr/bin/env bash
# One device call (~6 min on an H200), issue 7: `prefetch_o` (the attention's split programs ask L2 for the O
# projection's weight, `athanor.kernels.jit.l2_prefetch`) at each place in the program against the best-known
# options, alternating in one process per model: qwen3-30b-a3b (recorded routing, $ROUTING) off/start/wait/keys
# twice, then llama-3.2-1b and llama-3.1-8b off/wait/keys once; batch 1, context 1024. The GPU attention tests
# first (the prefetching kernel's outputs against the plain one's, bit for bit).
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] [MODELS="..."] [WHERES="None keys:lines ..."] bash bench/gpu_prefetch_o.sh
source "$(dirname "$0")/_gpu_env.sh"
gpu_tests 120 "prefetch"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
mkdir -p /tmp/e
cells=""
for m in ${MODELS:-qwen3-30b-a3b llama-3.2-1b llama-3.1-8b}; do
  runs="1 2"; wheres=${WHERES:-None start wait keys}
  [ "$m" != qwen3-30b-a3b ] && runs="1" && wheres=${DENSE_WHERES:-None wait keys}
  for r in $runs; do
    for at in $wheres; do
      f=/tmp/e/prefetch_${at/:/_}_${m}_$r.py
      variant "$f" "$m" prefetch_o="$at"
      cells=$cells,$m:$f:1:1024
    done
  done
done
timeout 440 python3 bench/decode_matrix.py --budget 420 --routing "$routing" --cells "${cells#,}" 2>&1 \
  | grep -E "ms +[0-9.]+% roofline|Error"
tar czf "$OUT/cells.tgz" -C "$OUT" $(cd "$OUT" && ls decode_*_b1_c1024.json) && rm -f "$OUT"/decode_*_b1_c1024.json
