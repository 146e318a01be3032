#!/usr/bin/env bash
# One device call, issue 7: the weights read evict-first from L2 (`evict_weights`), against the best-known, alternating
# in one process per model (batch 1, context 1024; qwen3-30b-a3b on its recorded routing), each cell profiled; the
# GPU tests of the hint first (bit for bit through the engine's DecodeRunner). Each model's cells, clocks and kernel
# tables go under $OUT/<model>/, then into $OUT/evict.tgz (the device returns at most 8 files).
#   ATHANOR_COMMIT=<hash> [QWEN3_RUNS=3] [DENSE_RUNS=2] bash bench/gpu_evict.sh
here=$(dirname "$0")
source "$here/_gpu_env.sh"
gpu_tests 200 "evict_first_weights"
top=$OUT
for model in qwen3-30b-a3b llama-3.2-1b llama-3.1-8b; do
  if [ "$model" = qwen3-30b-a3b ]; then
    variants="best;evict_weights=experts;evict_weights=all"; runs=${QWEN3_RUNS:-3}
  else
    variants="best;evict_weights=all"; runs=${DENSE_RUNS:-2}
  fi
  echo "== $model"
  OUT=$top/$model MODEL=$model VARIANTS=$variants RUNS=$runs PROFILE=1 BUDGET=150 bash "$here/gpu_variants.sh"
done
tar czf "$top/evict.tgz" -C "$top" qwen3-30b-a3b llama-3.2-1b llama-3.1-8b && rm -rf "$top"/qwen3-30b-a3b "$top"/llama-3.2-1b "$top"/llama-3.1-8b
