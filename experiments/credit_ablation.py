"""Credit-assignment ablation: 8 variants x {FrozenLake 8x8 slippery, Sokoban 6x6}
x 3 seeds, every variant with the same task hyperparameters (configs/ablation.py).

  python scripts/sweep.py experiments/credit_ablation.py --workers=2
  python scripts/make_table.py --sweep=runs/sweeps/credit_ablation \
      --out=experiments/results/credit \
      --metric=eval_test.greedy_success,eval_test.greedy_reward,wall_s:min \
      --curve_key=train/reward

Seeds vary slowest, so an interrupted sweep has whole seeds of every variant done first.
"""

from configs import ablation
from rl4agents import sweep


def get_sweep():
    specs = [
        f"configs/ablation.py:{task},{variant}"
        for task in ablation.TASKS
        for variant in ablation.VARIANTS
    ]
    return sweep.product(sweep.seeds(3), sweep.configs(specs))
