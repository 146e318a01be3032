#!/usr/bin/env bash
# One device call (~9 min on an H200), issue 7, after bench/gpu_lm_head.sh: qwen3-30b-a3b's Triton LM head config
# tuned inside the whole captured step (`bench/step_tune.py`), the argmax's chunk and PDL wait against the best-known
# (`bench/env_sweep.py`, alternating), then `lm_head=triton_fused embedding=triton` on the dense models against their
# best-known (llama-3.2-1b twice, llama-3.1-8b once, alternating). Batch 1, context 1024, qwen3 on recorded routing.
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_lm_head_tune.sh
source "$(dirname "$0")/_gpu_env.sh"
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
timeout 200 python3 bench/step_tune.py --model qwen3-30b-a3b --kernels fused_gemv_kernel ${routing:+--routing "$routing"} \
  --budget 100 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -16
timeout 170 python3 bench/env_sweep.py --model qwen3-30b-a3b --candidate best --var ATHANOR_ARGMAX_CHUNK \
  --configs "4096;8192;1024;2048 ATHANOR_ARGMAX_PDL=0" --budget 60 ${routing:+--routing "$routing"} 2>&1 \
  | grep -vE "^\s*$|Warning|warn" | tail -16
dense="best;lm_head=triton_fused embedding=triton"
MODEL=llama-3.2-1b RUNS=2 BUDGET=60 VARIANTS=$dense bash bench/gpu_variants.sh && mv "$OUT/cells.tgz" "$OUT/cells_1b.tgz"
MODEL=llama-3.1-8b RUNS=1 BUDGET=60 VARIANTS=$dense bash bench/gpu_variants.sh && mv "$OUT/cells.tgz" "$OUT/cells_8b.tgz"
tar czf "$OUT/compile_cache.tgz" -C "$COMPILE_CACHE" triton 2>/dev/null && du -h "$OUT/compile_cache.tgz"
