#!/usr/bin/env bash
# One device call (< 10 min on an H200), issue 7: programmatic dependent launch across the batch-1
# decode chain (fused GEMVs, RoPE, attention, RMSNorm: each kernel's programs start while the one
# before drains) — the GPU tests of the kernels, engine and serving executor, then batch-1 decode at
# context 1024 per kernel with PDL and without (ATHANOR_PDL=0), for llama-3.2-1b, llama-3.1-8b and
# qwen3-30b-a3b. JSON under $OUT (without PDL: $OUT/nopdl; VARIANT=late: the fused GEMV triggering the
# next launch after its weight stream instead of at its start, $OUT/late). Results of earlier runs:
# results/pdl/ (commit bd916e9, PDL triggered late, against no PDL) and results/pdl-early/ (db8d6eb,
# late against early, then set by ATHANOR_PDL_EARLY=1).
#   ATHANOR_COMMIT=<hash> [VARIANT=late] bash bench/gpu_pdl.sh
source "$(dirname "$0")/_gpu_env.sh"
timeout 260 python3 -m pytest -q -m gpu tests/gpu/test_kernels_gpu.py tests/gpu/test_moe_gpu.py tests/gpu/test_serve_gpu.py \
  tests/gpu/test_engine_gpu.py 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -15
cells=llama-3.2-1b:best:1:1024,llama-3.1-8b:best:1:1024,qwen3-30b-a3b:best:1:1024
timeout 170 python3 bench/decode_matrix.py --kernels --budget 130 --cells $cells 2>&1 | tail -3
variant=${VARIANT:-nopdl}  # nopdl: ATHANOR_PDL=0; late: ATHANOR_PDL_EARLY=0 (1B and 8B only)
mkdir -p "$OUT/$variant"
if [ "$variant" = late ]; then
  OUT="$OUT/late" ATHANOR_PDL_EARLY=0 timeout 120 python3 bench/decode_matrix.py --kernels --budget 80 \
    --cells llama-3.2-1b:best:1:1024,llama-3.1-8b:best:1:1024 2>&1 | tail -2
else
  OUT="$OUT/nopdl" ATHANOR_PDL=0 timeout 150 python3 bench/decode_matrix.py --kernels --budget 110 --cells $cells 2>&1 | tail -3
fi
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("decode_*_b1_c1024.json")):
    r = json.loads(f.read_text())
    other = next((out / d / f.name for d in ("nopdl", "late", "early") if (out / d / f.name).exists()), None)
    off = json.loads(other.read_text()) if other else {}
    print(f"\n{f.stem}: PDL {r.get('ms_per_token', float('nan')):.3f} ms/token "
          f"(kernels {r.get('kernel_us_per_step', 0):.0f} us, gaps {r.get('gap_us_per_step', 0):.0f} us), "
          f"{other.parent.name if other else '-'} {off.get('ms_per_token', float('nan')):.3f} ms {r.get('error', '')[-300:]}")
    for k in r.get("kernels", [])[:8]:
        print(f"  {k['us_per_step']:8.1f} us  x{k['calls_per_step']:5.1f}  {k['name'][:90]}")
PY
