#!/usr/bin/env bash
# One device call, issue 7: a process's first decode cell against its next ones (`bench/first_cell.py`), qwen3-30b-a3b
# on recorded routing, a fresh process for each of RUNS (";"-separated first_cell.py options and NAME=VALUE settings of
# its environment; "evict_none" stands for --candidate with the best-known's evict_weights=None); then the issue's
# command, a process each, CLI_RUNS times, and once for each of CLI_MODELS (at batch 1, context 1024). TESTS=EXPR: the
# GPU tests matching it first (engine, serving, kernels, MoE).
#   ATHANOR_COMMIT=<hash> [TESTS=EXPR] [RUNS="--bandwidth-first;--empty-cache;"] [CELLS=3] [CLI_RUNS=1] \
#     [CLI_MODELS="llama-3.2-1b llama-3.1-8b"] bash bench/gpu_first_cell.sh
source "$(dirname "$0")/_gpu_env.sh"
log_clocks
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -n "${TESTS:-}" ] && GPU_TEST_FILES="tests/gpu/test_engine_gpu.py tests/gpu/test_serve_gpu.py tests/gpu/test_kernels_gpu.py
  tests/gpu/test_moe_gpu.py" gpu_tests 240 "$TESTS"
mkdir -p /tmp/f && variant /tmp/f/evict_none.py qwen3-30b-a3b evict_weights=None
IFS=";" read -ra runs <<< "${RUNS-;--prealloc-mb 512}"  # RUNS="": none
for run in "${runs[@]}"; do
  settings=() options=()
  for word in ${run//evict_none/--candidate /tmp/f/evict_none.py}; do
    [[ $word == [A-Z]*=* ]] && settings+=("$word") || options+=("$word")
  done
  echo "run: $run"
  timeout 170 env "${settings[@]}" python3 bench/first_cell.py --routing "$routing" --cells "${CELLS:-3}" "${options[@]}" \
    2>&1 | grep -E ": prealloc|first:|Error"
done
cli() {  # cli MODEL NAME [--routing FILE]: the issue's command in a fresh process, its figure and windows
  timeout 150 python3 -m athanor bench decode --model "$1" --batch 1 --context 1024 --candidate best "${@:3}" \
    --windows 3 --json "$OUT/cli_$2.json" 2>&1 | tail -1
}
for r in $(seq "${CLI_RUNS:-1}"); do cli qwen3-30b-a3b "qwen3_$r" --routing "$routing"; done
for model in ${CLI_MODELS:-}; do cli "$model" "$model"; done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("cli_*.json")):
    r = json.loads(f.read_text())
    print(f"{f.stem:22} {r.get('ms_per_token', float('nan')):.4f} ms  windows", [round(w, 4) for w in r.get("window_ms", [])])
PY
