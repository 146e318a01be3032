#!/usr/bin/env bash
# One device call (~3 min on an H200), issue 7: the engine's greedy step with one Triton argmax launch (split over
# the vocabulary, reduced by a ticket) instead of PyTorch's reductions, staging only the inputs the argmax graph
# reads (4 copies, not 7). The GPU tests that cover them (graph = eager across greedy and sampling steps; argmax
# against torch at a 128k vocabulary), then batch-1 decode at context 1024 per kernel for llama-3.2-1b and
# llama-3.1-8b's best-known candidates. JSON under $OUT.
#   ATHANOR_COMMIT=<hash> bash bench/gpu_greedy_step.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 150 python3 -m pytest -q -s -m gpu tests/gpu/test_engine_gpu.py tests/gpu/test_kernels_gpu.py tests/gpu/test_moe_gpu.py \
  -k "captured_decode or greedy" > "$OUT/gpu_tests.log" 2>&1
grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -8
timeout 200 python3 bench/decode_matrix.py --kernels --budget 150 \
  --cells llama-3.2-1b:best:1:1024,llama-3.1-8b:best:1:1024 2>&1 | tail -3
python3 bench/kernel_table.py "$OUT" 12
