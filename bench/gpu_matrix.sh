#!/usr/bin/env bash
# Device calls of issue 7's decode matrix, each within the issue's 8 minutes: the best-known candidate against the
# reference at batch 1 to 128 and context 1k to 32k, and the reference under torch.compile at batch 1 and 32, context
# 1k and 32k; qwen3-30b-a3b's routing replayed from the recorded profile ($ROUTING, carried as .routing). Each run of
# cells loads its model once and starts no cell after its budget (the rest are recorded as skipped); a KV cache that
# does not fit is recorded with its bytes. The call's cells are gathered into $OUT/decode_matrix_h200_call<CALL>.json.
#   CALL=1: llama-3.2-1b and llama-3.1-8b, best and reference (24 cells each)
#   CALL=2: qwen3-30b-a3b best (12 cells), then its reference at batch 1 and 8
#   CALL=3: the reference under torch.compile, llama-3.2-1b (4 cells) and llama-3.1-8b at batch 1 (2)
#   CALL=4: the same, llama-3.1-8b at batch 32 and qwen3-30b-a3b at batch 1 (2 each)
#   CALL=5: qwen3-30b-a3b's reference at batch 32 and 128 (6 cells), and under torch.compile at batch 32 (2)
#   ATHANOR_COMMIT=<hash> CALL=1 bash bench/gpu_matrix.sh
source "$(dirname "$0")/_gpu_env.sh"
log_clocks
routing=${ROUTING:-.routing/qwen3-30b-a3b_gsm8k_en.json}
[ -f "$routing" ] || routing=""
cells() {  # MODEL CANDIDATE "BATCH:CONTEXT ..." -> MODEL:CANDIDATE:B:C,...
  local out=""; for bc in $3; do out+="$1:$2:$bc,"; done; echo "${out%,}"
}
grid="1:1024 8:1024 32:1024 128:1024 1:8192 8:8192 32:8192 128:8192 1:32768 8:32768 32:32768 128:32768"
run() {  # run TIMEOUT BUDGET CELLS
  # the table of the cells so far (not the per-cell progress lines), each cell's figure, fit or error
  timeout "$1" python3 bench/decode_matrix.py --budget "$2" --routing "$routing" --cells "$3" 2>&1 \
    | grep -vE "^decode_" | grep -E " ms|does not fit|skipped|rror" | tail -40
}
case "${CALL:-1}" in
  1) run 150 110 "$(cells llama-3.2-1b best "$grid"),$(cells llama-3.2-1b reference "$grid")"
     run 210 170 "$(cells llama-3.1-8b best "$grid"),$(cells llama-3.1-8b reference "$grid")" ;;
  2) run 430 380 "$(cells qwen3-30b-a3b best "$grid"),$(cells qwen3-30b-a3b reference "1:1024 8:1024 1:8192 8:8192 1:32768 8:32768")" ;;
  3) run 150 100 "$(cells llama-3.2-1b reference+compile "1:1024 32:1024 1:32768 32:32768")"
     run 210 150 "$(cells llama-3.1-8b reference+compile "1:1024 1:32768")" ;;
  4) run 210 150 "$(cells llama-3.1-8b reference+compile "32:1024 32:32768")"
     run 230 170 "$(cells qwen3-30b-a3b reference+compile "1:1024 1:32768")" ;;
  5) run 400 300 "$(cells qwen3-30b-a3b reference "32:1024 128:1024 32:8192 128:8192 32:32768 128:32768"),$(cells qwen3-30b-a3b reference+compile "32:1024 32:32768")" ;;
  *) echo "CALL must be 1 to 5" >&2; exit 2 ;;
esac
python3 - "$OUT" "${CALL:-1}" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
cells = []
for f in sorted(out.glob("decode_*.json")):
    r = json.loads(f.read_text())
    if isinstance(r, dict):
        cells.append(r)
        f.unlink()
(out / f"decode_matrix_h200_call{sys.argv[2]}.json").write_text(json.dumps(cells, indent=1) + "\n")
print(f"{len(cells)} cells -> decode_matrix_h200_call{sys.argv[2]}.json")
PY
rm -f "$OUT/decode_cells.json"
