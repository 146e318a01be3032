#!/usr/bin/env bash
# One device call, issue 7: a process's first decode cell against its second (`bench/first_cell.py`), qwen3-30b-a3b's
# best-known on recorded routing, in fresh processes with and without PREALLOC_MB allocated and freed first.
#   ATHANOR_COMMIT=<hash> [PREALLOCS="0 512 0 512"] bash bench/gpu_first_cell.sh
source "$(dirname "$0")/_gpu_env.sh"
log_clocks
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
for mb in ${PREALLOCS:-0 512 0 512}; do
  timeout 150 python3 bench/first_cell.py --routing "$routing" --prealloc-mb "$mb" 2>&1 | grep -E "^prealloc|Error"
done
