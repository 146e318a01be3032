#!/usr/bin/env bash
# One device call (< 6 minutes): the kernel GPU tests, then five decode cells at batch 1, context 1k.
#   run with carry [".whl"]:  bash bench/gpu_kernels_check.sh     (writes under $OUT)
# 1. As `make gpu-test PYTEST_ARGS=tests/gpu/test_kernels_gpu.py`, but only that file (the make
#    target always collects all of tests/gpu): install .whl/ beside the image's packages, run pytest
#    with PYTHONPATH=src. Log: $OUT/gpu-kernels-test.log.
# 2. bench/decode_matrix.py --cells (one process, each model loaded once; the records of
#    `athanor bench decode`): llama-3.2-1b reference, best, reference+compile; llama-3.1-8b
#    reference, best. JSON per cell: $OUT/decode_<model>_<candidate>_b1_c1024.json.
# 3. The test summary and the table, last.
source "$(dirname "$0")/_gpu_env.sh"
start=$SECONDS
nvidia-smi -L
python3 -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)'

timeout -k 10 170 python3 -m pytest tests/gpu/test_kernels_gpu.py tests/gpu/test_moe_gpu.py -q -m gpu -p no:cacheprovider -s \
  >"$OUT/gpu-kernels-test.log" 2>&1
test_rc=$?
echo "tests: exit $test_rc after $((SECONDS - start)) s (124: timed out)"

# Cheap cells first; the compile cell last. No cell starts after the budget; the whole step is
# killed at 340 s from the start, so the script ends within 6 minutes whatever happens.
cells=llama-3.2-1b:reference:1:1024,llama-3.2-1b:best:1:1024,llama-3.1-8b:reference:1:1024
cells=$cells,llama-3.1-8b:best:1:1024,llama-3.2-1b:reference+compile:1:1024
left=$((340 - (SECONDS - start)))
budget=$((left - 90))  # the compile cell of the 1B takes about a minute
[ "$budget" -lt 10 ] && budget=10
OUT=$OUT timeout -k 10 "$left" python3 bench/decode_matrix.py --cells "$cells" --budget "$budget" \
  >"$OUT/decode-cells.log" 2>&1
echo "bench: exit $? after $((SECONDS - start)) s (124: timed out; see $OUT/decode-cells.log)"

echo "=== tests/gpu/test_kernels_gpu.py ==="
grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$OUT/gpu-kernels-test.log" | tail -15
grep -E "relative error vs fp32" "$OUT/gpu-kernels-test.log" | tail -2
echo "=== decode, batch 1, context 1024 (ms/token, share of the HBM roofline) ==="
OUT=$OUT python3 bench/decode_matrix.py --table
exit "$test_rc"
