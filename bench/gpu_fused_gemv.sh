#!/usr/bin/env bash
# One device call (< 10 min on an H200), issues 7 and 8: the fused-GEMV move (norm/SiLU prologues,
# residual epilogues, split-K reduced in-kernel) against cuBLAS per projection and in whole batch-1
# decode steps (1B and 8B, per kernel), its verdict against the best-known candidate, the chained
# serving steps' GPU test, and one stream through the server. JSON under $OUT.
#   ATHANOR_COMMIT=<hash> bash bench/gpu_fused_gemv.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 200 python3 -m pytest -q -s -m gpu tests/gpu/test_kernels_gpu.py tests/gpu/test_moe_gpu.py tests/gpu/test_serve_gpu.py \
  -k "fused_linear or chained" 2>&1 | grep -E "fused gemv|passed|failed|Error|assert" | tail -40
best=/tmp/best_dense.py fused=/tmp/fused_gemv.py  # the best-known dense candidate, and it with gemv=triton_fused
python3 -c 'from athanor.moves import best_options, render; from athanor.model.presets import PRESETS
print(render("fast", best_options(PRESETS["llama-3.2-1b"])))' > $best
python3 -c 'from athanor.moves import best_options, render; from athanor.model.presets import PRESETS
print(render("fast", {**best_options(PRESETS["llama-3.2-1b"]), "gemv": "triton_fused"}))' > $fused
timeout 200 python3 bench/serve_stream.py --model llama-3.2-1b --device cuda --dtype bfloat16 \
  --out "$OUT/serve_stream_cuda.json" > "$OUT/serve-stream.log" 2>&1
echo "serve_stream rc=$?"; tail -5 "$OUT/serve-stream.log"
timeout 200 python3 bench/decode_matrix.py --kernels --budget 150 --cells \
llama-3.2-1b:$fused:1:1024,llama-3.1-8b:$fused:1:1024 2>&1 | tail -4
timeout 150 python3 -m athanor evaluate $fused --incumbent $best --model llama-3.2-1b --device cuda \
  --dtype bfloat16 --tier fast --json "$OUT/evaluate_fused_vs_best_1b.json" 2>&1 | tail -4
python3 bench/kernel_table.py "$OUT" 8
