#!/usr/bin/env bash
# One device call (~3 min on an H200), issue 7: where a batch-1 decode step's wall goes, kernel by kernel, for the
# three models' best-known candidates at context 1024 (`--kernels`: per-kernel times, and the step's critical path,
# `athanor.moves.decode_bench.critical_path`: each kernel's share of the wall, the projections of a layer apart).
# qwen3 replays $ROUTING (default .routing/qwen3-30b-a3b_gsm8k_en.json, carried; see bench/README "Routing").
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_decode_path.sh
source "$(dirname "$0")/_gpu_env.sh"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
echo "qwen3 routing: ${routing:-Zipf-parametric}"
timeout 400 python3 bench/decode_matrix.py --kernels --budget 360 --routing "$routing" \
  --cells llama-3.2-1b:best:1:1024,qwen3-30b-a3b:best:1:1024,llama-3.1-8b:best:1:1024 2>&1 | tail -3
python3 bench/kernel_table.py "$OUT" 8
