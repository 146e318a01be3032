#!/usr/bin/env bash
# One device call, issue 7: qwen3-30b-a3b's router sums packed (ATHANOR_SUMS_SPREAD=1) against spread apart (16: a
# 128-byte line each; 64), alternating in one process (`bench/env_sweep.py`, recorded routing), then the best-known
# through the CLI a process per cell, as a user runs it (`athanor bench decode`), packed and at 16 alternately.
#   ATHANOR_COMMIT=<hash> [CONFIGS="16;64;1;16"] [CLI_RUNS=1] bash bench/gpu_sums_spread.sh
source "$(dirname "$0")/_gpu_env.sh"
log_clocks
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
timeout 300 python3 bench/env_sweep.py --model qwen3-30b-a3b --routing "$routing" --candidate best \
  --var ATHANOR_SUMS_SPREAD --configs "${CONFIGS:-16;64;1;16}" --budget 150 2>&1 | tail -16
for r in $(seq "${CLI_RUNS:-1}"); do
  for spread in 1 16; do
    ATHANOR_SUMS_SPREAD=$spread timeout 120 python3 -m athanor bench decode --model qwen3-30b-a3b --batch 1 \
      --context 1024 --candidate best --routing "$routing" --json "$OUT/cli_qwen3_spread${spread}_$r.json" 2>&1 | tail -1
  done
done
