#!/usr/bin/env bash
# Fresh clone -> the whole domain_adaptation flow on the bundled sample (demo profile, embedded defaults).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export MLFLOW_DISABLE_TELEMETRY=true DVC_NO_ANALYTICS=1 PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1
[ -d .dvc ] || dvc init -q
bertpipe data samples
bertpipe run "$@"
