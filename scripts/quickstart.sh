#!/usr/bin/env bash
# Set up (a .venv beside this repo, if absent) and train the default config: FrozenLake 4x4,
# random solvable maps, a tiny decoder trained from scratch with GRPO. Prints the final
# evaluation table and where the curves and checkpoints are.
#
#   ./scripts/quickstart.sh                       # workdir runs/quickstart
#   WORKDIR=runs/mine ./scripts/quickstart.sh --config.optim.lr=3e-4
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
exec .venv/bin/python scripts/train.py --config=configs/frozen_lake.py \
  --workdir="${WORKDIR:-runs/quickstart}" "$@"
