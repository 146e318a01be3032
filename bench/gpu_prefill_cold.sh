#!/usr/bin/env bash
# One device call (~2 min), issue 6: cold vs warm runs of the reference's eager prefill at unseen lengths
# (bench/prefill_cold.py), the suspected source of the fast tier's prefill noise early in each call.
#   ATHANOR_COMMIT=<hash> bash bench/gpu_prefill_cold.sh   (carry [".whl"])
source "$(dirname "$0")/_gpu_env.sh"
python3 bench/prefill_cold.py --model llama-3.1-8b --layers 6 --lengths 8 2>&1 | tee "$OUT/prefill_cold.log"
