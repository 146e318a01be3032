#!/usr/bin/env bash
# One device call: the GPU tests, then the engine's swap benchmark on random-weight Llama shapes
# saved as HF directories (so the engine cold-starts from real files). Writes under $OUT.
set -uo pipefail
OUT=${OUT:-bench/results}
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)'
make gpu-test 2>&1 | tee "$OUT/gpu-test.log" | tail -25
export PYTHONPATH=$PWD/src:/tmp/athanor-site
for preset in ${PRESETS:-llama-3.2-1b llama-3.1-8b}; do
  python3 -m athanor save-random "$preset" "/tmp/$preset" --device cuda --dtype bfloat16
  python3 -m athanor bench swap --model "/tmp/$preset" --device cuda --dtype bfloat16 ${SWAP_ARGS:-} \
    --json "$OUT/swap-$preset-h200.json" 2>&1 | tail -15
done
