#!/usr/bin/env bash
# One device call (< 10 min), issue 6: a piece of the tier benchmark for the llama-3.1-8b shape
# (bench/tiers.py: CANDIDATES candidates of the variant agent (default 50), the first SLOW_FIRST (30) on the
# fast and the slow tier, the rest on the fast tier; too long for one device command, so it runs in pieces,
# one lane per GPU on nvidia-h200-x2). The store comes back in $OUT/tiers_run, the log (with each script's
# cost) in $OUT/tiers.log, and the compiler caches (Triton kernels and autotuning results) in
# $OUT/compile_cache.tgz.
# First call:  ATHANOR_COMMIT=<hash> TIME_LIMIT=400 bash bench/gpu_tiers.sh
# Later calls: copy the returned tiers_run/ to .tiers_run/ and compile_cache.tgz to .compile_cache/ in the
#              checkout (both git-ignored), carry them (carry [".whl", ".tiers_run", ".compile_cache"]) and
#              run with RESUME=1; TIME_LIMIT (s) starts no candidate later. The caches make a later call
#              start where a resumed run on one machine would: with the kernels compiled and tuned.
# TIERS_TIMEOUT (s, default 560) bounds the run where this script shares a call with another.
# A first call may carry .compile_cache too (an earlier run's): it then starts as a continuous compiler's
# later runs do, with the kernels compiled and tuned. Each tier's engines start before the candidates and
# are timed apart (startup.json in the run directory); the replay charges them once.
# The engine slots come from athanor.loop.memory (16 for the 8B on an H200). A call that reaches CANDIDATES goes on
# to confirm on the slow tier what the replay needs (~1 min each, after the slow engines' ~35 s start): leave room.
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
timeout "${TIERS_TIMEOUT:-560}" python3 bench/tiers.py --model llama-3.1-8b --device cuda --dtype bfloat16 \
  --candidates "${CANDIDATES:-50}" --slow-first "${SLOW_FIRST:-30}" \
  --run-dir "$OUT/tiers_run" --time-limit "${TIME_LIMIT:-330}" --out "$OUT" $lanes $flag -v > "$OUT/tiers.log" 2>&1
echo "tiers rc=$?"
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
grep -E "cascade: (correctness|timing|slow|smoke)|supervisor: engine worker" "$OUT/tiers.log" | cut -c12-220 | tail -40
grep -vE " (athanor|root|triton|torch)[.:a-z_]*: " "$OUT/tiers.log" | tail -60
