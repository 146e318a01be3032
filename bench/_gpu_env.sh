# Sourced by the bench/gpu_*.sh device scripts: $OUT, unbuffered output, and the wheels the GPU
# image lacks (`make gpu-wheels`, carried as .whl) installed beside the image's packages, with this
# tree's sources first on the path.
set -uo pipefail
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
# The device reaches nothing: pip's download of the embedded model's wheel (for the scripts' real text) then
# fails at once instead of after ~8 s of retries in every process's first evaluation; the text falls back
# to the corpus' bytes (athanor.evaluate.scripts).
export PYTHONUNBUFFERED=1 OUT PIP_NO_INDEX=1
# Once a call: a device script that runs another (bench/gpu_evict.sh runs gpu_variants.sh per model) inherits the
# path and cache variables, and neither installs again nor restores the carried caches over what it has tuned.
if [ -z "${ATHANOR_GPU_ENV:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/athanor-site .whl/*.whl
  export PYTHONPATH=$PWD/src:/tmp/athanor-site
  # The compiler caches (Triton kernels and autotuning results) where the engines look for them, restored from a
  # carried .compile_cache/compile_cache.tgz (an earlier call's $OUT/compile_cache.tgz) when there is one.
  # Where the engines keep them, exported for this process too (bench/decode_matrix.py's in-process engine): its Triton
  # kernels and autotuning results are kept and reused as the engine workers' are, instead of tuned afresh in every
  # call (the same 1B code read 0.898 and 0.924 ms in two calls, one kernel's share of the step apart: a different
  # pick, likely).
  eval "$(python3 -c 'from athanor.engine.config import EngineConfig
config = EngineConfig(model="")
print(f"export COMPILE_CACHE={config.compile_cache_dir()}")
for k, v in config.cache_env().items(): print(f"export {k}={v}")')"
  if [ -f .compile_cache/compile_cache.tgz ]; then
    mkdir -p "$COMPILE_CACHE" && tar xzf .compile_cache/compile_cache.tgz -C "$COMPILE_CACHE" && echo "compiler caches restored"
  fi
  export ATHANOR_GPU_ENV=1
fi

# The candidate files of an A/B (see bench/gpu_qwen3_rope.sh):
variant() {  # variant FILE MODEL KEY=VALUE...: the model's best-known options with some changed (VALUE a Python
  # literal, True or 1 say, else a string)
  python3 -c 'import sys; from athanor.moves import best_options, parse_settings, render; from athanor.model.presets import PRESETS
opts = best_options(PRESETS[sys.argv[1]])
opts.update(parse_settings(sys.argv[2:]))
print(render("fast", opts))' "${@:2}" > "$1"
}

gpu_tests() {  # gpu_tests SECONDS EXPR [PATTERN]: the GPU kernel tests matching -k EXPR into $OUT/gpu_tests.log, then
  # its summary lines (and those matching PATTERN: the tests' printed timings); GPU_TEST_FILES names other test files
  # (by default the kernels' and MoE's; e.g. tests/gpu/test_engine_gpu.py tests/gpu/test_serve_gpu.py too)
  # shellcheck disable=SC2086
  timeout "$1" python3 -m pytest -q -s -m gpu ${GPU_TEST_FILES:-tests/gpu/test_kernels_gpu.py tests/gpu/test_moe_gpu.py} \
    -k "$2" > "$OUT/gpu_tests.log" 2>&1
  grep -E "passed|failed|FAILED|Error${3:+|$3}" "$OUT/gpu_tests.log" | tail -8
}

log_clocks() {  # log_clocks: the GPU's SM and memory clocks, power and temperature every second into $OUT/clocks.csv
  # (in the background, for this call), and its active clock limits when the call exits ($OUT/performance.txt): a
  # cell that reads slow after minutes of load may be a clock that dropped, not the code
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 1000 \
    > "$OUT/clocks.csv" 2>&1 &
  trap 'kill %1 2>/dev/null; nvidia-smi -q -d PERFORMANCE,CLOCK > "$OUT/performance.txt" 2>&1' EXIT
}
