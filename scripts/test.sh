#!/usr/bin/env bash
# Set up (a .venv beside this repo, if absent), lint, and run the tests on 2 workers.
# Its exit status is pytest's (or the first failing setup or lint step's).
#
#   ./scripts/test.sh                         # default suite, slow tests excluded (~8 min)
#   ./scripts/test.sh -m slow                 # the slow tests only (~10 min)
#   ./scripts/test.sh -m "slow or not slow"   # everything, as CI runs it (~18 min)
#   ./scripts/test.sh tests/credit    # any pytest arguments
#   ./scripts/test.sh --dist load tests/credit/test_registry.py  # one file over both workers
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${EXTRAS-hf,host}"  # checkpoint parity (torch, transformers) and TextArena tests
source scripts/_venv.sh
.venv/bin/ruff format --check --quiet .
.venv/bin/ruff check --quiet .
# Whole files per worker, heaviest first (tests/conftest.py): module fixtures run once.
exec .venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
