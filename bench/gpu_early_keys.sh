#!/usr/bin/env bash
# One device call (~6 min on an H200), issue 7: `early_keys` (each attention split program loads its first tile of
# cached keys and values before its PDL wait) against the best-known options, alternating in one process per model:
# qwen3-30b-a3b (recorded routing, $ROUTING) and llama-3.2-1b off/on/off/on, llama-3.1-8b off/on; batch 1, context
# 1024. The GPU attention tests first (the early tile against the waiting one, bit for bit, after the RoPE epilogue).
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_early_keys.sh
source "$(dirname "$0")/_gpu_env.sh"
gpu_tests 150 "attention or qkv_rope or early_keys"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
mkdir -p /tmp/e
cells=""
for m in qwen3-30b-a3b llama-3.2-1b llama-3.1-8b; do
  runs="1 2"; [ "$m" = llama-3.1-8b ] && runs="1"
  for r in $runs; do
    for on in False True; do
      variant /tmp/e/early_keys_${on}_${m}_$r.py "$m" early_keys="$on"
      cells=$cells,$m:/tmp/e/early_keys_${on}_${m}_$r.py:1:1024
    done
  done
done
timeout 420 python3 bench/decode_matrix.py --budget 400 --routing "$routing" --cells "${cells#,}" 2>&1 \
  | grep -E "ms +[0-9.]+% roofline|Error"
tar czf "$OUT/cells.tgz" -C "$OUT" $(cd "$OUT" && ls decode_*_b1_c1024.json) && rm -f "$OUT"/decode_*_b1_c1024.json
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
