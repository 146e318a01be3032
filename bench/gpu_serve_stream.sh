#!/usr/bin/env bash
# One device call (< 4 min on an H200), issue 8: one stream through `athanor serve` against the bare
# batch-1 step (bench/serve_stream.py, llama-3.2-1b random weights, bf16). JSON under $OUT.
#   ATHANOR_COMMIT=<hash> bash bench/gpu_serve_stream.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 200 python3 bench/serve_stream.py --model llama-3.2-1b --device cuda --dtype bfloat16 \
  --out "$OUT/serve_stream_cuda.json" > "$OUT/serve-stream.log" 2>&1
echo "serve_stream rc=$?"; tail -8 "$OUT/serve-stream.log"
