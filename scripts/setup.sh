#!/usr/bin/env bash
# Create .venv and install bertpipe with every extra (serve, dask: pyproject.toml) and the test extras.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
if ! python -c "import bertpipe, torch, transformers, prefect, mlflow, dvc, onnxruntime, litserve, sklearn, prefect_dask, psycopg2, xdist, filelock, _ruamel_yaml" 2>/dev/null; then
  python -m pip install -q --upgrade pip
  # The CPU wheel first: any later requirement that admits it then installs nothing bigger.
  python -m pip install -q "torch==2.13.0" || python -m pip install -q "torch>=2.3,<3"
  python -m pip install -q -e ".[test,serve,dask]"
else  # already set up: refresh bertpipe's own metadata (entry points, extras) in case pyproject.toml changed
  python -m pip install -q -e ".[test,serve,dask]" --no-deps >/dev/null 2>&1 || true
fi
