#!/usr/bin/env bash
# One device call (~8 min on an H200), issue 7: the step's ends for qwen3-30b-a3b at batch 1, context 1024 (recorded
# routing, $ROUTING): the final RMSNorm inside a Triton LM head (`lm_head=triton_fused`) and the embedding as a gather
# that lets the first QKV GEMV launch under it (`embedding=triton`), each and both against the best-known, alternating
# in one process, every cell profiled per kernel (the argmax waits under PDL in all of them). The GPU tests of the
# pieces first, with the LM head's GEMV timed alone against the norm kernel + cuBLAS.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_lm_head.sh
source "$(dirname "$0")/_gpu_env.sh"
gpu_tests 150 "embedding or route_rope_and_greedy or qwen3-lm-head" "fused gemv qwen3"
MODEL=qwen3-30b-a3b RUNS=2 PROFILE=1 BUDGET=330 \
  VARIANTS="best;lm_head=triton_fused;embedding=triton;lm_head=triton_fused embedding=triton" bash bench/gpu_variants.sh
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
