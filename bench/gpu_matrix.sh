#!/usr/bin/env bash
# One device call (< 10 min on an H200), issue 7: the decode matrix — the best-known candidate against
# the reference for llama-3.2-1b and llama-3.1-8b at batch 1 to 128 and context 1k to 32k, qwen3-30b-a3b
# (routing replayed from a Zipf-parametric profile) at context 1k, and the reference under torch.compile.
# Each invocation stops starting cells after its budget (the rest are recorded as skipped); a KV cache
# that does not fit is recorded with its bytes. All cells are gathered into one JSON under $OUT.
#   ATHANOR_COMMIT=<hash> bash bench/gpu_matrix.sh
source "$(dirname "$0")/_gpu_env.sh"
cells() {  # MODEL CANDIDATE "BATCH:CONTEXT ..." -> MODEL:CANDIDATE:B:C,...
  local out=""; for bc in $3; do out+="$1:$2:$bc,"; done; echo "${out%,}"
}
grid="1:1024 8:1024 32:1024 128:1024 1:8192 8:8192 32:8192 128:8192 1:32768 8:32768 32:32768 128:32768"
run() { timeout "$1" python3 bench/decode_matrix.py --budget "$2" --cells "$3" 2>&1 | tail -2; }
run 150 110 "$(cells llama-3.2-1b best "$grid"),$(cells llama-3.2-1b reference "$grid")"
run 150 110 "$(cells llama-3.1-8b best "$grid"),$(cells llama-3.1-8b reference "$grid")"
run 120 80 "$(cells qwen3-30b-a3b best "1:1024 8:1024 32:1024 128:1024 1:8192"),qwen3-30b-a3b:reference:1:1024"
run 150 100 "$(cells llama-3.2-1b reference+compile "1:1024 32:1024 1:32768 32:32768")"
python3 bench/decode_matrix.py --table
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
cells = []
for f in sorted(out.glob("decode_*.json")):
    r = json.loads(f.read_text())
    f.unlink()
    if isinstance(r, dict):
        cells.append(r)
(out / "decode_matrix_h200.json").write_text(json.dumps(cells, indent=1) + "\n")
print(f"{len(cells)} cells -> decode_matrix_h200.json")
PY
