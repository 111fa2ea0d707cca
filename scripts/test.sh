#!/usr/bin/env bash
# Set up and run the tests. Default: the quick tier (no slow end-to-end tests). --full: everything (what CI runs).
# Tiers and what each proves: docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# The project's own bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (this project's machines set
# it), each of the suite's ~300 processes would compile the modules it imports again (~0.15 CPU-s a process that
# imports the CLI, the stages and the flow, measured). Python checks each file's timestamp: an edit is read anew.
python -m compileall -q -j 0 bertpipe flows tasks tests bench >/dev/null
MARK=(-m "not slow")
if [ "${1:-}" = "--full" ]; then MARK=(); shift; fi
# pytest-xdist, whole files per worker (module fixtures built once, tests in file order), one worker more than
# cores, at most 3 (measured on 2 cores only, where a fourth was slower: 1093 s; each worker may run a whole chain,
# so more are not assumed to fit a bigger machine's memory): the slow tier spends much of its time waiting on subprocesses, servers and polls, and a third worker fills
# those gaps (a clean clone on 2 idle cores, same tree: 2 workers 1012 s of pytest, 3 workers 949 s; docs/testing.md).
# BERTPIPE_TEST_WORKERS=0 runs in one process.
WORKERS=${BERTPIPE_TEST_WORKERS:-$(python -c "import os; print(min(3, (os.cpu_count() or 1) + 1))")}
XDIST=()
if [ "$WORKERS" != "0" ] && [ "$WORKERS" != "1" ]; then XDIST=(-n "$WORKERS" --dist loadfile); fi
set +e
python -m pytest "${MARK[@]}" "${XDIST[@]}" --durations=30 "$@"
rc=$?
set -e
# pytest's 5 means "no tests collected": that is a failure for us, not a pass.
exit $rc
