#!/bin/bash
# The GPU check on a machine that has PyTorch, transformers and sentence-transformers but none of embedrank's
# other packages (such as the lent H100/H200 image): installs the service's wheels carried in build/gpu/wheels
# (`make gpu-bundle` puts them there, with MiniLM's weights in fp16) into a private folder, runs
# eval/benchmarks/gpu.py through the recorder (python -m eval record gpu), and copies the record
# (eval/results/gpu.json) and the figures to the folder given (default: the current one). A part that fails is
# reported in the record (--keep-going), so one failure does not lose the figures of the others.
#
#   bash eval/gpu_check.sh "$OUT"                 # then: cp gpu.json eval/results/ && python -m eval render
#   GPU_CHECK_ARGS="--parts parity" bash eval/gpu_check.sh /tmp/out
set -euo pipefail
out="$(realpath "${1:-.}")"
cd "$(dirname "$0")/.."
site=/tmp/embedrank-gpu-site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" build/gpu/wheels/*.whl
if ! python3 -c "import datasets" 2>/dev/null; then  # sentence-transformers may need it to import
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" build/gpu/wheels-if-missing/*.whl
fi
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python3 -c "import sentence_transformers, transformers, torch; print('torch', torch.__version__, 'transformers', transformers.__version__, 'sentence-transformers', sentence_transformers.__version__)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv || true
# shellcheck disable=SC2086  # GPU_CHECK_ARGS holds several arguments
python3 -m eval record gpu --device cuda --keep-going --json "$out/gpu-figures.json" ${GPU_CHECK_ARGS:-}
cp eval/results/gpu.json "$out/"
