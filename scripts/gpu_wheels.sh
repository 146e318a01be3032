#!/usr/bin/env bash
# Gather the wheels that the lent GPU machine's image lacks (it has torch, triton, numpy, scipy,
# tokenizers, jinja2, safetensors, rich, matplotlib, pyyaml, tqdm, requests ... but not these), for
# CPython 3.12 on manylinux x86_64, into .whl/. The device call carries .whl and `make gpu-test`
# installs them there with --no-index.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
# One version of each: two versions of one package stop the whole install there.
MISSING=(
  "gguf==0.19.0"
  "pyzmq==27.1.0"
)
for req in "${MISSING[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    --platform any -d .whl "$req"
done
ls -1 .whl
