#!/usr/bin/env bash
# One device call, issue 7: a process's first decode cell against its next ones (`bench/first_cell.py`), qwen3-30b-a3b
# on recorded routing, a fresh process for each of RUNS (";"-separated first_cell.py options and NAME=VALUE settings of
# its environment; "evict_none" stands for --candidate with the best-known's evict_weights=None); then the issue's
# command, a process each, CLI_RUNS times.
#   ATHANOR_COMMIT=<hash> [RUNS="--bandwidth-first;--empty-cache;"] [CELLS=3] [CLI_RUNS=1] bash bench/gpu_first_cell.sh
source "$(dirname "$0")/_gpu_env.sh"
log_clocks
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
mkdir -p /tmp/f && variant /tmp/f/evict_none.py qwen3-30b-a3b evict_weights=None
IFS=';' read -ra runs <<< "${RUNS:-;--prealloc-mb 512}"
for run in "${runs[@]}"; do
  settings=() options=()
  for word in ${run//evict_none/--candidate /tmp/f/evict_none.py}; do
    [[ $word == [A-Z]*=* ]] && settings+=("$word") || options+=("$word")
  done
  echo "run: $run"
  timeout 170 env "${settings[@]}" python3 bench/first_cell.py --routing "$routing" --cells "${CELLS:-3}" "${options[@]}" \
    2>&1 | grep -E ": prealloc|first:|Error"
done
for r in $(seq "${CLI_RUNS:-1}"); do
  timeout 120 python3 -m athanor bench decode --model qwen3-30b-a3b --batch 1 --context 1024 --candidate best \
    --routing "$routing" --windows 3 --json "$OUT/cli_qwen3_$r.json" 2>&1 | tail -1
done
