#!/usr/bin/env bash
# Install everything (scripts/setup.sh), then run the fast tests and the slow ones.
# Extra arguments go to both pytest runs. Exit status: pytest's (5 = no tests ran is a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
export WANDB_MODE=offline WANDB_SILENT=true
.venv/bin/python -m pytest "$@"
fast=$?
.venv/bin/python -m pytest -m slow "$@"
slow=$?
# pytest exits 5 when it collected no test: for the slow run that is fine, for the fast run not.
[ $slow -eq 5 ] && slow=0
echo "rookworld tests: fast exit=$fast, slow exit=$slow"
[ $fast -eq 0 ] && [ $slow -eq 0 ]
