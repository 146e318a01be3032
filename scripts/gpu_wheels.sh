#!/usr/bin/env bash
# Gather the wheels that the lent GPU machine's image lacks (it has torch, triton, numpy, scipy,
# tokenizers, jinja2, safetensors, rich, matplotlib, pyyaml, tqdm, requests ... but not these), for
# CPython 3.12 on manylinux x86_64, into .whl/. The device call carries .whl, and `make gpu-test` or
# `bench/gpu.sh` installs them there with --no-index.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
# One version of each: two versions of one package stop the whole install there.
# The server (FastAPI, uvicorn, openai) and the compile loop (Optuna, SQLAlchemy) with their closure,
# at the versions the CPU machines run.
MISSING=(
  "gguf==0.19.0"
  "pyzmq==27.1.0"
  "fastapi==0.165.0" "starlette==1.10.0" "annotated-doc==0.0.7" "pydantic==2.14.4" "pydantic-core==2.50.5"
  "annotated-types==0.8.0" "typing-inspection==0.4.5" "typing-extensions==4.16.0" "anyio==4.16.0"
  "sniffio==1.3.1" "uvicorn==0.54.0" "h11==0.16.0" "click==8.5.1" "prometheus-client==0.26.0"
  "openai==3.57.0" "jiter==0.19.0" "httpx==0.28.1" "httpcore==1.0.9" "httpx2==2.16.2" "httpcore2==2.16.2"
  "truststore==0.10.5" "opentelemetry-api==1.45.2"
  "optuna==5.0.0" "sqlalchemy==2.1.9" "alembic==1.20.1" "mako==1.4.3" "colorlog==6.12.0"
)
for req in "${MISSING[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    --platform any -d .whl "$req"
done
ls -1 .whl
