#!/usr/bin/env bash
# One device call (< 10 min), issue 6: a piece of the tier benchmark for the llama-3.1-8b shape
# (bench/tiers.py: 30 candidates of the variant agent, each on the fast and the slow tier; ~40 minutes of
# one H200 in all, so it runs in pieces, one lane per GPU on nvidia-h200-x2). The store comes back in
# $OUT/tiers_run, the log (with each script's cost) in $OUT/tiers.log.
# First call:  ATHANOR_COMMIT=$(git rev-parse HEAD) TIME_LIMIT=400 bash bench/gpu_tiers.sh
# Later calls: copy the returned tiers_run/ to .tiers_run/ in the checkout (git-ignored), carry it
#              (carry [".whl", ".tiers_run"]) and run with RESUME=1; TIME_LIMIT (s) starts no candidate later.
# The engine slots come from athanor.loop.memory (16 for the 8B on an H200). At ac77469 two calls on two GPUs
# (TIME_LIMIT 400 and 280) ran 18 candidates; that store is the one to resume.
source "$(dirname "$0")/_gpu_env.sh"
mkdir -p "$OUT/tiers_run"
flag=""
if [ -n "${RESUME:-}" ]; then
  cp -r .tiers_run/. "$OUT/tiers_run/" && flag=--resume
fi
lanes=""
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  lanes="--devices cuda:0,cuda:1"  # one lane per GPU (nvidia-h200-x2): twice the candidates per call
fi
timeout 570 python3 bench/tiers.py --model llama-3.1-8b --device cuda --dtype bfloat16 --candidates 30 \
  --run-dir "$OUT/tiers_run" --time-limit "${TIME_LIMIT:-330}" --out "$OUT" $lanes $flag -v > "$OUT/tiers.log" 2>&1
echo "tiers rc=$?"
grep -E "cascade: (correctness|timing|slow|smoke)|supervisor: engine worker" "$OUT/tiers.log" | cut -c12-220 | tail -60
grep -vE " (athanor|root|triton|torch)[.:a-z_]*: " "$OUT/tiers.log" | tail -40
