#!/usr/bin/env bash
# One device call (< 9 min on an H200), issue 7: where batch-1 decode time goes. The best-known
# llama-3.2-1b candidate profiled per kernel (inside its CUDA graph), the same under torch.compile,
# a fused-weights torch-ops candidate under torch.compile with Inductor's coordinate-descent tuning
# (the gpt-fast recipe), the 8B best per kernel, then qwen3-30b-a3b at batch 1 (routing replayed
# from a Zipf-parametric profile unless ROUTING names a recorded one). JSON per cell under $OUT.
#   ATHANOR_COMMIT=<hash> bash bench/gpu_decode_account.sh
source "$(dirname "$0")/_gpu_env.sh"
export TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1
fused=/tmp/fused_torch_compile.py  # the template with fused QKV and gate/up, torch ops, torch.compile
python3 -c 'from athanor.moves.render import render; print(render("fast", {"fused_qkv": True, "fused_gate_up": True, "compile": "default"}))' > $fused
timeout 330 python3 bench/decode_matrix.py --kernels --budget 280 --cells \
llama-3.2-1b:best:1:1024,llama-3.2-1b:best+compile:1:1024,llama-3.2-1b:$fused:1:1024,\
llama-3.1-8b:best:1:1024 2>&1 | tail -12
timeout 200 python3 bench/decode_matrix.py --budget 150 ${ROUTING:+--routing $ROUTING} --cells \
qwen3-30b-a3b:best:1:1024,qwen3-30b-a3b:reference:1:1024 2>&1 | tail -8
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("decode_*_b1_c1024.json")):
    r = json.loads(f.read_text())
    if "kernels" not in r:
        continue
    print(f"\n{f.stem}: {r['ms_per_token']:.3f} ms/token, kernels {r['kernel_us_per_step']:.0f} us "
          f"({r['kernel_count_per_step']:.0f} launches), gaps {r['gap_us_per_step']:.0f} us")
    for k in r["kernels"][:12]:
        print(f"  {k['us_per_step']:8.1f} us  x{k['calls_per_step']:5.1f}  {k['name'][:90]}")
PY
