#!/usr/bin/env bash
# The GPU check, one command of <= 9.5 minutes on a CUDA machine that has torch but not bertpipe's other
# dependencies:
#     bench/gpu_check.sh [--smoke] [--json out.json]
# It needs transformers and pydantic (Trainer also wants accelerate); when they are missing it installs them from
# wheels carried in bench/wheels (no index). Prepare that folder on a machine with internet, for the GPU machine's
# Python (e.g. 3.11):
#     bench/gpu_check.sh --fetch-wheels 3.11
# --smoke: tiny shapes on whatever device there is (the CPU in CI), to keep the script tested.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
WHEELS=bench/wheels

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    ver=${2:?usage: bench/gpu_check.sh --fetch-wheels PYTHON_VERSION (e.g. 3.11)}
    "$PY" -m pip download --dest "$WHEELS" --only-binary=:all: --python-version "$ver" \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        --no-deps transformers tokenizers safetensors huggingface_hub pydantic pydantic_core annotated_types \
        typing_inspection typing_extensions accelerate regex pyyaml tqdm filelock packaging psutil numpy fsspec \
        hf_xet requests urllib3 idna certifi charset_normalizer
    echo "wheels in $WHEELS; carry the repository (with $WHEELS) to the GPU machine and run bench/gpu_check.sh"
    exit 0
fi

"$PY" -c "import torch" 2>/dev/null || { echo "error: torch is not importable with $PY" >&2; exit 2; }
missing=$("$PY" - <<'PY'
import importlib.util
print(" ".join(m for m in ("transformers", "pydantic", "accelerate", "tqdm", "numpy") if importlib.util.find_spec(m) is None))
PY
)
if [[ -n "$missing" ]]; then
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        echo "installing $missing from $WHEELS (no index)"
        "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" $missing
    elif [[ "$missing" != "accelerate" ]]; then
        echo "error: missing $missing and no wheels in $WHEELS (run bench/gpu_check.sh --fetch-wheels PYVER first)" >&2
        exit 2
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec timeout 570 "$PY" bench/gpu_check.py "$@"
