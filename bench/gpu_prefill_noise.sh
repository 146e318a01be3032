#!/usr/bin/env bash
# One device call (~3 min), issue 6: why the fast tier's eager prefill timings are noisy on the H200 (the tier
# benchmark at 7693494 read an incumbent cv of 6-28% and an incumbent-vs-twin spread up to 200% for a
# 6-layer llama-3.1-8b prefill of 2048 tokens, against 0.1-0.3% for the captured decode). The engines of both
# tiers run as in bench/tiers.py; the fast tier screens for TIME_LIMIT seconds with the caching allocator's
# defaults, then with expandable segments. The workers log the allocator's device allocations and retries of
# every trajectory that made any (athanor.engine.trajectory).
#   ATHANOR_COMMIT=<hash> bash bench/gpu_prefill_noise.sh   (carry [".whl", ".compile_cache"])
source "$(dirname "$0")/_gpu_env.sh"
# The workers' logs live in their supervisors' temporary directories, removed when the engines stop: copy them
# as the run goes.
mkdir -p "$OUT/workers"
(while sleep 2; do for d in /tmp/ath-*; do cp "$d/worker.log" "$OUT/workers/${d#/tmp/}.log" 2>/dev/null; done; done) &
for name in ${CONFS:-default expandable_segments}; do
  conf=""; [ "$name" = default ] || conf="$name:True"
  PYTORCH_CUDA_ALLOC_CONF=$conf timeout 200 python3 bench/tiers.py --model llama-3.1-8b --device cuda \
    --dtype bfloat16 --candidates 100 --slow-first 0 --time-limit "${TIME_LIMIT:-45}" \
    --run-dir "$OUT/run_$name" --out "$OUT/$name" -v > "$OUT/$name.log" 2>&1
  echo "== $name: rc=$?"
  grep -E "prefill b=|allocation" "$OUT/$name.log" | cut -c12-200 | tail -24
done
sleep 3; grep -h "allocation" "$OUT"/workers/*.log | cut -c12-200 | tail -30
