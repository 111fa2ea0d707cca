#!/usr/bin/env bash
# Create .venv and install bertpipe with every extra (serve, dask: pyproject.toml) and the test extras, at the versions
# requirements.lock pins (with their hashes; refreshed by `bash scripts/lock.sh`), so every install of one commit runs
# the same libraries. Idempotent: a second run only checks (well under a second), unless pyproject.toml,
# requirements.lock or this script changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
STAMP=.venv/.bertpipe-pyproject  # pyproject.toml's, requirements.lock's and this script's digest at the last install
want=$(python -c "import hashlib; print(hashlib.sha256(b''.join(open(f, 'rb').read() for f in
    ('pyproject.toml', 'requirements.lock', 'scripts/setup.sh'))).hexdigest())")
# Found, not imported: importing them all takes seconds, and scripts/test.sh runs this before every test run.
if python -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))" \
    bertpipe torch transformers prefect mlflow dvc onnxruntime litserve sklearn prefect_dask psycopg2 xdist filelock \
    _ruamel_yaml 2>/dev/null && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
python -m pip install -q --upgrade pip
# The CPU wheel first: any later requirement that admits it then installs nothing bigger. Unpacked without bytecode,
# which is compiled on every core while uv installs the rest (pip compiles torch's ~2,300 files one at a time: ~17 of
# the ~23 s its install took, measured on 2 cores).
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q --no-compile "torch==2.13.0" || python -m pip install -q --no-compile "torch>=2.3,<3"
fi
# Bytecode for torch and every package its install brought (sympy, networkx, jinja2, typing_extensions, ...): where
# PYTHONDONTWRITEBYTECODE is set, a package without it is compiled again by every process that imports it (each
# process that loads a transformers model compiles sympy: 1.7 of its ~5 CPU-s of imports, measured). Already
# compiled files are only checked. uv compiles what it installs itself (--compile-bytecode).
purelib=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
python -m compileall -q -j 0 $(find "$purelib" -mindepth 1 -maxdepth 1 \( -type d ! -name '*.dist-info' \
  ! -name __pycache__ \) -o -name '*.py') >/dev/null &
compiling=$!
# The rest with uv where it can be had: it downloads and unpacks in parallel (measured on 2 cores, a new venv, no
# cache: 54 s against pip's 125 s). uv reads neither pip's config nor its torch cap, so the torch just installed is
# pinned: a resolution that would replace it fails instead of downloading another build, and pip does the
# install instead. A mirror set for pip (PIP_INDEX_URL or pip's global.index-url) is passed on.
pin=$(mktemp)
python -c "from importlib.metadata import version; print('torch==' + version('torch'))" > "$pin"
index=${UV_INDEX_URL:-${PIP_INDEX_URL:-$(python -m pip config get global.index-url 2>/dev/null || true)}}
# The locked versions (hashes checked), then bertpipe itself without resolving anything more.
if python -m pip install -q uv >/dev/null 2>&1 && \
    UV_INDEX_URL="${index:-https://pypi.org/simple}" .venv/bin/uv pip install --quiet --python .venv/bin/python \
      --compile-bytecode --constraint "$pin" -r requirements.lock && \
    .venv/bin/uv pip install --quiet --python .venv/bin/python --no-deps -e .; then
  :
else
  python -m pip install -q -r requirements.lock
  python -m pip install -q --no-deps -e .
fi
rm -f "$pin"
# compileall's status is not checked: one of torch's files is for Python 3.12 only and never compiles here, as it
# does not under pip's own compile (which skips it too).
wait "$compiling" || true
echo "$want" > "$STAMP"
