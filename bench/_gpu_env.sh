# Sourced by the bench/gpu_*.sh device scripts: $OUT, unbuffered output, and the wheels the GPU
# image lacks (`make gpu-wheels`, carried as .whl) installed beside the image's packages, with this
# tree's sources first on the path.
set -uo pipefail
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/athanor-site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/athanor-site
