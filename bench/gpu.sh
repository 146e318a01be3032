#!/usr/bin/env bash
# Run a named benchmark set on a GPU machine, one device call each.
#
#   bench/gpu.sh table           every H200 row of bench/README.md's table (about 8 minutes on one H200)
#   bench/gpu.sh long            the long-prompt rows: bench prefill of llama-3.1-8b, 16k-128k tokens (~4 min, H100)
#   bench/gpu.sh matrix          the decode grid: three models x best, reference x batch 1-128 x context 1k-32k
#   bench/gpu.sh evaluate        the evaluator on llama-3.2-1b: its A/A noise floor and the planted candidate (~3 min)
#   bench/gpu.sh grid            the plan's calibration grid: three models x best x batch 1-256 x context 1k-32k
#   bench/gpu.sh serve           serving llama-3.1-8b (best-known candidate, paged KV pool, --no-canary) through
#                                athanor serve: Azure conversation (1,000 requests, prompts <= 4k) at concurrency 64,
#                                128 and 256; 32 prompts of 1,024 tokens at once against the bare batch-32 step; then
#                                a second start of the same server, its kernels from its compile cache (~8 min)
#   bench/gpu.sh mooncake        the same server on the Mooncake conversation trace (300 requests, prompts <= 32k,
#                                concurrency 32) and Azure at concurrency 8 and 32; then one prompt alone, 16k-128k
#                                tokens (~9 min). Both serving sets read the traces from $TRACES (default
#                                shared/traces)
#   bench/gpu.sh tests [ARGS]    the GPU tests (default: all of tests/gpu; ARGS are pytest's, e.g. one file)
#
# It installs the wheels the GPU image lacks (`make gpu-wheels` gathers them into .whl/; carry .whl), puts this
# tree's src/ first on the path, and writes one JSON record per command under $OUT (default bench/results): eight
# for the table, three for the matrix. Carry .routing/ too: qwen3-30b-a3b replays the expert routing recorded
# there (bench/README.md, "Routing"). Where the tree travels without its .git, ATHANOR_COMMIT=<hash> names the
# commit in the records; nothing else needs setting.
set -uo pipefail
cd "$(dirname "$0")/.."
set_name=${1:-}
[ $# -gt 0 ] && shift
case "$set_name" in
  table|long|matrix|evaluate|grid|serve|mooncake|tests) ;;
  *) echo "usage: bench/gpu.sh table|long|matrix|evaluate|grid|serve|mooncake|tests [pytest args]  (the sets are listed at the top of bench/gpu.sh)" >&2
     exit 2 ;;
esac

OUT=${OUT:-bench/results}
mkdir -p "$OUT"
site=/tmp/athanor-site
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
else
  echo "no wheels in .whl/: using the packages installed here (an image without them: make gpu-wheels, carry .whl)"
fi
# The device reaches no index: pip fails at once instead of retrying.
export PYTHONPATH=$PWD/src:$site PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
# "NVIDIA H200" -> h200, "NVIDIA H100 80GB HBM3" -> h100: the model number, else the name's last word
tag=$(echo "$gpu" | grep -oiE '\b[a-z][0-9]{3}\b' | head -1 | tr '[:upper:]' '[:lower:]')
[ -n "$tag" ] || tag=$(echo "${gpu##* }" | tr '[:upper:]' '[:lower:]')
echo "$gpu; records under $OUT"

routing=.routing/qwen3-30b-a3b_gsm8k_en.json
qwen3_routing=(--routing "$routing")
if [ ! -f "$routing" ]; then
  echo "no $routing: qwen3-30b-a3b runs on the default routing profile, not the table's (bench/README.md, Routing)"
  qwen3_routing=()
fi

failed=()
start=$SECONDS
step() {  # step SECONDS ARGS...: one athanor command under a time limit; its summary lines and its wall time
  local limit=$1 t0=$SECONDS
  shift
  echo "--- athanor $*"
  timeout -s INT -k 15 "$limit" python3 -m athanor "$@"  # SIGINT: a benchmark cut short writes what it has
  local rc=$?
  [ $rc -eq 0 ] || failed+=("athanor $* (exit $rc)")
  echo "    ($((SECONDS - t0)) s)"
}
decode() {  # decode MODEL CANDIDATES NAME ARGS...: a grid of decode cells, one process, into
  # $OUT/decode_MODEL[_NAME]_TAG.json
  local model=$1 candidate=$2 name=${3:+_$3}
  shift 3
  local extra=()
  [ "$model" = qwen3-30b-a3b ] && extra=("${qwen3_routing[@]}")
  step 420 bench decode --model "$model" --candidate "$candidate" --device cuda --dtype bfloat16 "${extra[@]}" \
    "$@" --json "$OUT/decode_${model}${name}_$tag.json"
}

evaluate() {
  step 240 bench evaluate --model llama-3.2-1b --device cuda --dtype bfloat16 --tier slow --max-seqs 8 \
    --max-seq-len 512 --pairs 200 --prefill-pairs 32 --budget 1.5 --runs 3 \
    --json "$OUT/evaluate_llama-3.2-1b_$tag.json"
}

case "$set_name" in
  evaluate) evaluate ;;
  table)
    for model in llama-3.2-1b llama-3.1-8b; do
      decode "$model" best best --batch 1,32 --context 1024,32768
      decode "$model" reference,reference+compile reference --batch 1 --context 1024
    done
    # One process: qwen3 loads once. 10 steps at least bound its reference's cells (0.1-1 s a step, host-bound);
    # the best cells still run a second each.
    decode qwen3-30b-a3b best,reference "" --batch 1,32 --context 1024,32768 --iters 10
    # The engine cold-starts from files, as it would from a downloaded model.
    step 120 save-random llama-3.1-8b /tmp/llama-3.1-8b --device cuda --dtype bfloat16
    step 180 bench swap --model /tmp/llama-3.1-8b --device cuda --dtype bfloat16 \
      --json "$OUT/swap_llama-3.1-8b_$tag.json"
    evaluate
    step 180 bench serve-stream --model llama-3.2-1b --device cuda --json "$OUT/serve_stream_llama-3.2-1b_$tag.json"
    ;;
  long)
    step 420 bench prefill --model llama-3.1-8b --device cuda --dtype bfloat16 --candidate reference,best \
      --tokens 16384,32768,65536,131072 --repeats 1 --json "$OUT/prefill_llama-3.1-8b_$tag.json"
    ;;
  matrix)
    for model in llama-3.2-1b llama-3.1-8b qwen3-30b-a3b; do
      # 20 steps at least: qwen3's reference takes up to a second a step at batch 32-128.
      decode "$model" best,reference matrix --batch 1,8,32,128 --context 1024,8192,32768 --iters 20
    done
    ;;
  grid)
    # `athanor plan --calibrate` fits on batch {1, 8, 64} x context {1k, 8k} and is scored on the other cells.
    for model in llama-3.2-1b llama-3.1-8b qwen3-30b-a3b; do
      decode "$model" best grid --batch 1,8,32,64,128,256 --context 1024,8192,32768 --iters 20
    done
    ;;
  serve|mooncake)
    traces=${TRACES:-shared/traces}
    step 60 candidate new --from best --model llama-3.1-8b --device cuda -o /tmp/best-llama-3.1-8b.py --force
    step 60 candidate pack /tmp/best-llama-3.1-8b.py -o /tmp/best-llama-3.1-8b --force
    start_server() {  # start_server NAME: athanor serve in the background, waited for; its start time printed
      python3 -m athanor serve llama-3.1-8b --candidate /tmp/best-llama-3.1-8b --no-canary --max-seqs 256 \
        --max-model-len 33792 --port 8000 > "$OUT/serve_llama-3.1-8b_$1_$tag.log" 2>&1 &
      server=$!
      local t0=$SECONDS
      until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
        if ! kill -0 $server 2>/dev/null || [ $((SECONDS - t0)) -gt 300 ]; then
          failed+=("athanor serve ($1) did not come up"); tail -5 "$OUT/serve_llama-3.1-8b_$1_$tag.log"; return
        fi
        sleep 1
      done
      echo "    ($1 start: up in $((SECONDS - t0)) s; $(grep -m1 -o 'KV pool of [0-9]* tokens' "$OUT/serve_llama-3.1-8b_$1_$tag.log"))"
    }
    stop_server() { kill -INT $server; wait $server 2>/dev/null; }
    azure() {  # azure CONCURRENCY LIMIT REQUESTS
      step "$2" bench serve --base-url http://127.0.0.1:8000 --trace "$traces/azure_llm_2023_conv.csv" \
        --max-requests "$3" --max-input 4096 --concurrency "$1" --speedup 1000 \
        --json "$OUT/serve_azure_c$1_llama-3.1-8b_$tag.json"
    }
    start_server cold
    if [ "$set_name" = serve ]; then
      azure 64 120 1000
      azure 128 110 1000
      azure 256 100 1000
      # Decode overhead: 32 prompts of 1,024 tokens at once, 256 tokens out, against the bare batch-32 step.
      step 60 bench serve --base-url http://127.0.0.1:8000 --random-input-len 1024 --random-output-len 256 \
        --num-prompts 32 --concurrency 32 --json "$OUT/serve_decode32_llama-3.1-8b_$tag.json"
      stop_server
      decode llama-3.1-8b best b32 --batch 32 --context 1152
      start_server warm  # the same candidate again: its compiled kernels from the server's cache
      stop_server
    else
      step 200 bench serve --base-url http://127.0.0.1:8000 --trace "$traces/mooncake_conversation.jsonl" \
        --max-requests 300 --max-input 32768 --max-output 256 --concurrency 32 --speedup 1000 \
        --json "$OUT/serve_mooncake_llama-3.1-8b_$tag.json"
      azure 8 90 200
      azure 32 90 500
      stop_server
      step 300 bench prefill --model llama-3.1-8b --device cuda --dtype bfloat16 --candidate best \
        --tokens 16384,32768,65536,131072 --repeats 1 --json "$OUT/prefill_llama-3.1-8b_$tag.json"
    fi
    ;;
  tests)
    [ $# -gt 0 ] || set -- tests/gpu
    echo "--- pytest -m gpu $*"
    python3 -m pytest -q -m gpu -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu_tests.log" | tail -30
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || failed+=("pytest $* (exit $rc)")
    ;;
esac

echo "=== bench/gpu.sh $set_name: $((SECONDS - start)) s, ${#failed[@]} failed"
for f in "${failed[@]}"; do echo "FAILED: $f"; done
[ ${#failed[@]} -eq 0 ]
