#!/usr/bin/env bash
# One device call (~5 min on an H200), issue 7: a decode step's inputs staged into the graph's buffers with one
# multi-tensor copy (`torch._foreach_copy_`, 4 copies of a greedy step in one launch) and `step_again`'s two position
# increments in one. The GPU tests that cover staging (captured = eager over greedy and sampling steps, a swap's
# recapture, chained steps = unchained), then batch-1 decode at context 1024 per kernel and critical path for the
# three models' best-known candidates (the 1B twice); qwen3 replays $ROUTING (carried).
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_input_staging.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 240 python3 -m pytest -q -s -m gpu tests/gpu/test_engine_gpu.py tests/gpu/test_serve_gpu.py \
  -k "captured_decode or swap_recaptures or chained" > "$OUT/gpu_tests.log" 2>&1
grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -6
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
mkdir -p /tmp/again && python3 -c 'from athanor.moves import best_candidate; from athanor.model.presets import PRESETS
print(best_candidate(PRESETS["llama-3.2-1b"]))' > /tmp/again/best_again.py
timeout 330 python3 bench/decode_matrix.py --kernels --budget 300 --routing "$routing" \
  --cells llama-3.2-1b:best:1:1024,llama-3.2-1b:/tmp/again/best_again.py:1:1024,llama-3.1-8b:best:1:1024,qwen3-30b-a3b:best:1:1024 \
  2>&1 | grep -E "ms +[0-9.]+% roofline|Error"
python3 bench/kernel_table.py "$OUT" 12 | grep -E "ms/token|Memcpy|foreach|multi_tensor|critical|add|indexSelect"
