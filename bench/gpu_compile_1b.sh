#!/usr/bin/env bash
# One device call (< 10 min on an H200), issue 6: an 8-minute `athanor compile` of the llama-3.2-1b
# shape (random weights, bf16, variant search only, built-in chat traffic), then the winner's
# batch-1 decode at context 1024 through the engine's captured path (target: <= 1.28 ms/token,
# the gpt-fast-style torch.compile figure measured on this H200). Run directory under $OUT.
#   ATHANOR_COMMIT=<hash> bash bench/gpu_compile_1b.sh
source "$(dirname "$0")/_gpu_env.sh"
run="$OUT/compile-llama-3.2-1b-h200"
t0=$(date +%s)
timeout 530 python3 -m athanor compile --model llama-3.2-1b --traffic preset:chat --budget 8m --agents variant \
  --device cuda --dtype bfloat16 --out "$run" > "$OUT/compile-1b.log" 2>&1
echo "compile rc=$? wall $(( $(date +%s) - t0 )) s"; grep -E "^\[|winner|verified|speedup" "$OUT/compile-1b.log" | tail -20
rm -f "$run"/*.db-shm "$run"/*.db-wal
if [ -f "$run/winner/candidate.py" ]; then
  timeout 50 python3 -m athanor bench decode --model llama-3.2-1b --batch 1 --context 1024 --device cuda \
    --dtype bfloat16 --candidate "$run/winner/candidate.py" --json "$OUT/decode_compile_winner_1b_b1_c1024.json" | tail -3
fi
