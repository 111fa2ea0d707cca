#!/usr/bin/env bash
# The GPU check, one command of <= 9.5 minutes on a CUDA machine that has torch and transformers but not bertpipe's
# other dependencies; it prints one table (bench/gpu_check.py says what each row measures) and writes its JSON to
# docs/gpu-check-<gpu>.json, or to --json:
#     bench/gpu_check.sh [--smoke] [--stages off] [--compile off] [--json out.json]
# Its last section runs whole stages (`python -m bertpipe splits|prepare|start|vocab|pretrain|finetune`) on a tiny
# project with tracking off, so MLflow and Prefect are not needed (bench/gpu_stages.py). What it needs beyond torch
# and transformers (with their own dependencies: numpy, pyyaml, filelock, tqdm, ...): pydantic, typer, jieba,
# accelerate (HF Trainer) and psutil, installed from wheels carried in bench/wheels (no index) when missing; and
# pyarrow, pandas, matplotlib and scikit-learn (prepare, finetune), which are too big to carry (~110 MB with scipy):
# without them the stage section is skipped with a line saying what is missing. Prepare bench/wheels on a machine
# with internet, for the GPU machine's Python (e.g. 3.12; a comma list when it is not known), then carry the
# repository with them (bench/wheels is git-ignored: name it in what a remote run carries):
#     bench/gpu_check.sh --fetch-wheels 3.11,3.12 [--transformers]
# --transformers: also transformers and its dependencies (about 38 MB more), for a machine that has torch alone.
# --smoke: tiny shapes on whatever device there is (the CPU in CI), to keep the script tested.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
WHEELS=bench/wheels

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    vers=${2:?usage: bench/gpu_check.sh --fetch-wheels PYTHON_VERSION[,VERSION...] [--transformers] (e.g. 3.11,3.12)}
    for ver in ${vers//,/ }; do  # several: the GPU machine's Python unknown, pip installs the wheels that fit it
        get=("$PY" -m pip download --dest "$WHEELS" --only-binary=:all: --python-version "$ver"
             --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
        "${get[@]}" pydantic typer  # with their dependencies (pydantic pins its pydantic_core)
        "${get[@]}" --no-deps accelerate psutil
        if [[ "${3:-}" == "--transformers" ]]; then
            "${get[@]}" --no-deps transformers tokenizers safetensors huggingface_hub regex pyyaml tqdm filelock \
                packaging numpy fsspec hf_xet requests urllib3 idna certifi charset_normalizer
        fi
    done
    # jieba is published as a source archive only: built here into a wheel (pure Python), less its paddle model
    # (jieba/lac_small, 11 MB compressed, read only by jieba.enable_paddle, which bertpipe never calls)
    "$PY" -m pip wheel --quiet --no-deps --wheel-dir "$WHEELS" jieba
    "$PY" - "$WHEELS" <<'SLIM'
import pathlib, sys, zipfile
for whl in pathlib.Path(sys.argv[1]).glob("jieba-*.whl"):
    slim = whl.with_name(whl.name + ".tmp")
    with zipfile.ZipFile(whl) as zin, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            if not item.filename.startswith("jieba/lac_small/"):
                data = zin.read(item)
                if item.filename.endswith(".dist-info/RECORD"):
                    data = b"".join(ln + b"\n" for ln in data.splitlines() if not ln.startswith(b"jieba/lac_small/"))
                zout.writestr(item, data)
    slim.replace(whl)
SLIM
    echo "wheels in $WHEELS ($(du -sh "$WHEELS" | cut -f1)); carry the repository (with $WHEELS) to the GPU machine" \
        "and run bench/gpu_check.sh"
    exit 0
fi

"$PY" -c "import torch" 2>/dev/null || { echo "error: torch is not importable with $PY" >&2; exit 2; }
# Each missing distribution: "required DIST" (the loops need it) or "optional DIST" (without it the HF recipe or the
# stage section is skipped, with a line that says so).
missing=$("$PY" - <<'PY'
import importlib.util
need = {"transformers": "required", "pydantic": "required", "tqdm": "required", "numpy": "required",
        "accelerate": "optional", "psutil": "optional", "typer": "optional", "jieba": "optional"}
for m, kind in need.items():
    if importlib.util.find_spec(m) is None:
        print(kind, m)
PY
)
while read -r kind dist; do
    [[ -n "$dist" ]] || continue
    if compgen -G "$WHEELS/$dist-*.whl" >/dev/null; then
        echo "installing $dist from $WHEELS (no index)"
        "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" "$dist"
    elif [[ "$kind" == required ]]; then
        echo "error: $dist is missing and not in $WHEELS (run bench/gpu_check.sh --fetch-wheels PYVER first)" >&2
        exit 2
    fi
done <<< "$missing"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec timeout 570 "$PY" bench/gpu_check.py "$@"
