#!/usr/bin/env bash
# Set up (a .venv beside this repo, if absent), lint, and run the default test suite.
#
#   ./scripts/test.sh                 # fast suite (slow tests excluded)
#   ./scripts/test.sh -m slow         # the slow tests only
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
