#!/usr/bin/env bash
# Install everything (scripts/setup.sh), then run the fast tests and the slow ones.
# Extra arguments go to both pytest runs. Exit status: pytest's (5 = no tests ran is a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
export WANDB_MODE=offline WANDB_SILENT=true
# Both runs share one cache of validated data (keyed by the file's bytes and the code that
# validates it), so the bundled 100,000-row split is validated once, not once per run and
# worker. pytest-xdist runs one worker per CPU (`-n 0` among the arguments runs serially).
cache=$(mktemp -d "${TMPDIR:-/tmp}/rookworld-test-data.XXXXXX") || exit 1
trap 'rm -rf "$cache"' EXIT
export ROOKWORLD_DATA_CACHE=$cache
.venv/bin/python -m pytest -n auto "$@"
fast=$?
.venv/bin/python -m pytest -m slow -n auto "$@"
slow=$?
# pytest exits 5 when it collected no test: for the slow run that is fine, for the fast run not.
[ $slow -eq 5 ] && slow=0
echo "rookworld tests: fast exit=$fast, slow exit=$slow"
[ $fast -eq 0 ] && [ $slow -eq 0 ]
