#!/usr/bin/env bash
# One device call (~7 min on an H200), issue 7: the expert GEMVs' weight loads vectorised (`expert_rows`: the expert's
# weight picked as scalars, not by a select of two pointer tiles, which compiled to 2-byte loads) on qwen3-30b-a3b at
# batch 1, context 1024 (recorded routing, $ROUTING), against the tree before it ($BASE: `git archive <commit> src
# bench | tar x -C .ab_base`, carried), alternating in separate processes (base, new, base, new), per kernel. The GPU
# tests of the MoE kernels first.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] [BASE=.ab_base] bash bench/gpu_expert_loads.sh
source "$(dirname "$0")/_gpu_env.sh"
gpu_tests 180 "expert or moe_block or linear_route or moe_experts or router_topk"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
base=${BASE:-.ab_base}
out=$OUT
for r in 1 2; do
  for tree in base new; do
    if [ "$tree" = base ]; then root=$PWD/$base; else root=$PWD; fi
    mkdir -p "$out/${tree}_$r"
    OUT=$out/${tree}_$r PYTHONPATH=$root/src:/tmp/athanor-site timeout 200 python3 "$root/bench/decode_matrix.py" \
      --kernels --budget 150 --routing "$routing" --cells qwen3-30b-a3b:best:1:1024 2>&1 \
      | grep -E "ms +[0-9.]+% roofline|Error" | sed "s/^/${tree}_$r: /"
  done
done
for r in 1 2; do for tree in base new; do
  echo "== ${tree}_$r"; python3 bench/kernel_table.py "$out/${tree}_$r" 14 | grep -E "ms/token|critical|expert" | head -8
done; done
tar czf "$out/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$out/compile_cache.tgz"
