#!/usr/bin/env bash
# One device call (< 9 min on an H200): the evaluator's GPU tests, three A/A runs of the whole random
# llama-3.2-1b in bf16 (bench/evaluate_noise.py), and one stream through `athanor serve` against the
# bare batch-1 step (bench/serve_stream.py); JSON and logs under $OUT, tables last.
#   ATHANOR_COMMIT=<hash> bash bench/gpu_evaluate_check.sh
source "$(dirname "$0")/_gpu_env.sh"
nvidia-smi -L
python3 -c 'import torch, sys; print(sys.version.split()[0], torch.__version__)'
python3 -c 'import fastapi, uvicorn, openai, zmq, optuna, sqlalchemy' || echo 'MISSING WHEELS'
timeout 240 python3 -m pytest tests/gpu/test_evaluate_gpu.py -q -m gpu -p no:cacheprovider -rA \
  -o log_cli=true --log-cli-level=INFO 2>&1 | tee "$OUT/gpu-evaluate-test.log" \
  | grep -E "statistic|A/A|passed|failed|PASSED|FAILED|Error|assert" | tail -40
test_rc=${PIPESTATUS[0]}
timeout 220 python3 bench/evaluate_noise.py --model llama-3.2-1b --device cuda --dtype bfloat16 --tier slow \
  --max-seqs 8 --max-seq-len 512 --pairs 200 --prefill-pairs 32 --budget 1.5 --runs 3 --out "$OUT" \
  2>&1 | tee "$OUT/evaluate-noise-cuda.log" | tail -6
noise_rc=${PIPESTATUS[0]}
timeout 150 python3 bench/serve_stream.py --model llama-3.2-1b --device cuda --dtype bfloat16 \
  --out "$OUT/serve_stream_cuda.json" > "$OUT/serve-stream.log" 2>&1
echo "serve_stream rc=$?"; tail -8 "$OUT/serve-stream.log"
python3 - "$OUT/evaluate_noise_cuda.json" "$test_rc" "$noise_rc" <<'PY'
import json, sys
path, test_rc, noise_rc = sys.argv[1:]
print(f"\nGPU tests (tests/gpu/test_evaluate_gpu.py): {'passed' if test_rc == '0' else 'FAILED rc=' + test_rc}"
      f"   evaluate_noise: rc={noise_rc}")
try:
    runs = json.load(open(path))["runs"]
except (OSError, ValueError, KeyError) as e:
    sys.exit(f"no {path}: {e}")
print(f"{'run':>3} {'A/A low':>8} {'A/A high':>9} {'within 2%':>9} {'A/B low':>8} {'A/B high':>9}  shapes: kind b ctx pairs stat cv(A) cv(B) run-to-run")
for i, r in enumerate(runs):
    aa, ab = r["aa"] or {}, r["speedup"]
    ok = bool(aa) and 0.98 <= aa["ci_low"] <= aa["ci_high"] <= 1.02
    shapes = "; ".join(f"{s['kind'][0]} {s['batch_size']} {s['context_len']} {s['num_pairs']} "
                       f"{'pair' if s['paired'] else 'q25'} {100 * s['incumbent_cv']:.2f}% {100 * s['candidate_cv']:.2f}% "
                       f"{100 * s['repeatability']:.2f}%" for s in r["shapes"])
    print(f"{i:>3} {aa.get('ci_low', float('nan')):8.4f} {aa.get('ci_high', float('nan')):9.4f} {str(ok):>9} "
          f"{ab['ci_low']:8.4f} {ab['ci_high']:9.4f}  {shapes}")
PY
