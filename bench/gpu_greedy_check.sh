#!/usr/bin/env bash
# One device call (< 5 min on an H200): the engine and model GPU tests (graphs, swaps, captured ==
# eager), then batch-1 decode with the argmax graph: llama-3.2-1b reference and best (per kernel),
# llama-3.1-8b best. JSON per cell under $OUT.
#   ATHANOR_COMMIT=<hash> bash bench/gpu_greedy_check.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 200 python3 -m pytest tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py -q -m gpu -p no:cacheprovider \
  2>&1 | tail -4
timeout 200 python3 bench/decode_matrix.py --kernels --budget 150 --cells \
llama-3.2-1b:best:1:1024,llama-3.2-1b:reference:1:1024,llama-3.1-8b:best:1:1024 2>&1 | grep -E "ms|error" | tail -6
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("decode_*_b1_c1024.json")):
    r = json.loads(f.read_text())
    if "kernels" in r:
        print(f"\n{f.stem}: {r['ms_per_token']:.3f} ms/token, kernels {r['kernel_us_per_step']:.0f} us "
              f"({r['kernel_count_per_step']:.0f} launches), gaps {r['gap_us_per_step']:.0f} us")
        for k in r["kernels"][:14]:
            print(f"  {k['us_per_step']:8.1f} us  x{k['calls_per_step']:5.1f}  {k['name'][:90]}")
PY
