#!/usr/bin/env bash
# One device call (~5 min on an H200), issue 7: `lm_head=triton_fused embedding=triton` on the dense models against
# their best-known (llama-3.2-1b twice, llama-3.1-8b once, alternating), batch 1, context 1024, after the engine's
# and serving's GPU step tests. At ccf91f1 the same call first timed qwen3-30b-a3b's step with its two output copies in
# one launch against two clones (`bench/env_sweep.py --var ATHANOR_OUTPUT_COPIES --configs 2`): neutral, and that
# copy was reverted with its knob (`bench/results/step-copies-ccf91f1/`).
#   ATHANOR_COMMIT=<hash> bash bench/gpu_step_copies.sh
source "$(dirname "$0")/_gpu_env.sh"
GPU_TEST_FILES="tests/gpu/test_engine_gpu.py tests/gpu/test_serve_gpu.py tests/gpu/test_kernels_gpu.py" \
  gpu_tests 150 "captured_decode_equals_eager or chained or greedy"
dense="best;lm_head=triton_fused embedding=triton"
MODEL=llama-3.2-1b RUNS=2 BUDGET=60 VARIANTS=$dense bash bench/gpu_variants.sh && mv "$OUT/cells.tgz" "$OUT/cells_1b.tgz"
MODEL=llama-3.1-8b RUNS=1 BUDGET=60 VARIANTS=$dense bash bench/gpu_variants.sh && mv "$OUT/cells.tgz" "$OUT/cells_8b.tgz"
