#!/usr/bin/env bash
# One device call (~7 min on an H200), issue 7: qwen3-30b-a3b's routing inside its expert GEMVs
# (`routing=triton_expert_prologue`: every program ranks the router's logits itself, no routing launch), and the QKV
# GEMV's RoPE epilogue on qwen3 alone (measured before only together with the router epilogue), each against the
# MoE best-known options, alternating; then llama-3.2-1b's best-known three times and llama-3.1-8b's once (each cell
# records the autotuner's picks). GPU tests first: the self-routing expert GEMVs against the routing kernel's
# in a graph, the epilogues, the best-known candidates against the reference. Batch 1, context 1024, per kernel and
# critical path; qwen3 replays $ROUTING (carried).
#   ATHANOR_COMMIT=<hash> [ROUTING=FILE] bash bench/gpu_expert_routing.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 200 python3 -m pytest -q -s -m gpu tests/gpu/test_kernels_gpu.py tests/gpu/test_moe_gpu.py \
  -k "routes_itself or router_topk or qkv_rope_cache or best_candidate" > "$OUT/gpu_tests.log" 2>&1
grep -E "passed|failed|FAILED|Error|expert_gemv routing|router_topk 128" "$OUT/gpu_tests.log" | tail -8
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
mkdir -p /tmp/q /tmp/d
variant /tmp/q/best.py qwen3-30b-a3b
variant /tmp/q/prologue.py qwen3-30b-a3b routing=triton_expert_prologue
variant /tmp/q/rope_epilogue.py qwen3-30b-a3b rope=triton_qkv_epilogue
variant /tmp/q/both.py qwen3-30b-a3b routing=triton_expert_prologue rope=triton_qkv_epilogue
cp /tmp/q/best.py /tmp/q/best_again.py && cp /tmp/q/prologue.py /tmp/q/prologue_again.py
variant /tmp/d/best_1b_1.py llama-3.2-1b
cp /tmp/d/best_1b_1.py /tmp/d/best_1b_2.py && cp /tmp/d/best_1b_1.py /tmp/d/best_1b_3.py
cells=""
for c in best prologue rope_epilogue both best_again prologue_again; do cells=$cells,qwen3-30b-a3b:/tmp/q/$c.py:1:1024; done
for r in 1 2 3; do cells=$cells,llama-3.2-1b:/tmp/d/best_1b_$r.py:1:1024; done
cells=$cells,llama-3.1-8b:best:1:1024
timeout 400 python3 bench/decode_matrix.py --kernels --budget 370 --routing "$routing" --cells "${cells#,}" 2>&1 \
  | grep -E "ms +[0-9.]+% roofline|Error"
python3 bench/kernel_table.py "$OUT" 14 | grep -E "ms/token|critical|route|rope|expert|qkv" | head -80
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("decode_*_b1_c1024.json")):
    r = json.loads(f.read_text())
    print(f.stem, r.get("ms_per_token"), json.dumps(r.get("autotuned", {}))[:600])
PY
# The device returns a few files: the cells' records go back in one archive (decode_cells.json has them too).
tar czf "$OUT/cells.tgz" -C "$OUT" $(cd "$OUT" && ls decode_*_b1_c1024.json) && rm -f "$OUT"/decode_*_b1_c1024.json
