#!/usr/bin/env bash
# One device call, issue 7: qwen3-30b-a3b's best-known through the CLI, a process per cell as a user runs it
# (`athanor bench decode`, recorded routing), each cell timed again WINDOWS times after its figure (`window_ms`: a
# steady state or a transient), CLI_RUNS processes; then the router sums' spacing (ATHANOR_SUMS_SPREAD, 128 by
# default) against others alternating in one process (`bench/env_sweep.py`).
#   ATHANOR_COMMIT=<hash> [CLI_RUNS=2] [WINDOWS=6] [CONFIGS="64;256;1;64;256"] bash bench/gpu_sums_spread.sh
source "$(dirname "$0")/_gpu_env.sh"
log_clocks
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
for r in $(seq "${CLI_RUNS:-2}"); do
  timeout 120 python3 -m athanor bench decode --model qwen3-30b-a3b --batch 1 --context 1024 --candidate best \
    --routing "$routing" --windows "${WINDOWS:-6}" --json "$OUT/cli_qwen3_$r.json" 2>&1 | tail -1
  python3 -c 'import json, sys; print("  windows:", [round(w, 4) for w in json.load(open(sys.argv[1]))["window_ms"]])' \
    "$OUT/cli_qwen3_$r.json"
done
timeout 300 python3 bench/env_sweep.py --model qwen3-30b-a3b --routing "$routing" --candidate best \
  --var ATHANOR_SUMS_SPREAD --configs "${CONFIGS:-64;256;1;64;256}" --budget 150 2>&1 | tail -15
