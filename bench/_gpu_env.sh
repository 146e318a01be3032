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
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/athanor-site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/athanor-site
