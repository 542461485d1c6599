"""OPO vs GRPO on FrozenLake 4x4 (docs/extending.md): 2 credit variants x 3 seeds, 100 steps.

  python scripts/sweep.py experiments/opo_vs_grpo.py --workers=2
  python scripts/make_table.py --sweep=runs/sweeps/opo_vs_grpo \
      --out=experiments/results/opo_vs_grpo

Everything else is configs/frozen_lake.py. The budget is a step count, not wall time
(`train.max_minutes=0`), so both variants see the same number of updates however busy the
machine is. Seeds vary slowest, so an interrupted sweep has whole seeds of both variants done.
"""

from rl4agents import sweep

BASE = "configs/frozen_lake.py"


def get_sweep():
    return sweep.product(
        sweep.fixed({"train.num_steps": 100, "train.max_minutes": 0.0}),
        sweep.seeds(3),
        sweep.sweep_values("credit.name", ["grpo", "opo"]),
    )
