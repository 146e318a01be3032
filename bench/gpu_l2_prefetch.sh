#!/usr/bin/env bash
# One device call (< 10 min on an H200), issue 7: the split-KV attention's programs pull the O projection's weight
# into L2 before they wait for q (`l2_prefetch`, athanor.kernels.jit.prefetch), so the O GEMV after attention reads
# it from L2 instead of HBM. The GPU kernel tests of attention (new: the prefetch changes no value, in a graph),
# then batch-1 decode at context 1024 per kernel for the three models' best-known candidate with and without it.
# qwen3 replays $ROUTING (default .routing/qwen3-30b-a3b_gsm8k_en.json, carried; see bench/README "Routing").
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_l2_prefetch.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 150 python3 -m pytest -q -s -m gpu tests/gpu/test_kernels_gpu.py -k "attention" > "$OUT/gpu_tests.log" 2>&1
grep -E "prefetch|passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -12
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
echo "qwen3 routing: ${routing:-Zipf-parametric}"
cells=""
for m in llama-3.2-1b qwen3-30b-a3b llama-3.1-8b; do
  mkdir -p "/tmp/$m"
  for pf in 0 1; do  # the best-known options, l2_prefetch off and on (files named for the cells' JSON)
    python3 -c 'import sys; from athanor.moves import best_options, render; from athanor.model.presets import PRESETS
print(render("fast", {**best_options(PRESETS[sys.argv[1]]), "l2_prefetch": sys.argv[2] == "1"}))' "$m" $pf \
      > "/tmp/$m/l2_prefetch_$pf.py"
    cells=$cells,$m:/tmp/$m/l2_prefetch_$pf.py:1:1024
  done
done
timeout 400 python3 bench/decode_matrix.py --kernels --budget 360 --routing "$routing" --cells "${cells#,}" 2>&1 | tail -3
python3 bench/kernel_table.py "$OUT" 9
