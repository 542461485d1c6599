#!/usr/bin/env bash
# Set up (a .venv beside this repo, if absent) and train the default config: FrozenLake 4x4,
# random solvable maps, a tiny decoder trained from scratch: behaviour cloning on oracle
# demonstrations (scripts/sft.py, about 2 minutes), then GRPO, 15 minutes of wall time in all
# (configs/frozen_lake.py:sft). Prints the final evaluation table and where the curves and
# checkpoints are. Pure GRPO from random weights: python scripts/train.py
# --config=configs/frozen_lake.py --workdir=runs/fl
#
#   ./scripts/quickstart.sh                       # workdir runs/quickstart (SFT in its sft/)
#   WORKDIR=runs/mine ./scripts/quickstart.sh --config.optim.lr=3e-4
#
# The packages are installed at the versions in constraints.txt, once: a rerun installs nothing
# unless setup.py, constraints.txt or the switch changed (RL4AGENTS_UNLOCKED=1: the newest
# versions; scripts/_venv.sh). Each workdir gets a provenance.json (commit, versions, config).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
WORKDIR="${WORKDIR:-runs/quickstart}"
CONFIG=configs/frozen_lake.py:sft
if [ ! -f "$WORKDIR/sft/summary.json" ]; then  # a finished warm start is reused on a rerun
  .venv/bin/python scripts/sft.py --config="$CONFIG" --workdir="$WORKDIR/sft"
fi
exec .venv/bin/python scripts/train.py --config="$CONFIG" --workdir="$WORKDIR" \
  --config.init.params="$WORKDIR/sft" "$@"
