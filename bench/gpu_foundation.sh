#!/usr/bin/env bash
# One device call: the GPU tests, then the engine's swap benchmark on random-weight Llama shapes
# saved as HF directories (so the engine cold-starts from real files). Writes under $OUT.
#   ATHANOR_COMMIT=<hash> bash bench/gpu_foundation.sh
set -uo pipefail
OUT=${OUT:-bench/results}
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)'
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  make gpu-test PYTEST_ARGS="${TEST_ARGS:-}" 2>&1 | tee "$OUT/gpu-test.log" | tail -30
fi
export PYTHONPATH=$PWD/src:/tmp/athanor-site
# PRESET[:extra flags]; the 1B also times a torch.compile candidate's swap (cold, then warm caches).
for entry in ${SWAPS:-llama-3.2-1b:--compile llama-3.1-8b}; do
  preset=${entry%%:*}; extra=""; [ "$entry" != "$preset" ] && extra=${entry#*:}
  python3 -m athanor save-random "$preset" "/tmp/$preset" --device cuda --dtype bfloat16
  python3 -m athanor bench swap --model "/tmp/$preset" --device cuda --dtype bfloat16 $extra \
    --json "$OUT/swap-$preset-h200.json" 2>&1 | tail -5
done
