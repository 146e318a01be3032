#!/usr/bin/env bash
# One device call, issue 7: a process's first decode cell against its next ones (`bench/first_cell.py`), qwen3-30b-a3b's
# best-known on recorded routing, in fresh processes with and without PREALLOC_MB allocated and freed first (the
# attention's addresses and kernel times per cell); then the issue's command, a process each, CLI_RUNS times.
#   ATHANOR_COMMIT=<hash> [PREALLOCS="0 512"] [CELLS=3] [CLI_RUNS=1] bash bench/gpu_first_cell.sh
source "$(dirname "$0")/_gpu_env.sh"
log_clocks
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
for mb in ${PREALLOCS:-0 512}; do
  timeout 170 python3 bench/first_cell.py --routing "$routing" --prealloc-mb "$mb" --cells "${CELLS:-3}" 2>&1 \
    | grep -E "^prealloc|pointers|Error"
done
for r in $(seq "${CLI_RUNS:-1}"); do
  timeout 120 python3 -m athanor bench decode --model qwen3-30b-a3b --batch 1 --context 1024 --candidate best \
    --routing "$routing" --windows 3 --json "$OUT/cli_qwen3_$r.json" 2>&1 | tail -1
done
