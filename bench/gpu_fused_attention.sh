#!/usr/bin/env bash
# One device call (< 10 min on an H200), issue 7: attention as one kernel per layer (RoPE, Qwen3's q/k
# norms, the KV-cache write, split-KV attention and the ticket merge of its splits: `attention=triton_fused`)
# and routing by rank in one short PDL kernel, with the expert down GEMV reading its ids and first weight
# tile before it waits. The GPU tests (TESTS=kernels: the kernel tests only; default: kernels, engine,
# serving), then batch-1 decode at context 1024 per kernel for the three models' best-known candidate
# (attention as split kernel + merge kernel), and for 1B and qwen3 the same with `attention=triton_fused`
# as the A/B (AB=0 skips it). At 44c8d21 and e7f26c4 the roles were swapped: the best-known candidate
# had the fused attention, the A/B file (split_kv) the split one. JSON under $OUT.
#   ATHANOR_COMMIT=<hash> [TESTS=kernels] [AB=0] bash bench/gpu_fused_attention.sh
source "$(dirname "$0")/_gpu_env.sh"
tests="tests/gpu/test_kernels_gpu.py tests/gpu/test_moe_gpu.py tests/gpu/test_serve_gpu.py tests/gpu/test_engine_gpu.py"
[ "${TESTS:-}" = kernels ] && tests="tests/gpu/test_kernels_gpu.py tests/gpu/test_moe_gpu.py"
timeout 250 python3 -m pytest -q -s -m gpu $tests > "$OUT/gpu_tests.log" 2>&1
grep -E "rope_cache_attention|passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -20
fused=/tmp/fused_attention.py
python3 -c 'from athanor.moves import best_options, render; from athanor.model.presets import PRESETS
print(render("fast", {**best_options(PRESETS["llama-3.2-1b"]), "attention": "triton_fused"}))' > $fused
cells=llama-3.2-1b:best:1:1024,qwen3-30b-a3b:best:1:1024,llama-3.1-8b:best:1:1024
[ "${AB:-1}" = 0 ] || cells=$cells,llama-3.2-1b:$fused:1:1024,qwen3-30b-a3b:$fused:1:1024
timeout 300 python3 bench/decode_matrix.py --kernels --budget 250 --cells $cells 2>&1 | tail -3
python3 bench/kernel_table.py "$OUT" 9
