#!/usr/bin/env bash
# Set up and run the tests. Default: quick (no slow end-to-end tests). --full: everything (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
MARK=(-m "not slow")
if [ "${1:-}" = "--full" ]; then MARK=(); shift; fi
set +e
python -m pytest "${MARK[@]}" --durations=20 "$@"
rc=$?
set -e
# pytest's 5 means "no tests collected": that is a failure for us, not a pass.
exit $rc
