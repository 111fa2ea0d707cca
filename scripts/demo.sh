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
# The finished run as DVC's baseline: dvc.lock and the DVC files committed, so `dvc exp run -S KEY=VALUE` and then
# `dvc exp show --only-changed` / `dvc metrics diff` compare an experiment with the demo's metrics at HEAD
bash scripts/dvc_baseline.sh
