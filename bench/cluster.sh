#!/usr/bin/env bash
# Screening on a Ray cluster against one worker (the compile loop's scaling on CPU), on this machine:
#
#   bench/cluster.sh [BUDGET]     default 6m; needs athanor[cluster] and two cores
#
# Starts a local Ray cluster of two nodes as separate processes (a head and one more node, one CPU each: one pinned
# screener per node) and runs `athanor bench compile` of tiny-dense for the chat preset over it for BUDGET, then once
# more with one worker pinned to core 0 (`taskset -c 0`) for the same BUDGET. Both keep their store in PostgreSQL
# where ATHANOR_TEST_POSTGRES_URL names a server (scripts/start_postgres.sh starts one), else in SQLite. Writes
# $OUT/compile_cluster_tiny-dense_cpu.json and $OUT/compile_alone_tiny-dense_cpu.json (default bench/results) and
# prints the sessions' progress, their summaries and the ratio of candidates screened.
set -euo pipefail
cd "$(dirname "$0")/.."
budget=${1:-6m}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
PY=${PYTHON:-.venv/bin/python}
port=$($PY -c "from athanor.serve.launch import free_port; print(free_port())")
ray() { RAY_USAGE_STATS_ENABLED=0 "$PY" -m ray.scripts.scripts "$@" >/dev/null 2>&1; }
trap 'ray stop --force || true' EXIT
ray start --head --port="$port" --num-cpus=1 --include-dashboard=false --disable-usage-stats
ray start --address="127.0.0.1:$port" --num-cpus=1 --disable-usage-stats
store=${ATHANOR_TEST_POSTGRES_URL:-}
bench() {  # bench NAME PREFIX...: one `athanor bench compile` under PREFIX (possibly none), its record in $OUT
  local name=$1
  shift
  "$@" "$PY" -m athanor bench compile --model tiny-dense --traffic preset:chat --device cpu --budget "$budget" \
    --decode-context 0 ${store:+--store "$store"} ${cluster:+--cluster "$cluster"} \
    --json "$OUT/compile_${name}_tiny-dense_cpu.json"  # progress on stderr, the summary last
}
cluster=127.0.0.1:$port bench cluster
ray stop --force
cluster="" bench alone taskset -c 0
"$PY" -c "
import json, sys
c, a = (json.load(open(f'$OUT/compile_{n}_tiny-dense_cpu.json'))['screened'] for n in ('cluster', 'alone'))
print(f'screened in $budget: the cluster {c}, one worker {a}: x{c / max(a, 1):.2f}')"
