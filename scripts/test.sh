#!/usr/bin/env bash
# Install everything (scripts/setup.sh), then run every test, the slow ones included, in one
# pytest run spread over the CPUs (pytest-xdist; `-n 0` among the arguments runs serially).
# Extra arguments go to pytest. Exit status: pytest's (5 = no test ran is a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
export WANDB_MODE=offline WANDB_SILENT=true
# The workers share one cache of validated data (keyed by the file's bytes and the code that
# validates it), so the bundled 100,000-row split is validated once, not once per worker.
cache=$(mktemp -d "${TMPDIR:-/tmp}/rookworld-test-data.XXXXXX") || exit 1
trap 'rm -rf "$cache"' EXIT
export ROOKWORLD_DATA_CACHE=$cache
# One torch thread a process: the workers (one per CPU) and the runs they start would
# otherwise each spread a thread pool over every CPU and oversubscribe them (on 2 cores the
# whole run takes about half as long again; benchmarks/README.md).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
.venv/bin/python -m pytest -m "slow or not slow" -n auto "$@"
status=$?
echo "rookworld tests: pytest exit=$status"
exit $status
